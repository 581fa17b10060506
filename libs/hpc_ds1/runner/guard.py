"""The guard of one job: `python guard.py --owner-fd N --deadline T [--hold-fd M] -- argv...`.

Started by the runner as the leader of the job's own session, it runs `argv` (mpiexec, or a
command workload) as its child and stays until that child exits, passing on its exit status.
It kills the whole job (every descendant: it is their subreaper, so none escapes by reparenting)
when the runner that started it disappears (the read end `--owner-fd` of a pipe whose write end
only the runner holds reaches end-of-file, whichever way the runner died), at the absolute
`--deadline` (epoch seconds), or on SIGTERM/SIGINT/SIGHUP. `--hold-fd` (the device lock) is kept
open until every process of the job is dead, so the device never looks free while they run.

Run by path, not as a module: it imports nothing of hpc_ds1 (and so neither numba nor MPI)."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

PR_SET_CHILD_SUBREAPER = 36
EXIT_OWNER_GONE = 137
EXIT_DEADLINE = 124
EXIT_SIGNALLED = 143


def _subreaper() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def kill_descendants() -> None:
    """SIGKILL every descendant, wait until they are gone (reaping those reparented to us)."""
    import psutil

    me = psutil.Process()
    for _ in range(50):
        procs = me.children(recursive=True)
        if not procs:
            return
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=2)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="guard.py")
    parser.add_argument("--owner-fd", type=int, required=True)
    parser.add_argument("--deadline", type=float, required=True)
    parser.add_argument("--hold-fd", type=int, action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")

    _subreaper()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signalled: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        signalled.append(signum)
        with contextlib.suppress(OSError):
            os.write(wake_w, b"x")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)  # fds 1, 2 shared
    except OSError as error:
        sys.stderr.write(f"cannot start: {error}\n")
        return 127
    pidfd = os.pidfd_open(child.pid)
    poller = select.poll()
    for fd in (pidfd, args.owner_fd, wake_r):
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    code: int
    while True:
        remaining = args.deadline - time.time()
        if remaining <= 0:
            sys.stderr.write("guard: the job passed its deadline; killed\n")
            code = EXIT_DEADLINE
            break
        ready = {fd for fd, _ in poller.poll(min(remaining, 3600.0) * 1000)}
        if pidfd in ready:
            returned = child.wait()
            code = returned if returned >= 0 else 128 - returned
            break
        if args.owner_fd in ready:
            code = EXIT_OWNER_GONE
            break
        if wake_r in ready or signalled:
            code = EXIT_SIGNALLED
            break
    kill_descendants()
    for fd in args.hold_fd:  # the device lock goes only now, with every job process dead
        with contextlib.suppress(OSError):
            os.close(fd)
    return code


if __name__ == "__main__":
    sys.exit(main())
