"""Process management: start a command in its own session, read its lines with deadlines, and
kill the whole process group (and any descendant that left it) so nothing is left behind."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import psutil

EOF_MARK = None


@dataclass
class Process:
    """A child in its own session; lines from stdout arrive on a queue, stderr is kept (tail)."""

    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    popen: subprocess.Popen[str] = field(init=False)
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue, init=False)
    stdout_tail: deque[str] = field(default_factory=lambda: deque(maxlen=200), init=False)
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=200), init=False)

    def __post_init__(self) -> None:
        self.popen = subprocess.Popen(
            list(self.argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(self.env) if self.env is not None else None,
            start_new_session=True,
        )
        threading.Thread(target=self._pump_stdout, daemon=True).start()
        threading.Thread(target=self._pump_stderr, daemon=True).start()

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

    def next_line(self, deadline: float) -> tuple[str, str | None]:
        """("line", text), ("eof", None) when stdout closed, or ("timeout", None)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout", None
        try:
            item = self.lines.get(timeout=remaining)
        except queue.Empty:
            return "timeout", None
        if item is EOF_MARK:
            self.lines.put(EOF_MARK)  # stay at EOF for later calls
            return "eof", None
        return "line", item

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stderr_text(self, lines: int = 20) -> str:
        return "\n".join(list(self.stderr_tail)[-lines:])

    def output_text(self) -> str:
        return "\n".join(self.stdout_tail)

    def kill(self) -> None:
        """SIGKILL the process group, then any descendant that escaped it; reap the child."""
        kill_tree(self.popen.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)

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
    psutil.wait_procs(descendants, timeout=5)
