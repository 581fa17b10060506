"""Tuning sessions run for real on the held-out sizes (`hpc-ds1 evaluate --live N`).

A replayed session (model.replay.model_session on the observed pass) sees each configuration's
observed median, and a race's re-run is modelled as a draw around that median: a replay cannot
race out of the observed pass's luck, and it assumes the noise the observed pass measured. A
live session is the coordinator's session fold with every run a real launch, as `tune` runs
one (one warm-up, requests.RUN_REPEATS timed runs in one launch): a re-run is a new launch.
Per cell, the model's session from its recommendation (where `tune` starts) and from N seeded
random starts run live; each is scored on the truth pass beside the replay of the same start, so the
difference between the two is what the replay gets wrong on this machine."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpc_ds1.model import replay
from hpc_ds1.model.replay import Cell
from hpc_ds1.model.schema import Measurement, Thresholds
from hpc_ds1.runner import RunResult
from hpc_ds1.runner.keep import DEFAULT_RULE, KeepRule
from hpc_ds1.space import Config, ConfigSpace

from . import policies as pol
from .headline import figure_interval, versus
from .landscape import percentile
from .truth import TrueScore

LIVE_POLICY = {"model": "model_live", "model_recommend": "model_recommend_live"}
REPLAYED = "replayed_at_live_starts"  # the replay of the live sessions' starts, paired
LIVE = "live"
FLOORED = "_launch_floor"  # a live session whose keep rule took a launch floor (benchmark only)

RunFn = Callable[[str, int, Config], RunResult]  # one real run: workload, size, configuration


@dataclass(frozen=True)
class LiveRun:
    result: RunResult
    seconds: float  # wall time of the run, launch included


class LiveMeasure:
    """A session's runs, each made for real by `run_fn`; keeps every run it made."""

    def __init__(self, cell: Cell, run_fn: RunFn) -> None:
        self.cell = cell
        self.run_fn = run_fn
        self.runs: list[LiveRun] = []

    def __call__(self, config: Config, rerun: int) -> replay.Run | None:
        started = time.perf_counter()
        result = self.run_fn(self.cell.workload, self.cell.size, config)
        self.runs.append(LiveRun(result, time.perf_counter() - started))
        if not result.ok or result.runtime_s is None:
            return None
        return replay.Run(result.runtime_s, result.spread, result.throughput)


def device_runs(
    home: Path,
    space_for: Callable[[str], ConfigSpace],
    timeout_s: float,
    cancel: threading.Event | None = None,
) -> RunFn:
    """Real runs on this machine as `tune`'s agent makes them (RUN_REPEATS timed runs after a
    warm-up, one launch), each under the home's device lock; once `cancel` is set, the launch
    that runs is stopped and every later run raises devicelock.Cancelled."""
    from hpc_ds1.machine.devicelock import device_lock
    from hpc_ds1.requests import RUN_REPEATS
    from hpc_ds1.runner import run

    def run_fn(workload: str, size: int, config: Config) -> RunResult:
        with device_lock(home):
            return run(
                workload,
                size,
                config,
                repeats=RUN_REPEATS,
                space=space_for(workload),
                timeout_s=timeout_s,
                cancel=cancel,
            )

    return run_fn


def live_starts(cell: Cell, n: int, seed: int) -> list[Config]:
    """N starts drawn without replacement from the configurations that ran at this size, from
    (seed, workload, size) alone."""
    pool = sorted(cell.points, key=Config.label)
    rng = random.Random(f"live:{seed}:{cell.workload}:{cell.size}")
    return rng.sample(pool, min(max(n, 0), len(pool)))


def live_sessions(
    model: Any,
    cells: Sequence[Cell],
    thresholds: Thresholds,
    n: int,
    run_fn: RunFn,
    *,
    seed: int = 0,
    rule: KeepRule = DEFAULT_RULE,
    on_session: Callable[[replay.SessionOutcome, list[LiveRun]], None] | None = None,
    floor: Mapping[str, float | None] | None = None,
) -> list[replay.SessionOutcome]:
    """Per cell: the model's session from its recommendation, then from `n` seeded starts,
    every run real (`run_fn`). `on_session` gets each session and its runs as it ends.
    `floor` (benchmarks/live_sessions.py): each start runs twice, once with the keep rule's
    floor on a run's sigma raised to the workload's `floor` (policy suffixed FLOORED) and once
    with `rule` as it is, which goes first alternating from start to start so that neither
    meets the machine's slow minutes alone."""
    out: list[replay.SessionOutcome] = []
    turn = 0
    for cell in cells:
        space = model.space_for(cell.workload)
        answer = pol.system1_answer(model, cell, space, thresholds)
        recommended = model.recommend(
            cell.workload, cell.size, space=space, thresholds=thresholds
        ).config
        plan = [("model", start) for start in live_starts(cell, n, seed)]
        if recommended in cell.points:  # as the replay: a failed pick has no session
            plan.insert(0, ("model_recommend", recommended))
        rules = [("", rule)]
        if floor is not None:
            raised = max(rule.sigma_floor, floor.get(cell.workload) or 0.0)
            rules.insert(0, (FLOORED, replace(rule, sigma_floor=raised)))
        for base, start in plan:
            turn += 1
            for suffix, session_rule in rules if turn % 2 else rules[::-1]:
                measure = LiveMeasure(cell, run_fn)
                outcome = replay.model_session(
                    model,
                    cell,
                    start,
                    space,
                    thresholds,
                    rule=session_rule,
                    seed=seed,
                    policy=LIVE_POLICY[base] + suffix,
                    system1=answer,
                    measure=measure,
                )
                outcome = replace(outcome, cost_s=sum(r.seconds for r in measure.runs))
                if on_session is not None:
                    on_session(outcome, measure.runs)
                out.append(outcome)
    return out


def launch_spread(measurements: Iterable[Measurement], workload: str) -> float | None:
    """A workload's run-to-run spread between launches on a device: the median relative spread
    of its ok training measurements, each taken by setup in interleaved rounds of one launch
    (a live run's own repeats share one launch). The median of two-launch spreads is about
    0.7 sigma for normal noise: a floor, not an estimate. None without a spread."""
    spreads = [
        m.spread
        for m in measurements
        if m.workload == workload and m.ok and not m.held_out and m.spread is not None
    ]
    return round(statistics.median(spreads), 5) if spreads else None


def _base(policy: str) -> str:
    return next(b for b, live in LIVE_POLICY.items() if live == policy)


def paired(scores: Sequence[TrueScore]) -> list[tuple[TrueScore, TrueScore]]:
    """Each live session's truth score with that of the replay from the same start."""
    replayed: dict[tuple[str, str, int, Config], TrueScore] = {}
    for s in scores:
        o = s.outcome
        replayed.setdefault((o.policy, o.workload, o.size, o.start), s)
    out = []
    for s in scores:
        o = s.outcome
        if o.policy in LIVE_POLICY.values():
            twin = replayed.get((_base(o.policy), o.workload, o.size, o.start))
            if twin is not None:
                out.append((s, twin))
    return out


def _figures(scores: Sequence[TrueScore]) -> dict[str, Any]:
    pcts = [s.pct_of_best for s in scores]
    runs = [s.outcome.runs for s in scores]
    return {
        "sessions": len(scores),
        "pct_median": round(statistics.median(pcts), 2),
        "pct_p10": round(percentile(pcts, 0.10), 2),
        "pct_mean": round(statistics.fmean(pcts), 2),
        "within_noise_share": round(sum(s.within_noise for s in scores) / len(scores), 4),
        "runs_median": statistics.median(runs),
        "runs_mean": round(statistics.fmean(runs), 2),
        "cost_s_median": round(statistics.median(s.cost_s for s in scores), 2),
    }


def run_stats(runs: Sequence[LiveRun]) -> dict[str, Any]:
    """The live runs themselves: how many, failed, their own spread, their wall seconds."""
    spreads = [r.result.spread for r in runs if r.result.ok and r.result.spread is not None]
    return {
        "runs": len(runs),
        "failed_runs": sum(not r.result.ok for r in runs),
        "run_spread_median": round(statistics.median(spreads), 4) if spreads else None,
        "run_seconds": round(sum(r.seconds for r in runs), 1),
    }


def live_summary(scores: Sequence[TrueScore], *, seed: int = 0) -> dict[str, Any] | None:
    """results["live"]: the live sessions against the replay of the same starts, on the truth
    pass: both sides' figures, the same final share, and live minus replay with a bootstrap
    interval over cells. None without live sessions."""
    pairs = paired(scores)
    if not pairs:
        return None
    rows = []
    for policy in LIVE_POLICY.values():
        mine = [p for p in pairs if p[0].outcome.policy == policy]
        if mine:
            rows.append(
                {
                    "policy": policy,
                    "live": _figures([a for a, _ in mine]),
                    "live_interval": figure_interval([a for a, _ in mine], policy, seed=seed),
                    "replayed": _figures([b for _, b in mine]),
                    "same_final_share": round(
                        sum(a.outcome.final == b.outcome.final for a, b in mine) / len(mine), 4
                    ),
                }
            )
    relabelled = [replace(a, outcome=replace(a.outcome, policy=LIVE)) for a, _ in pairs] + [
        replace(b, outcome=replace(b.outcome, policy=REPLAYED)) for _, b in pairs
    ]
    return {
        "what": "each live session (every run a real launch, as `tune` runs one) and the "
        "replay of the same start (runs from the observed pass, race re-runs drawn around it), "
        "both scored on the truth pass",
        "table": rows,
        "all": {
            "live": _figures([a for a, _ in pairs]),
            "replayed": _figures([b for _, b in pairs]),
        },
        "live_minus_replayed": versus(relabelled, LIVE, REPLAYED, seed=seed),
    }
