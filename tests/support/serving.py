"""Starting `hpc-ds1 serve` as a user runs it and waiting for it: one place for every test."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from tests.support.commands import HPC_DS1


def start_serve(
    home: Path, port: int, command: Sequence[str] = (HPC_DS1,), **extra: str
) -> subprocess.Popen[str]:
    """`hpc-ds1 serve` on `home` and `port` (`command`: another release's CLI, say), its
    output piped; `extra`: more HPC_DS1_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(home), HPC_DS1_PORT=str(port), HPC_DS1_LOG_JSON="true", **extra)
    return subprocess.Popen(
        [*command, "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_ready(url: str, process: subprocess.Popen[str], timeout: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"serve exited early:\n{process.stdout.read()}")  # type: ignore[union-attr]
        try:
            reply = httpx.get(f"{url}/readyz", timeout=2.0)
            if reply.status_code == 200:
                return reply.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("serve did not become ready")


def stop(process: subprocess.Popen[str], sig: int = signal.SIGTERM) -> str:
    process.send_signal(sig)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    return output


def cli_headers(home: Path) -> dict[str, str]:
    """The home's own CLI credential (the gateway creates it on the home's first start)."""
    path = home / "credentials" / "cli.token"
    for _ in range(300):
        if path.exists():
            return {"Authorization": f"Bearer {path.read_text().strip()}"}
        time.sleep(0.1)
    raise AssertionError(f"{path} was never created")
