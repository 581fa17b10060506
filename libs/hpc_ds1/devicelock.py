"""One job at a time per device: every real run on this machine holds `$HPC_DS1_HOME/device.lock`,
so a tuning step, a task and a setup run never measure at the same time on the same cores."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def device_lock(home: Path, timeout: float | None = None) -> Iterator[float]:
    """Hold the device for the block; yields how long it waited. Waiting work queues here."""
    home.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with (home / "device.lock").open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if timeout is not None and time.monotonic() - started > timeout:
                    raise TimeoutError(f"the device stayed busy for {timeout:.0f} s") from None
                time.sleep(0.05)
        try:
            yield time.monotonic() - started
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
