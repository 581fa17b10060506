"""The guard of one job: `python guard.py --owner-fd N --deadline T [--hold-fd M] -- argv...`.

Started by the runner as the leader of the job's own session, it runs `argv` (mpiexec, or a
command workload) as its child and stays until that child exits, passing on its exit status.
It kills the whole job (every descendant: it is their subreaper, so none escapes by reparenting)
when the runner that started it disappears (the read end `--owner-fd` of a pipe whose write end
only the runner holds reaches end-of-file, whichever way the runner died), at the absolute
`--deadline` (epoch seconds), or on SIGTERM/SIGINT/SIGHUP. `--hold-fd` (the device lock) is kept
open until every process of the job is dead, so the device never looks free while they run.

Run by path with `python -S`, not as a module: it imports only the standard library, so it
starts in a few hundredths of a second."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
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


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process, from /proc (no psutil: a fast start)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        found[int(entry)] = (int(fields[1]), fields[0].decode())
    return found


def descendants(pid: int) -> list[int]:
    """Live (not zombie) descendants of `pid`."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in procs.items():
        children.setdefault(parent, []).append(child)
    out, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo += children.get(child, [])
    return [c for c in out if procs.get(c, (0, "Z"))[1] != "Z"]


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def kill_descendants(timeout: float = 10.0) -> None:
    """SIGKILL every descendant until none is left (reaping those reparented to us)."""
    end = time.monotonic() + timeout
    while True:
        _reap()
        left = descendants(os.getpid())
        if not left or time.monotonic() > end:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def parse(argv: Sequence[str]) -> tuple[int, float, list[int], list[str]]:
    """--owner-fd N --deadline T [--hold-fd=M ...] -- command... (no argparse: a fast start)."""
    owner, deadline, hold = -1, 0.0, []
    args = list(argv)
    while args and args[0] != "--":
        flag = args.pop(0)
        if flag.startswith("--hold-fd="):
            hold.append(int(flag.split("=", 1)[1]))
        elif flag == "--owner-fd" and args:
            owner = int(args.pop(0))
        elif flag == "--deadline" and args:
            deadline = float(args.pop(0))
        else:
            raise SystemExit(f"guard.py: unexpected argument {flag!r}")
    command = args[1:]
    if owner < 0 or not deadline or not command:
        raise SystemExit("usage: guard.py --owner-fd N --deadline T [--hold-fd=M] -- command...")
    return owner, deadline, hold, command


def main(argv: Sequence[str] | None = None) -> int:
    owner_fd, deadline, hold_fds, command = parse(sys.argv[1:] if argv is None else argv)
    for fd in (owner_fd, *hold_fds):  # the guard's alone: the job does not inherit them
        os.set_inheritable(fd, False)
    _subreaper()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signalled: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        signalled.append(signum)
        with contextlib.suppress(OSError):
            os.write(wake_w, b"x")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)  # exec resets them to the default in the child
    try:
        child = os.posix_spawnp(command[0], command, os.environ)  # fds 0-2 shared
    except OSError as error:
        sys.stderr.write(f"cannot start: {error}\n")
        return 127
    pidfd = os.pidfd_open(child)
    poller = select.poll()
    for fd in (pidfd, owner_fd, wake_r):
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    code: int
    while True:
        remaining = deadline - time.time()
        if remaining <= 0:
            sys.stderr.write("guard: the job passed its deadline; killed\n")
            code = EXIT_DEADLINE
            break
        ready = {fd for fd, _ in poller.poll(min(remaining, 3600.0) * 1000)}
        if pidfd in ready:
            _, status = os.waitpid(child, 0)
            returned = os.waitstatus_to_exitcode(status)
            code = returned if returned >= 0 else 128 - returned
            break
        if owner_fd in ready:
            code = EXIT_OWNER_GONE
            break
        if wake_r in ready or signalled:
            code = EXIT_SIGNALLED
            break
    kill_descendants()
    for fd in hold_fds:  # the device lock goes only now, with every job process dead
        with contextlib.suppress(OSError):
            os.close(fd)
    return code


if __name__ == "__main__":
    sys.exit(main())
