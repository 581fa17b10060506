"""What a measurement thread runs now: the job that started last (run_many's `on_start`) and
since when, read by the event loop for the progress bar and the run.heartbeat events
(measure.while_in_flight) while the thread blocks in the runner for minutes."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from hpc_ds1.runner.result import Job


@dataclass(frozen=True)
class Running:
    """One job in flight: which, its number among the jobs started (a new run, new beats),
    and how long it has run."""

    job: Job
    number: int
    elapsed_s: float


class InFlight:
    """Thread-safe: the runner's thread calls `start(job)` (pass it as `on_start`) and
    `clear()`; the event loop reads `now()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._job: Job | None = None
        self._started = 0.0
        self._number = 0

    def start(self, job: Job) -> None:
        with self._lock:
            self._job, self._started = job, time.monotonic()
            self._number += 1

    def clear(self) -> None:
        with self._lock:
            self._job = None

    def now(self) -> Running | None:
        with self._lock:
            if self._job is None:
                return None
            return Running(self._job, self._number, time.monotonic() - self._started)


def elapsed_words(seconds: float) -> str:
    """3 s, 1m05s, 1h02m: a run's time so far, for a progress bar."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def job_words(job: Job) -> str:
    """A job in a few words: `hpcc 800 · 2x1 nb=64 p=1 q=2` (ranks x threads, its knobs)."""
    c = job.config
    knobs = " ".join(f"{name}={value}" for name, value in c.knobs)
    parts = [f"{c.ranks}x{c.threads}", *([f"tile={c.tile}"] if not c.knobs else []), knobs]
    return f"{job.workload} {job.size} · {' '.join(p for p in parts if p)}"
