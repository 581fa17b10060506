"""The truth pass: what a session ended on, scored on a separate, more careful measurement.

Sessions are replayed on the observed pass (3 repeats per configuration, what a session would
see). Scoring them on those same medians rewards a policy that keeps the luckiest median (the
reference best is the minimum of many noisy medians). So, after the observed pass, the truth pass
re-measures, with TRUTH_REPEATS repeats in interleaved rounds of a seeded random order:

- every configuration within NEAR_BEST (15 %) of the observed best, and
- every configuration any policy ended on (and, with `everything`, every configuration).

On the truth pass, for every session:

- score = true runtime of the truth pass's best / true runtime of the final configuration;
- within noise of the true best: t_final / t_best - 1 <= 2 * sqrt(se_final^2 + se_best^2),
  where se = 1.2533 * spread / sqrt(repeats) is the standard error of a median (spread: the
  robust relative sigma, 1.4826 * MAD / median, of that configuration's truth repeats); two
  standard errors: a difference the truth pass cannot tell from zero;
- share of the available speed-up captured: (t_start - t_final) / (t_start - t_best), for the
  sessions whose start was truth-measured and slower than the true best beyond that noise
  (elsewhere there was nothing to capture); negative when the session ended slower than it
  started;
- tuning cost: the real run time the session spent: a live session's measured seconds; a
  replayed one's, the observed runtime of every run it made times (1 warm-up + the session's
  timed runs), as the coordinator's agent runs a session's step (requests.RUN_REPEATS timed
  runs after the runner's warm-up).

Exhaustive search ends on the observed best; scored on the truth pass it lands below 100 %
wherever the observed best was luck, which checks that the method sees the noise."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpc_ds1.model.labels import aggregate
from hpc_ds1.model.replay import Cell, SessionOutcome
from hpc_ds1.model.schema import Measurement
from hpc_ds1.requests import RUN_REPEATS
from hpc_ds1.space import Config

from .landscape import EvaluationError, percentile
from .policies import ALL_POLICIES

NEAR_BEST = 0.15
TRUTH_REPEATS = 5
SESSION_REPEATS = RUN_REPEATS  # timed runs per run of a tuning session, after a warm-up
SE_MEDIAN = 1.2533  # standard error of a median = 1.2533 sigma / sqrt(n) (normal noise)
NOISE_Z = 2.0

Key = tuple[str, int]


@dataclass(frozen=True)
class TruePoint:
    runtime_s: float
    spread: float

    def se(self, repeats: int) -> float:
        """Relative standard error of this median."""
        return SE_MEDIAN * self.spread / math.sqrt(max(repeats, 1))


def truth_configs(
    cells: Sequence[Cell],
    outcomes: Iterable[SessionOutcome],
    *,
    near: float = NEAR_BEST,
    everything: bool = False,
) -> dict[Key, list[Config]]:
    """What the truth pass measures, per (workload, size): every configuration within `near`
    of the observed best and every one a session ended on; every configuration with
    `everything`. Failed configurations are never re-measured."""
    finals: dict[Key, set[Config]] = {}
    for o in outcomes:
        finals.setdefault((o.workload, o.size), set()).add(o.final)
    out = {}
    for cell in cells:
        key = (cell.workload, cell.size)
        wanted = {
            c
            for c, p in cell.points.items()
            if everything or p.runtime_s <= cell.best_runtime_s * (1.0 + near)
        }
        wanted |= {c for c in finals.get(key, ()) if c in cell.points}
        out[key] = sorted(wanted, key=Config.label)
    return out


def split_passes(
    rows: Iterable[Mapping[str, Any]],
) -> tuple[list[Measurement], list[Measurement]]:
    """A device's measurement rows as (everything but the truth pass, the truth pass); a live
    session's runs (purpose "live", evaluation/live.py) are in neither: they are no pass over
    the space, and folded into the observed pass they would change its medians."""
    observed: list[Measurement] = []
    truth: list[Measurement] = []
    for row in rows:
        purpose = row.get("purpose")
        if purpose != "live":
            (truth if purpose == "truth" else observed).append(Measurement.model_validate(row))
    return observed, truth


def truth_points(measurements: Iterable[Measurement]) -> dict[Key, dict[Config, TruePoint]]:
    """The truth pass's measurements as (workload, size) -> configuration -> true runtime."""
    outcomes = aggregate(m.model_copy(update={"held_out": False}) for m in measurements)
    out: dict[Key, dict[Config, TruePoint]] = {}
    for (workload, size, config), o in outcomes.items():
        if o.ok and o.runtime_s is not None:
            out.setdefault((workload, size), {})[config] = TruePoint(o.runtime_s, o.spread or 0.0)
    return out


def within_noise(final: TruePoint, best: TruePoint, repeats: int) -> bool:
    if final.runtime_s <= best.runtime_s:
        return True
    band = NOISE_Z * math.hypot(final.se(repeats), best.se(repeats))
    return final.runtime_s / best.runtime_s - 1.0 <= band


@dataclass(frozen=True)
class TrueScore:
    outcome: SessionOutcome
    pct_of_best: float
    within_noise: bool
    speedup_captured: float | None  # None: start not truth-measured, or nothing to capture
    cost_s: float


def score_sessions(
    cells: Sequence[Cell],
    outcomes: Sequence[SessionOutcome],
    truth: Mapping[Key, Mapping[Config, TruePoint]],
    *,
    repeats: int = TRUTH_REPEATS,
    session_repeats: int = SESSION_REPEATS,
) -> list[TrueScore]:
    by_key = {(c.workload, c.size): c for c in cells}
    missing = sorted(
        {
            f"{o.workload} {o.size} {o.final.label()}"
            for o in outcomes
            if o.final not in truth.get((o.workload, o.size), {})
        }
    )
    if missing:
        raise EvaluationError(
            f"the truth pass is incomplete: {len(missing)} final configurations not re-measured "
            f"(e.g. {missing[0]}); run `hpc-ds1 evaluate` again to measure them"
        )
    scores = []
    for o in outcomes:
        cell, points = by_key[(o.workload, o.size)], truth[(o.workload, o.size)]
        best = min(points.values(), key=lambda p: p.runtime_s)
        final = points[o.final]
        captured = None
        start = points.get(o.start)
        if start is not None and not within_noise(start, best, repeats):
            captured = (start.runtime_s - final.runtime_s) / (start.runtime_s - best.runtime_s)
        cost = o.cost_s
        if cost is None:  # replayed: what its runs would have cost
            cost = sum(
                cell.points[c].runtime_s * (1 + session_repeats) for c in o.ran if c in cell.points
            )
        scores.append(
            TrueScore(
                o,
                100.0 * best.runtime_s / final.runtime_s,
                within_noise(final, best, repeats),
                captured,
                cost,
            )
        )
    return scores


def _r(value: float, digits: int = 2) -> float:
    return round(value, digits)


def truth_table(scores: Sequence[TrueScore]) -> list[dict[str, Any]]:
    rows = []
    for policy in ALL_POLICIES:
        mine = [s for s in scores if s.outcome.policy == policy]
        if not mine:
            continue
        pcts = [s.pct_of_best for s in mine]
        observed = [s.outcome.pct_of_best for s in mine]
        captured = [s.speedup_captured for s in mine if s.speedup_captured is not None]
        costs = [s.cost_s for s in mine]
        rows.append(
            {
                "policy": policy,
                "sessions": len(mine),
                "pct_median": _r(statistics.median(pcts)),
                "pct_p10": _r(percentile(pcts, 0.10)),
                "pct_mean": _r(statistics.fmean(pcts)),
                "within_noise_share": _r(sum(s.within_noise for s in mine) / len(mine), 4),
                "speedup_captured_median": _r(statistics.median(captured), 4) if captured else None,
                "speedup_captured_mean": _r(statistics.fmean(captured), 4) if captured else None,
                "speedup_sessions": len(captured),
                "cost_s_median": _r(statistics.median(costs), 3),
                "cost_s_mean": _r(statistics.fmean(costs), 3),
                "runs_median": statistics.median(s.outcome.runs for s in mine),
                "observed_pct_median": _r(statistics.median(observed)),
                "observed_pct_p10": _r(percentile(observed, 0.10)),
            }
        )
    return rows


def exhaustive_check(scores: Sequence[TrueScore]) -> dict[str, Any]:
    """Exhaustive search on the truth pass, one figure per (workload, size): it must land below
    100 % somewhere, or the truth pass does not see the noise it is there for."""
    per_cell: dict[Key, float] = {}
    for s in scores:
        if s.outcome.policy == "exhaustive":
            per_cell[(s.outcome.workload, s.outcome.size)] = s.pct_of_best
    values = list(per_cell.values())
    return {
        "cells": len(values),
        "cells_below_100": sum(v < 100.0 - 1e-9 for v in values),
        "pct_mean": _r(statistics.fmean(values)) if values else None,
        "pct_min": _r(min(values)) if values else None,
        "below_100": bool(values) and statistics.fmean(values) < 100.0 - 1e-9,
    }


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def rank_correlation(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rho of two equally long samples; None where either is constant."""
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    den = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return num / den if den > 0 else None


def pass_agreement(
    cells: Sequence[Cell], truth: Mapping[Key, Mapping[Config, TruePoint]]
) -> dict[str, Any]:
    """How far the truth pass agrees with the observed pass, per (workload, size), over the
    configurations both measured: the level (median of truth / observed: a load on one pass
    only moves it away from 1), the disagreement beyond that level (the mean of |ln(truth /
    observed) - its median|: a load on some configurations of one pass, which reorders them,
    raises it; noise alone makes some) and the rank correlation of the two passes' medians.
    Passes taken apart in time disagree more when the machine's load changes between them,
    which evaluate's windows are there to avoid."""
    levels, beyond, rhos = [], [], []
    for cell in cells:
        points = truth.get((cell.workload, cell.size), {})
        both = [c for c in cell.points if c in points]
        if len(both) < 3:
            continue
        logs = [math.log(points[c].runtime_s / cell.points[c].runtime_s) for c in both]
        level = statistics.median(logs)
        levels.append(math.exp(level))
        beyond.append(statistics.fmean(abs(x - level) for x in logs))
        rho = rank_correlation(
            [cell.points[c].runtime_s for c in both], [points[c].runtime_s for c in both]
        )
        if rho is not None:
            rhos.append(rho)
    if not levels:
        return {"cells": 0}
    return {
        "cells": len(levels),
        "level_median": _r(statistics.median(levels), 4),
        "level_range": [_r(min(levels), 4), _r(max(levels), 4)],
        "disagreement_median": _r(statistics.median(beyond), 4),
        "disagreement_max": _r(max(beyond), 4),
        "rank_correlation_median": _r(statistics.median(rhos), 4) if rhos else None,
        "rank_correlation_min": _r(min(rhos), 4) if rhos else None,
    }


TAIL_POLICIES = ("model", "model_live", "exhaustive", "random")


def cell_sessions(scores: Sequence[TrueScore]) -> dict[Key, dict[str, Any]]:
    """Per size and policy, the true % of best of its sessions: where a policy's tail lies."""
    pcts: dict[Key, dict[str, list[float]]] = {}
    for s in scores:
        if s.outcome.policy in TAIL_POLICIES:
            key = (s.outcome.workload, s.outcome.size)
            pcts.setdefault(key, {}).setdefault(s.outcome.policy, []).append(s.pct_of_best)
    return {
        key: {
            policy: {
                "sessions": len(values),
                "pct_median": _r(statistics.median(values)),
                "pct_p10": _r(percentile(values, 0.10)),
            }
            for policy, values in sorted(by_policy.items())
        }
        for key, by_policy in pcts.items()
    }


def model_tail(
    scores: Sequence[TrueScore], per_size: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Which sizes hold the model's sessions below its 10th percentile, most first: a p10 over
    sessions weighs each size by its starts, so one size of a large space can hold it."""
    mine = [s for s in scores if s.outcome.policy == "model"]
    if not mine:
        return {"p10": None, "sizes": []}
    p10 = percentile([s.pct_of_best for s in mine], 0.10)
    below: dict[Key, int] = {}
    for s in mine:
        if s.pct_of_best < p10:
            key = (s.outcome.workload, s.outcome.size)
            below[key] = below.get(key, 0) + 1
    rows = []
    for row in per_size:
        n = below.get((row["workload"], row["size"]), 0)
        if not n:
            continue
        sessions = row.get("sessions", {})
        rows.append(
            {
                "workload": row["workload"],
                "size": row["size"],
                "below_p10": n,
                "sessions": sessions.get("model", {}).get("sessions"),
                "model_median": sessions.get("model", {}).get("pct_median"),
                "exhaustive_median": sessions.get("exhaustive", {}).get("pct_median"),
                "observed_best_pct_of_true_best": row.get("observed_best_pct_of_true_best"),
            }
        )
    rows.sort(key=lambda r: (-r["below_p10"], r["workload"], r["size"]))
    return {"p10": _r(p10), "below": sum(below.values()), "sizes": rows}


def truth_summary(
    cells: Sequence[Cell],
    outcomes: Sequence[SessionOutcome],
    truth_measurements: Sequence[Measurement],
    *,
    repeats: int = TRUTH_REPEATS,
    session_repeats: int = SESSION_REPEATS,
    near: float = NEAR_BEST,
) -> tuple[dict[str, Any], list[TrueScore]]:
    """results["truth"]: the sessions scored on the truth pass."""
    truth = truth_points(truth_measurements)
    scores = score_sessions(
        cells, outcomes, truth, repeats=repeats, session_repeats=session_repeats
    )
    sessions = cell_sessions(scores)
    per_size = []
    for cell in cells:
        points = truth.get((cell.workload, cell.size), {})
        if not points:
            continue
        best = min(points, key=lambda c: (points[c].runtime_s, c.label()))
        tied = [c for c in points if within_noise(points[c], points[best], repeats)]
        per_size.append(
            {
                "workload": cell.workload,
                "size": cell.size,
                "measured": len(points),
                "true_best": best.label(),
                "observed_best": cell.best_config.label(),
                "observed_best_pct_of_true_best": _r(
                    100.0 * points[best].runtime_s / points[cell.best_config].runtime_s
                )
                if cell.best_config in points
                else None,
                "within_noise_of_true_best": len(tied),
                "sessions": sessions.get((cell.workload, cell.size), {}),
            }
        )
    spreads = sorted(p.spread for pts in truth.values() for p in pts.values())
    return (
        {
            "repeats": repeats,
            "near_best": near,
            "order": "interleaved rounds in a seeded random order (setup/interleave.py)",
            "configurations": sum(len(p) for p in truth.values()),
            "spread_median": _r(statistics.median(spreads), 4) if spreads else None,
            "spread_p90": _r(percentile(spreads, 0.9), 4) if spreads else None,
            "score": "true runtime of the truth pass's best / true runtime of the final "
            "configuration, in %",
            "noise": f"within noise: t_final / t_best - 1 <= {NOISE_Z:g} * sqrt(se_final^2 + "
            f"se_best^2), se = {SE_MEDIAN} * spread / sqrt({repeats}), spread = 1.4826 * MAD / "
            "median of the truth repeats",
            "speedup": "(t_start - t_final) / (t_start - t_best) on true runtimes, over the "
            "sessions whose start was truth-measured and beyond noise of the true best",
            "cost": f"sum over the session's runs of observed runtime x (1 warm-up + "
            f"{session_repeats} repeats), in seconds",
            "table": truth_table(scores),
            "exhaustive_check": exhaustive_check(scores),
            "agreement": pass_agreement(cells, truth),
            "per_size": per_size,
            "model_tail": model_tail(scores, per_size),
        },
        scores,
    )
