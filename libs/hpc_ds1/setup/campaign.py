"""Runs a setup plan for real, one (workload, size) chunk at a time, recording every result as a
measurement event; a rerun skips what the log already holds, so an interruption loses nothing.
A chunk's repeats are taken in interleaved rounds, in a seeded random order (interleave.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import select

from hpc_ds1.db import tables
from hpc_ds1.devicelock import device_lock
from hpc_ds1.events import envelope
from hpc_ds1.measure import config_key, measurement_event
from hpc_ds1.runner import RunResult
from hpc_ds1.stack import Stack

from .interleave import chunk_rng, measure_interleaved, run_jobs
from .plan import PlannedJob

Progress = Callable[[int, int, str], None]  # done, total, label


def setup_measurement_id(device_id: str, job: PlannedJob, purpose: str = "setup") -> str:
    """Deterministic, so a re-run's event for the same job is recognised as already there."""
    return f"{purpose}:{device_id[:16]}:{job.workload}:{job.size}:{config_key(job.config)}"


@dataclass
class CampaignReport:
    planned: int = 0
    skipped: int = 0
    measured: int = 0
    failed: int = 0
    seconds: float = 0.0
    by_status: dict[str, int] = field(default_factory=dict)


class Campaign:
    def __init__(
        self,
        stack: Stack,
        device_id: str,
        timeout_s: float = 300.0,
        *,
        purpose: str = "setup",
        held_out: bool = False,
        seed: int = 0,
    ) -> None:
        """purpose "setup" measures training data; "evaluate" (and "truth") with held_out=True
        measure the held-out landscape, which training never reads. `seed` draws the order of
        the interleaved rounds (with the chunk's workload and size)."""
        self.stack = stack
        self.device_id = device_id
        self.timeout_s = timeout_s
        self.purpose = purpose
        self.held_out = held_out
        self.seed = seed

    def measurement_id(self, job: PlannedJob) -> str:
        return setup_measurement_id(self.device_id, job, self.purpose)

    def already_measured(self) -> set[str]:
        t = tables.measurements
        with self.stack.engine.connect() as conn:
            rows = conn.execute(
                select(t.c.measurement_id).where(
                    t.c.device_id == self.device_id, t.c.purpose == self.purpose
                )
            )
            return {r[0] for r in rows}

    async def run(
        self, chunks: Sequence[Sequence[PlannedJob]], progress: Progress
    ) -> CampaignReport:
        started = time.monotonic()
        await self.stack.caught_up()
        done_ids = await asyncio.to_thread(self.already_measured)
        report = CampaignReport(planned=sum(len(c) for c in chunks))
        done = 0
        for chunk in chunks:
            todo = [j for j in chunk if self.measurement_id(j) not in done_ids]
            report.skipped += len(chunk) - len(todo)
            done += len(chunk) - len(todo)
            if not todo:
                progress(done, report.planned, "")
                continue
            label = f"{todo[0].workload} {todo[0].size}"
            progress(done, report.planned, label)
            stop = threading.Event()
            try:
                results = await asyncio.to_thread(self._measure, todo, stop)
            except asyncio.CancelledError:
                # Ctrl-C: the thread cannot be cancelled, and asyncio.run waits for it at exit;
                # the launch that runs is killed and no other starts, instead of measuring the
                # rest of the chunk (minutes)
                stop.set()
                raise
            await self._record(todo, results)
            for result in results:
                report.by_status[result.status.value] = (
                    report.by_status.get(result.status.value, 0) + 1
                )
            report.measured += len(results)
            report.failed += sum(1 for r in results if not r.ok)
            done += len(todo)
            progress(done, report.planned, label)
        report.seconds = time.monotonic() - started
        return report

    def _measure(self, jobs: Sequence[PlannedJob], stop: threading.Event) -> list[RunResult]:
        rng = chunk_rng(self.seed, self.purpose, jobs[0].workload, jobs[0].size)
        with device_lock(self.stack.settings.home):
            return measure_interleaved(jobs, rng, run_jobs(self.timeout_s, stop), stop)

    async def _record(self, jobs: Sequence[PlannedJob], results: Sequence[RunResult]) -> None:
        prefix = self.stack.settings.subject_prefix
        await self.stack.bus.publish_many(
            envelope(
                measurement_event(
                    r, self.device_id, self.purpose, self.measurement_id(j), self.held_out
                ),
                actor="setup",
                source="setup",
                prefix=prefix,
            )
            for j, r in zip(jobs, results, strict=True)
        )
