"""`hpc-ds1 serve`'s services as child processes, each `hpc-ds1 service NAME` (the command every
container of docker-compose.yml runs), attached to the home `serve` owns.

Ctrl+C reaches every process of the terminal's group; a SIGTERM to `serve` alone is passed on.
Children stop within STOP_S or are killed; a child dies with its parent (PR_SET_PDEATHSIG), so a
`kill -9` of `serve` leaves no service behind. A child that exits by itself stops the others,
as a failing service does in one process."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .log import get_logger
from .settings import Settings

log = get_logger("serve")

STOP_S = 30.0  # an agent's running job is killed and its result sent within this
POLL_S = 0.2
PR_SET_PDEATHSIG = 1


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]


def service_command(name: str) -> list[str]:
    """`hpc-ds1 service NAME` with this interpreter (the console script may not be on PATH)."""
    main = "import sys; from hpc_ds1.cli import main; sys.exit(main())"
    return [sys.executable, "-c", main, "service", name]


def child_environment(settings: Settings) -> dict[str, str]:
    """This environment with the settings `serve` took from its options, so a child sees the
    same home, host and port."""
    env = dict(os.environ)
    env.update(
        HPC_DS1_HOME=str(settings.home),
        HPC_DS1_HOST=settings.host,
        HPC_DS1_PORT=str(settings.port),
    )
    return env


def _die_with_parent(parent: int) -> Callable[[], None]:
    def arrange() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)

    return arrange


def start(name: str, env: dict[str, str]) -> Child:
    process = subprocess.Popen(
        service_command(name),
        env=env,
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent(os.getpid()),
    )
    return Child(name, process)


async def run_children(names: tuple[str, ...], settings: Settings, stop: asyncio.Event) -> None:
    """Each service in its own process until `stop`; raises RuntimeError naming the service
    when one exits by itself (the others are stopped first)."""
    env = child_environment(settings)
    children = [start(name, env) for name in names]
    failed: Child | None = None
    try:
        while not stop.is_set():
            failed = next((c for c in children if c.process.poll() is not None), None)
            if failed is not None:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)
    finally:
        await stop_children(children)
    if failed is not None:
        raise RuntimeError(
            f"the {failed.name} service (pid {failed.process.pid}) exited with status "
            f"{failed.process.returncode}; the other services were stopped (see its log above)"
        )


async def stop_children(children: list[Child], within_s: float = STOP_S) -> None:
    """SIGTERM to each child still running (one already stopping on Ctrl+C takes it as the
    same request), then SIGKILL to any left after `within_s`."""
    for child in children:
        if child.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while any(c.process.poll() is None for c in children) and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)
    for child in children:
        if child.process.poll() is None:
            log.warning("service_killed", service=child.name, pid=child.process.pid)
            child.process.kill()
            child.process.wait()
