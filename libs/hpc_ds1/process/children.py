"""`hpc-ds1 serve --processes`: the services as child processes, each running `hpc-ds1 service
NAME` (the command every container of docker-compose.yml runs), attached to the home `serve` owns.

The parent imports the services' code once and forks: seven interpreters each importing the
stack cost ~3x the start-up on 2 cores, and a forked child shares those pages (measured under
load, ready after: spawned 75 s, forked 30 s, one process 25 s). The fork happens before any
thread or event loop exists; when one does (an embedding program), the children are spawned as
`hpc-ds1 service NAME` instead. Each child is named hpcds1-NAME (ps, top).

Ctrl+C reaches every process of the terminal's group; a SIGTERM to `serve` alone is passed on.
Children stop within STOP_S or are killed; a child dies with its parent (PR_SET_PDEATHSIG), so a
`kill -9` of `serve` leaves no service behind. A child that exits by itself stops the others,
as a failing service does in one process."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable

from ..log import get_logger
from ..settings import Settings

log = get_logger("serve")

STOP_S = 30.0  # an agent's running job is killed and its result sent within this
POLL_S = 0.2
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15
# What the services import as they start (the model stack, numba for the fingerprint).
SHARED_MODULES = (
    "hpc_ds1.process.runtime",
    "hpc_ds1.machine.hardware",
    "hpc_ds1.model",
    "hpc_ds1.workloads",
)


class Child:
    """One service's process: forked here, or spawned (`popen`)."""

    def __init__(self, name: str, pid: int, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.name = name
        self.pid = pid
        self.popen = popen
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.popen is not None:
            self.returncode = self.popen.poll()
        elif self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
            else:
                if done:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


def child_environment(settings: Settings) -> dict[str, str]:
    """The settings `serve` took from its options, so a child sees the same home and port."""
    return {
        "HPC_DS1_HOME": str(settings.home),
        "HPC_DS1_HOST": settings.host,
        "HPC_DS1_PORT": str(settings.port),
    }


def _die_with_parent(parent: int) -> Callable[[], None]:
    libc = ctypes.CDLL(None, use_errno=True)  # resolved before the fork

    def arrange() -> None:
        # SIGKILL: with serve gone so are its embedded servers; nothing is left to stop for.
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)

    return arrange


def preload(names: tuple[str, ...]) -> None:
    """Import what the services import, once, before forking them."""
    for module in SHARED_MODULES + tuple(f"hpc_ds1.services.{n}" for n in names):
        importlib.import_module(module)


# The command line's entry, `main(argv) -> exit status`: a forked child runs `service NAME`
# through it. Passed in by the caller (the CLI's serve), so this module stays below the CLI.
Entry = Callable[[list[str]], int]


def start_children(names: tuple[str, ...], settings: Settings, entry: Entry) -> list[Child]:
    """Each service in a process of its own. Call before any thread or event loop exists."""
    env = child_environment(settings)
    if threading.active_count() > 1:
        log.info("spawning_services", why="threads run in this process: no fork")
        return [_spawn(name, env) for name in names]
    preload(names)
    return [_fork(name, env, entry) for name in names]


def _spawn(name: str, env: dict[str, str]) -> Child:
    main = "import sys; from hpc_ds1.cli import main; sys.exit(main())"
    popen = subprocess.Popen(
        [sys.executable, "-c", main, "service", name],
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent(os.getpid()),
    )
    return Child(name, popen.pid, popen)


def _fork(name: str, env: dict[str, str], entry: Entry) -> Child:
    arrange = _die_with_parent(os.getpid())
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return Child(name, pid)
    code = 1
    try:  # the child: `hpc-ds1 service NAME`, then out without the parent's exit handlers
        arrange()
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).prctl(PR_SET_NAME, f"hpcds1-{name}"[:15].encode(), 0, 0, 0)
        os.environ.update(env)
        code = entry(["service", name])
    except SystemExit as leaving:
        code = leaving.code if isinstance(leaving.code, int) else 1
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


async def watch_children(children: list[Child], stop: asyncio.Event) -> None:
    """Until `stop` or a child's exit; then stops them all. Raises RuntimeError naming the
    service that exited by itself."""
    failed: Child | None = None
    try:
        while not stop.is_set():
            failed = next((c for c in children if c.poll() is not None), None)
            if failed is not None:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)
    finally:
        await stop_children(children)
    if failed is not None:
        raise RuntimeError(
            f"the {failed.name} service (pid {failed.pid}) exited with status "
            f"{failed.returncode}; the other services were stopped (see its log above)"
        )


async def stop_children(children: list[Child], within_s: float = STOP_S) -> None:
    """SIGTERM to each child still running (one already stopping on Ctrl+C takes it as the
    same request), then SIGKILL to any left after `within_s`."""
    for child in children:
        child.signal(signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while any(c.poll() is None for c in children) and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)
    for child in children:
        if child.poll() is None:
            log.warning("service_killed", service=child.name, pid=child.pid)
            child.signal(signal.SIGKILL)
            while child.poll() is None:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
