"""A job's marker: every process of a job carries it in its environment, so what escaped the
job's process tree (or outlived the process that ran it) can still be found and killed. Below
both the runner and the device lock, which each kill a job's leftovers."""

from __future__ import annotations

import contextlib
import os
import time

import psutil

MARKER_VAR = "HPCDS1_JOB"


def gone(proc: psutil.Process) -> bool:
    """Dead, or a zombie (dead, waiting for a parent to reap it: not every init does at once)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def wait_gone(procs: list[psutil.Process], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not all(gone(p) for p in procs) and time.monotonic() < end:
        time.sleep(0.01)


def marked(marker: str) -> list[psutil.Process]:
    """This user's processes whose environment carries the job marker `marker`."""
    uid = os.getuid()
    found = []
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"] is None or proc.info["uids"].real != uid:
                continue
            if proc.environ().get(MARKER_VAR) == marker:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def kill_marked(marker: str) -> int:
    """SIGKILL every process of the job `marker` (a job left behind); how many there were."""
    procs = marked(marker)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    wait_gone(procs)
    return len(procs)
