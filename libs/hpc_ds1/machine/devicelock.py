"""One job at a time per device: every real run on this machine holds `$HPC_DS1_HOME/device.lock`,
so a tuning step, a task and a setup run never measure at the same time on the same cores.

The device never looks free while a job's processes live on. The runner hands the lock's file
descriptor to the guard process that watches each job (`hpc_ds1.runner.guard`): when the holder
dies, the guard kills the job and only then, by exiting, lets the lock go. Each job's marker is also
written into the lock file while it runs; whoever takes the lock next and finds a marker left
behind (the holder and its guard both died) first kills every process carrying that marker."""

from __future__ import annotations

import contextlib
import fcntl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from hpc_ds1.machine.jobmarks import kill_marked

POLL_S = 0.05


class Cancelled(Exception):
    """The work was cancelled (its service is stopping) before it finished."""


@dataclass
class HeldLock:
    """The device lock as held by this thread: its descriptor and the running job's marker."""

    path: Path
    handle: IO[str]

    @property
    def fd(self) -> int:
        return self.handle.fileno()

    def record_job(self, marker: str) -> None:
        """Note the running job's marker in the lock file (cleared when it ends)."""
        self._write(marker)

    def clear_job(self) -> None:
        self._write("")

    def _write(self, text: str) -> None:
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(text)
        self.handle.flush()


_local = threading.local()


def held() -> HeldLock | None:
    """The device lock this thread holds, if any (the runner passes it to its job guard)."""
    found: HeldLock | None = getattr(_local, "lock", None)
    return found


def _kill_leftovers(path: Path) -> None:
    try:
        marker = path.read_text().strip()
    except OSError:
        return
    if marker:
        kill_marked(marker)


@contextlib.contextmanager
def device_lock(
    home: Path, timeout: float | None = None, cancel: threading.Event | None = None
) -> Iterator[float]:
    """Hold the device for the block; yields how long it waited. Waiting work queues here.
    TimeoutError after `timeout` s of waiting; Cancelled when `cancel` is set while waiting."""
    home.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    path = home / "device.lock"
    with open(path, "a+") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if cancel is not None and cancel.is_set():
                    raise Cancelled("cancelled while waiting for the device") from None
                if timeout is not None and time.monotonic() - started > timeout:
                    raise TimeoutError(f"the device stayed busy for {timeout:.0f} s") from None
                time.sleep(POLL_S)
        lock = HeldLock(path, handle)
        previous = held()
        try:
            _kill_leftovers(path)
            lock.clear_job()
            _local.lock = lock
            yield time.monotonic() - started
        finally:
            _local.lock = previous
            fcntl.flock(handle, fcntl.LOCK_UN)
