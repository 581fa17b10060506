"""What the rank program tells its runner: one `@@HPCDS1 {json}` line per event on stdout.

A job that raises also writes its error event to the launch's report file before it aborts the
MPI job: `MPI_Abort` kills the ranks and their launcher's proxies at once, and a line still in
a pipe between a rank and `mpiexec` is lost with them, while a file written before the abort
is not."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

PREFIX = "@@HPCDS1 "


def encode(event: dict[str, Any]) -> str:
    return PREFIX + json.dumps(event) + "\n"


def parse(line: str) -> dict[str, Any] | None:
    """The event of one output line; None for any other line (a workload's own output)."""
    if not line.startswith(PREFIX):
        return None
    try:
        value = json.loads(line[len(PREFIX) :])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def report(path: str | None, event: dict[str, Any]) -> None:
    """Append `event` to the report file in one write (O_APPEND: ranks do not interleave).
    Never raises: a failing rank must still reach its abort (stdout and stderr remain)."""
    if not path:
        return
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, encode(event).encode())
        finally:
            os.close(fd)


def reported_error(path: Path) -> dict[str, Any] | None:
    """The first error event in the report file, if any rank wrote one."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        event = parse(line)
        if event is not None and event.get("event") == "error":
            return event
    return None
