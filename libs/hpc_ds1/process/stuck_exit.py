"""A stopped service process that does not end is ended: once its services have stopped (the
bus drained, the engine disposed, `service_stopped` logged), what can still hold the process
is a worker thread blocked in a call nobody awaits any more, such as a database connect to a
server that stopped beside it. Python joins such threads twice on the way out (the event
loop's default executor, then the interpreter's exit), with no bound, so the process outlives
its stop grace and is killed (exit 137 under compose). This bounds that wait: after `grace_s`
it logs the threads still alive, with where each one is, and exits with the process's code."""

from __future__ import annotations

import os
import sys
import threading
import traceback

from ..log import get_logger


def leftover_threads() -> list[dict[str, str]]:
    """The live threads other than this one and the daemons, each with its innermost frames."""
    frames = sys._current_frames()
    me = threading.get_ident()
    out = []
    for thread in threading.enumerate():
        if thread.ident == me or thread.daemon or thread.ident is None:
            continue
        frame = frames.get(thread.ident)
        where = "".join(traceback.format_stack(frame, limit=4)).strip() if frame else "unknown"
        out.append({"name": thread.name, "where": where})
    return out


def exit_if_stuck(grace_s: float, code: int) -> threading.Thread:
    """Start a daemon watchdog: if the process is still alive `grace_s` seconds from now, log
    what holds it and end it with `code`. A process that ends in time never hears from it."""

    def watchdog() -> None:
        stuck = leftover_threads()
        get_logger("runtime").warning(
            "process_outlived_its_services",
            grace_s=grace_s,
            exit_code=code,
            threads=stuck,
        )
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)

    timer = threading.Timer(grace_s, watchdog)
    timer.name = "hpc-ds1-exit-watchdog"
    timer.daemon = True
    timer.start()
    return timer
