"""`setup --budget RUNS|DURATION`: measure what is expected to teach most, not every
configuration (issue 42, item 2).

Each (workload, size) cell gets an equal share of the budget. Within a cell the search's
active learning (`hpc_ds1.tuning.search.budgeted_setup`) chooses: a space-filling start, then
batches of the configurations of highest expected improvement under a surrogate refitted on
what ran. Every run is the real runner's and is recorded as a setup measurement as it ends, so
an interrupted setup keeps what it measured, and a second one reads those back from the log
instead of running them again. A DURATION budget stops starting runs once it is spent; each
cell gets an equal share of what is left when it starts."""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from hpc_ds1.db import tables
from hpc_ds1.knobs import KnobConfig
from hpc_ds1.machine.devicelock import device_lock
from hpc_ds1.runner import Job, RunResult, run_many, run_repeats
from hpc_ds1.runner.inflight import InFlight
from hpc_ds1.space import ConfigSpace, knob_view
from hpc_ds1.tuning.search import Prior, budgeted_setup

from .campaign import Campaign, CampaignReport
from .plan import PlannedJob
from .warm import PriorOf

UNITS_S = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|min|h)\s*$")
MIN_RUNS_PER_CELL = 2


class BudgetError(ValueError):
    """A budget that cannot be used; the message says what is accepted."""


@dataclass(frozen=True)
class Budget:
    runs: int | None = None  # at most this many runs in all
    seconds: float | None = None  # no run starts after this much time

    @classmethod
    def parse(cls, text: str) -> Budget:
        """RUNS (a whole number, e.g. 600) or DURATION (e.g. 90s, 30m, 2h)."""
        if text.strip().isdigit():
            runs = int(text)
            if runs < 1:
                raise BudgetError(f"--budget {text!r}: at least 1 run")
            return cls(runs=runs)
        found = DURATION.match(text)
        if found is None or float(found.group(1)) <= 0:
            raise BudgetError(
                f"--budget {text!r}: accepted: a number of runs (600) or a duration above 0 "
                "(90s, 30m, 1.5h)"
            )
        return cls(seconds=float(found.group(1)) * UNITS_S[found.group(2)])


class _OutOfTime(Exception):
    """The DURATION budget is spent: no run starts."""


@dataclass(frozen=True)
class _Outcome:
    seconds: float | None
    failure: str | None


class _CellDevice:
    """The real runner as the search's device for one (workload, size) cell: each run is
    recorded as it ends; what the log holds from an earlier setup is read back, not run."""

    def __init__(
        self,
        campaign: Campaign,
        loop: asyncio.AbstractEventLoop,
        workload: str,
        size: int,
        space: ConfigSpace,
        repeats: int,
        known: dict[str, tuple[str, float | None]],
        deadline: float | None,
        stop: threading.Event,
    ) -> None:
        self.campaign, self.loop, self.stop = campaign, loop, stop
        self.workload, self.size, self.repeats = workload, size, repeats
        self.view = knob_view(space)
        self.known, self.deadline = known, deadline
        self.report = CampaignReport()
        self.inflight = InFlight()  # the run in flight: the progress bar's, the heartbeat's

    def run(self, values: KnobConfig) -> _Outcome:
        job = PlannedJob(self.workload, self.size, self.view.config(values), self.repeats)
        found = self.known.get(self.campaign.measurement_id(job))
        if found is not None:
            self.report.skipped += 1
            self.campaign.done += 1
            status, runtime = found
            return _Outcome(runtime if status == "ok" else None, None if status == "ok" else status)
        if self.stop.is_set() or (self.deadline is not None and time.monotonic() > self.deadline):
            raise _OutOfTime
        result = self._measure(job)
        record = self.campaign._record([job], [result])
        future: Future[Any] = asyncio.run_coroutine_threadsafe(record, self.loop)
        future.result()
        self.campaign._count(self.report, [result])
        self.campaign.done += 1  # the progress bar's count moves as each run ends
        ok = result.ok and result.runtime_s is not None
        return _Outcome(result.runtime_s if ok else None, None if ok else result.status.value)

    def _measure(self, job: PlannedJob) -> RunResult:
        with device_lock(self.campaign.stack.settings.home):
            one = Job(workload=job.workload, size=job.size, config=job.config, repeats=job.repeats)
            return run_many(
                [one],
                timeout_s=self.campaign.timeout_s,
                cancel=self.stop,
                on_start=self.inflight.start,
            )[0]


def _known(campaign: Campaign) -> dict[str, tuple[str, float | None]]:
    t = tables.measurements
    with campaign.stack.engine.connect() as conn:
        rows = conn.execute(
            select(t.c.measurement_id, t.c.status, t.c.runtime_s).where(
                t.c.device_id == campaign.device_id, t.c.purpose == campaign.purpose
            )
        )
        return {r[0]: (r[1], r[2]) for r in rows}


async def run_budgeted(
    campaign: Campaign,
    cells: Sequence[tuple[str, int, ConfigSpace]],
    budget: Budget,
    repeats: int | None,
    progress: Callable[[int, int, str], None],
    seed: int = 0,
    default_repeats: int = 2,
    prior_of: PriorOf | None = None,
) -> CampaignReport:
    """Measure `cells` ((workload, size, space) each) under `budget` (see the module), each
    run with `repeats` timed runs; None: the workload's own (a workload file's `repeats`),
    else `default_repeats` (the profile's). `prior_of`: a warm start from what the fleet
    measured (setup/warm.py); None: a cold start."""
    started = time.monotonic()
    await campaign.stack.caught_up()
    known = await asyncio.to_thread(_known, campaign)
    loop = asyncio.get_running_loop()
    stop = threading.Event()
    total = CampaignReport()
    deadline = None if budget.seconds is None else started + budget.seconds
    for i, (workload, size, space) in enumerate(cells):
        left = len(cells) - i
        runs = space_runs = len(space.configs())
        if budget.runs is not None:
            spent = total.measured + total.skipped
            runs = max(MIN_RUNS_PER_CELL, math.floor((budget.runs - spent) / left))
        share = None
        if deadline is not None:
            share = time.monotonic() + max(0.0, deadline - time.monotonic()) / left
        times = run_repeats(workload, repeats, default_repeats)
        device = _CellDevice(campaign, loop, workload, size, space, times, known, share, stop)
        prior = None
        if prior_of is not None:
            prior = await asyncio.to_thread(prior_of, workload, size, device.view)
            total.siblings[workload] = len(prior)
        label = f"{workload} {size}"
        progress(total.measured + total.skipped, budget.runs or 0, label)
        campaign.done, campaign.total = total.measured + total.skipped, budget.runs or 0
        try:
            await campaign.in_flight(
                asyncio.to_thread(_search, device, min(runs, space_runs), seed + i, prior),
                device.inflight,
                progress,
                label,
            )
        except asyncio.CancelledError:
            stop.set()
            raise
        for key in ("planned", "skipped", "measured", "failed"):
            setattr(total, key, getattr(total, key) + getattr(device.report, key))
        for status, count in device.report.by_status.items():
            total.by_status[status] = total.by_status.get(status, 0) + count
        total.planned += min(runs, space_runs)
    total.seconds = time.monotonic() - started
    return total


def _search(device: _CellDevice, runs: int, seed: int, prior: Prior | None) -> None:
    try:
        budgeted_setup(device.view.knobs, device, runs, seed=seed, prior=prior)
    except _OutOfTime:
        pass
