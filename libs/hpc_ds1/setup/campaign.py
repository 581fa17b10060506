"""Runs a setup plan for real, one (workload, size) chunk at a time, recording every result as a
measurement event; a rerun skips what the log already holds, so an interruption loses nothing.
A chunk's repeats are taken in interleaved rounds, in a seeded random order (interleave.py)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import select

from hpc_ds1.db import tables
from hpc_ds1.events import envelope, new_id
from hpc_ds1.machine.devicelock import device_lock
from hpc_ds1.measure import config_key, heartbeats, measurement_event, while_in_flight
from hpc_ds1.runner import RunResult, run_timeout
from hpc_ds1.runner.inflight import InFlight, Running, elapsed_words, job_words
from hpc_ds1.stack import Stack

from .interleave import Window, chunk_rng, measure_interleaved, run_jobs, window_schedule
from .plan import PlannedJob

Progress = Callable[[int, int, str], None]  # done, total, label
Between = Callable[[str, int], Awaitable[None]]  # work between a window's parts: workload, size


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
    # a warm budgeted setup: per workload, how many siblings its prior held (setup/warm.py)
    siblings: dict[str, int] = field(default_factory=dict)


class Campaign:
    def __init__(
        self,
        stack: Stack,
        device_id: str,
        timeout_s: float | None = None,
        *,
        purpose: str = "setup",
        held_out: bool = False,
        seed: int = 0,
        heartbeat_s: float | None = None,
    ) -> None:
        """purpose "setup" measures training data; "evaluate" (and "truth") with held_out=True
        measure the held-out landscape, which training never reads. `seed` draws the order of
        the interleaved rounds (with the chunk's workload and size). `timeout_s`: one run's,
        for every workload; None: each workload's own (runner.run_timeout). `heartbeat_s`:
        a run in flight longer than this publishes a run.heartbeat event every this many
        seconds; None: HPC_DS1_RUN_HEARTBEAT_S."""
        self.stack = stack
        self.device_id = device_id
        self.timeout_s = timeout_s
        self.purpose = purpose
        self.held_out = held_out
        self.seed = seed
        self.heartbeat_s = heartbeat_s or stack.settings.run_heartbeat_s
        self.run_id = f"{purpose}-{new_id()[:16]}"  # the heartbeats' subject: this campaign's
        self.done = 0  # runs finished, and planned, as the progress bar counts them
        self.total = 0

    async def in_flight(
        self, measuring: Any, inflight: InFlight, progress: Progress | None, label: str
    ) -> Any:
        """Await a measurement thread (`measuring`), showing the run in flight in the
        progress bar's label and publishing its heartbeats (measure.while_in_flight)."""

        def show(now: Running) -> None:
            if progress is not None:
                words = f"{job_words(now.job)} · {elapsed_words(now.elapsed_s)}"
                progress(self.done, self.total, words)

        beat = heartbeats(
            self.stack.bus,
            self.stack.settings.subject_prefix,
            run_id=self.run_id,
            device_id=self.device_id,
            purpose=self.purpose,
            actor="setup",
            source=self.purpose,
            timeout_s=lambda workload: run_timeout(workload, self.timeout_s),
            progress=lambda: (self.done, self.total),
        )
        return await while_in_flight(
            measuring, inflight, heartbeat_s=self.heartbeat_s, beat=beat, show=show
        )

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
        self.total = report.planned
        for chunk in chunks:
            todo = [j for j in chunk if self.measurement_id(j) not in done_ids]
            report.skipped += len(chunk) - len(todo)
            done += len(chunk) - len(todo)
            if not todo:
                progress(done, report.planned, "")
                continue
            label = f"{todo[0].workload} {todo[0].size}"
            progress(done, report.planned, label)
            self.done = done
            stop = threading.Event()
            inflight = InFlight()
            try:
                results = await self.in_flight(
                    asyncio.to_thread(self._measure, todo, stop, inflight),
                    inflight,
                    progress,
                    label,
                )
            except asyncio.CancelledError:
                # Ctrl-C: the thread cannot be cancelled, and asyncio.run waits for it at exit;
                # the launch that runs is killed and no other starts, instead of measuring the
                # rest of the chunk (minutes)
                stop.set()
                raise
            await self._record(todo, results)
            self._count(report, results)
            done += len(todo)
            progress(done, report.planned, label)
        report.seconds = time.monotonic() - started
        return report

    def _count(self, report: CampaignReport, results: Sequence[RunResult]) -> None:
        for result in results:
            report.by_status[result.status.value] = report.by_status.get(result.status.value, 0) + 1
        report.measured += len(results)
        report.failed += sum(1 for r in results if not r.ok)

    def _measure(
        self, jobs: Sequence[PlannedJob], stop: threading.Event, inflight: InFlight | None = None
    ) -> list[RunResult]:
        rng = chunk_rng(self.seed, self.purpose, jobs[0].workload, jobs[0].size)
        on_start = inflight.start if inflight is not None else None
        with device_lock(self.stack.settings.home):
            return measure_interleaved(jobs, rng, run_jobs(self.timeout_s, stop, on_start), stop)

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


async def measure_windows(
    first: Campaign,
    second: Campaign,
    chunks: Sequence[Sequence[PlannedJob]],
    second_repeats: int,
    progress: Progress,
    between: Between | None = None,
) -> tuple[CampaignReport, CampaignReport]:
    """Two passes over every chunk's configurations (`first`'s jobs as planned, `second`'s
    with `second_repeats`), one chunk at a time, each chunk's rounds of both passes interleaved
    in one window (interleave.window_schedule, drawn from the seed and the chunk): a load that
    comes and goes falls on both passes alike. With `between`, it runs for every chunk once
    `first`'s pass of it is recorded, and half of `second`'s rounds come after it. Each pass is
    recorded under its own campaign's purpose; what the log already holds is skipped, as in
    Campaign.run (an interrupted window records `first`'s pass once it is whole, and measures
    the rest again)."""
    await first.stack.caught_up()
    done_first = await asyncio.to_thread(first.already_measured)
    done_second = await asyncio.to_thread(second.already_measured)
    reports = (CampaignReport(), CampaignReport())
    total = sum(len(c) for c in chunks) * 2
    done = 0
    for chunk in chunks:
        jobs = {
            "first": [j for j in chunk if first.measurement_id(j) not in done_first],
            "second": [
                again
                for again in (replace(j, repeats=second_repeats) for j in chunk)
                if second.measurement_id(again) not in done_second
            ],
        }
        for report, label in zip(reports, jobs, strict=True):
            report.planned += len(chunk)
            report.skipped += len(chunk) - len(jobs[label])
        done += 2 * len(chunk) - len(jobs["first"]) - len(jobs["second"])
        workload, size = chunk[0].workload, chunk[0].size
        label = f"{workload} {size}"
        progress(done, total, label)
        for campaign in (first, second):
            campaign.done, campaign.total = done, total
        window = Window(jobs)
        rng = chunk_rng(first.seed, f"{first.purpose}+{second.purpose}", workload, size)
        before, after = window_schedule(
            ("first", window.rounds("first")),
            ("second", window.rounds("second")),
            rng,
            split=between is not None,
        )
        for part, (campaign, report, name) in enumerate(
            zip((first, second), reports, jobs, strict=True)
        ):
            await _window_part(
                campaign, window, before if part == 0 else after, rng, progress, label
            )
            if jobs[name]:  # the pass is whole: recorded before anything else runs
                results = window.results(name)
                await campaign._record(jobs[name], results)
                campaign._count(report, results)
            done += len(jobs[name])
            progress(done, total, label)
            if part == 0 and between is not None:
                await between(workload, size)
        for report, label in zip(reports, jobs, strict=True):
            report.seconds += window.seconds[label]
    return reports


async def _window_part(
    campaign: Campaign,
    window: Window,
    labels: Sequence[str],
    rng: random.Random,
    progress: Progress | None = None,
    label: str = "",
) -> None:
    if not labels:
        return
    stop = threading.Event()
    inflight = InFlight()

    def measure() -> None:
        run = run_jobs(campaign.timeout_s, stop, inflight.start)
        with device_lock(campaign.stack.settings.home):
            window.run_rounds(labels, rng, run, stop)

    try:
        await campaign.in_flight(asyncio.to_thread(measure), inflight, progress, label)
    except asyncio.CancelledError:
        stop.set()  # as Campaign.run: the launch that runs is killed, no other starts
        raise
