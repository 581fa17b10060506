"""Process management: start a command under its guard (`guard.py`) in its own session, read its
lines with deadlines, and kill the whole process group (and any descendant that left it) so
nothing is left behind, even when this process dies first: the guard then kills the job."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from hpc_ds1.machine.devicelock import held
from hpc_ds1.machine.jobmarks import MARKER_VAR, kill_marked, marked, wait_gone

EOF_MARK = None
GUARD = str(Path(__file__).with_name("guard.py"))
POLL_S = 0.1
GUARD_STOP_S = 5.0
DEFAULT_DEADLINE_S = 7 * 86400.0


@dataclass
class Process:
    """A child in its own session; lines from stdout arrive on a queue, stderr is kept (tail)."""

    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    deadline: float | None = None  # epoch seconds: the guard kills the job then, whatever happens
    cancel: threading.Event | None = None
    cwd: str | None = None  # where the job runs (a command workload's folder); None: here
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    popen: subprocess.Popen[str] = field(init=False)
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue, init=False)
    stdout_tail: deque[str] = field(default_factory=lambda: deque(maxlen=200), init=False)
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=200), init=False)

    def __post_init__(self) -> None:
        env = dict(os.environ if self.env is None else self.env)
        env[MARKER_VAR] = self.marker
        deadline = self.deadline if self.deadline is not None else time.time() + DEFAULT_DEADLINE_S
        lock = held()
        owner_r, self._owner_w = os.pipe()  # the guard sees EOF when this process is gone
        keep = [owner_r] + ([lock.fd] if lock is not None else [])
        argv = [sys.executable, "-S", "-E", GUARD, "--owner-fd", str(owner_r)]
        argv += ["--deadline", repr(deadline)]
        argv += [f"--hold-fd={fd}" for fd in keep[1:]]
        self._lock = lock
        if lock is not None:
            lock.record_job(self.marker)
        try:
            self.popen = subprocess.Popen(
                [*argv, "--", *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                start_new_session=True,
                pass_fds=keep,
                cwd=self.cwd,
            )
        except BaseException:
            os.close(self._owner_w)
            if lock is not None:
                lock.clear_job()
            raise
        finally:
            os.close(owner_r)
        self._pumps = [
            threading.Thread(target=self._pump_stdout, daemon=True),
            threading.Thread(target=self._pump_stderr, daemon=True),
        ]
        for pump in self._pumps:
            pump.start()

    def _pump_stdout(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.stdout_tail.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))
        self.lines.put(EOF_MARK)

    def _pump_stderr(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.stderr_tail.append(line.rstrip("\n"))

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def next_line(self, deadline: float) -> tuple[str, str | None]:
        """("line", text), ("eof", None) when stdout closed, ("timeout", None) at the monotonic
        `deadline`, or ("cancelled", None) as soon as `cancel` is set."""
        while True:
            if self.cancelled():
                return "cancelled", None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout", None
            try:
                item = self.lines.get(timeout=min(remaining, POLL_S))
            except queue.Empty:
                continue
            if item is EOF_MARK:
                self.lines.put(EOF_MARK)  # stay at EOF for later calls
                return "eof", None
            return "line", item

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None after `timeout` s or as soon as `cancel` is set."""
        end = time.monotonic() + timeout
        while True:
            slice_s = min(end - time.monotonic(), POLL_S if self.cancel is not None else timeout)
            try:
                code = self.popen.wait(timeout=max(slice_s, 0.0))
            except subprocess.TimeoutExpired:
                if self.cancelled() or time.monotonic() >= end:
                    return None
                continue
            # The guard has killed what was left of the job: its pipes close, read them out.
            for pump in self._pumps:
                pump.join(timeout=5)
            return code

    def stderr_text(self, lines: int = 20) -> str:
        return "\n".join(list(self.stderr_tail)[-lines:])

    def output_text(self) -> str:
        return "\n".join(self.stdout_tail)

    def kill(self) -> None:
        """SIGKILL the process group, then any descendant that escaped it; reap the child."""
        exited = self.popen.poll() is not None  # the guard ended: it cleaned up after the job
        if not exited:  # the guard kills (and reaps, as their subreaper) the job's processes
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=GUARD_STOP_S)
        kill_tree(self.popen.pid)  # whatever is left, the guard included
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        with contextlib.suppress(OSError):
            os.close(self._owner_w)
        if not exited:
            kill_marked(self.marker)  # anything that escaped the tree (it carries the marker)
        if self._lock is not None:
            self._lock.clear_job()

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def kill_tree(pid: int) -> None:
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # the child leads its own session: pgid == pid
    for proc in descendants:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    wait_gone(descendants)


__all__ = ["MARKER_VAR", "Process", "kill_marked", "kill_tree", "marked", "wait_gone"]
