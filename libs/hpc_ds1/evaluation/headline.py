"""The headline figures of issue 13, all on the truth pass: System 1's picks scored there, the
model against random search and TPE with a bootstrap interval over cells, and the targets.

The cell (one held-out workload and size) is the unit that is resampled: the sessions of one
cell share its landscape, so they are not independent draws."""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from hpc_ds1.space import Config

from .landscape import percentile
from .plan import TRUTH_REPEATS
from .truth import Key, TruePoint, TrueScore, within_noise

BOOTSTRAP_RESAMPLES = 2000
INTERVAL = 0.90
# what System 1's pick is compared with, pick by pick (issue 13: above both of the first two)
SYSTEM1_BASELINES = ("nearest_trained", "rule_of_thumb", "interpolated_transfer")


def _system1_cells(
    system1: Mapping[str, Any], truth: Mapping[Key, Mapping[Config, TruePoint]]
) -> tuple[dict[str, dict[Key, tuple[str, float]]], dict[str, int]]:
    """Per approach, per cell: (the pick's label, its true % of best); and per approach the
    count of picks the truth pass did not measure."""
    picks: dict[str, dict[Key, tuple[str, float]]] = {}
    unscored: dict[str, int] = {}
    for row in system1.get("per_size", []):
        cell = (row["workload"], row["size"])
        points = truth.get(cell, {})
        if not points:
            continue
        by_label = {c.label(): p for c, p in points.items()}
        best = min(p.runtime_s for p in points.values())
        for key, chosen in row.items():
            if not isinstance(chosen, dict) or "config" not in chosen:
                continue
            point = by_label.get(chosen["config"])
            if point is None:
                unscored[key] = unscored.get(key, 0) + 1
                continue
            picks.setdefault(key, {})[cell] = (chosen["config"], 100.0 * best / point.runtime_s)
    return picks, unscored


def system1_truth(
    system1: Mapping[str, Any], truth: Mapping[Key, Mapping[Config, TruePoint]]
) -> list[dict[str, Any]]:
    """Each System 1 approach's picks scored on the truth pass: true runtime of the truth
    pass's best / true runtime of the pick. A pick the truth pass did not measure is counted
    as unscored, never dropped silently."""
    picks, unscored = _system1_cells(system1, truth)
    out = []
    for key in {*picks, *unscored}:
        values = [pct for _, pct in picks.get(key, {}).values()]
        out.append(
            {
                "key": key,
                "median": round(statistics.median(values), 2) if values else None,
                "p10": round(percentile(values, 0.10), 2) if values else None,
                "scored": len(values),
                "unscored": unscored.get(key, 0),
            }
        )
    return sorted(out, key=lambda r: r["key"])


def _interval(values: list[float]) -> list[float]:
    tail = (1.0 - INTERVAL) / 2.0
    return [round(percentile(values, tail), 2), round(percentile(values, 1.0 - tail), 2)]


def system1_versus(
    system1: Mapping[str, Any],
    truth: Mapping[Key, Mapping[Config, TruePoint]],
    mine: str,
    other: str,
    *,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
    repeats: int = TRUTH_REPEATS,
) -> dict[str, Any] | None:
    """System 1's `mine` picks against `other`'s, paired by cell on the truth pass: the
    difference of their median true % of best with a percentile-bootstrap interval (INTERVAL)
    from resampling the cells, and per cell how often the two pick the same configuration, or
    one scores above the other beyond the truth pass's noise (`truth.within_noise` at
    `repeats`). None when they share no scored cell."""
    picks, _ = _system1_cells(system1, truth)
    a, b = picks.get(mine, {}), picks.get(other, {})
    shared = sorted(set(a) & set(b))
    if not shared:
        return None

    def difference(cells: Sequence[Key]) -> float:
        return statistics.median(a[k][1] for k in cells) - statistics.median(b[k][1] for k in cells)

    rng = random.Random(f"system1:{seed}:{mine}:{other}")
    drawn = [
        difference([shared[rng.randrange(len(shared))] for _ in shared]) for _ in range(resamples)
    ]
    different = [k for k in shared if a[k][0] != b[k][0]]
    gaps = {k: a[k][1] - b[k][1] for k in different}
    clear = {k: g for k, g in gaps.items() if _apart(truth[k], a[k][0], b[k][0], repeats)}
    return {
        "approach": mine,
        "other": other,
        "cells": len(shared),
        "median_difference": round(difference(shared), 2),
        "median_interval": _interval(drawn),
        "interval": f"{INTERVAL:.0%} percentile bootstrap over cells, {resamples} resamples",
        "same_pick": len(shared) - len(different),
        "ahead": sum(g > 0 for g in gaps.values()),
        "behind": sum(g < 0 for g in gaps.values()),
        "ahead_beyond_noise": sum(g > 0 for g in clear.values()),
        "behind_beyond_noise": sum(g < 0 for g in clear.values()),
        "mean_gap_where_different": round(statistics.fmean(gaps.values()), 2) if gaps else None,
        "where_different": [
            {
                "workload": k[0],
                "size": k[1],
                mine: a[k][0],
                other: b[k][0],
                "gap": round(gaps[k], 2),
                "beyond_noise": k in clear,
            }
            for k in different
        ],
    }


def _apart(points: Mapping[Config, TruePoint], x: str, y: str, repeats: int) -> bool:
    """Whether the truth pass tells configurations `x` and `y` (labels) apart: the slower is
    not within its noise of the faster."""
    by_label = {c.label(): p for c, p in points.items()}
    slow, fast = sorted((by_label[x], by_label[y]), key=lambda p: -p.runtime_s)
    return not within_noise(slow, fast, repeats)


def figure_interval(
    scores: Sequence[TrueScore],
    policy: str,
    *,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> dict[str, Any] | None:
    """`policy`'s true median and 10th percentile over its sessions, each with a
    percentile-bootstrap interval (INTERVAL) from resampling the cells: how far a target
    missed or met by a point stands from what another draw of the same number of sizes would
    give. None without sessions."""
    cells = _by_cell(scores, policy)
    if not cells:
        return None
    keys = sorted(cells)
    median, p10 = _figures([cells[k] for k in keys])
    rng = random.Random(f"figure:{seed}:{policy}")
    medians, p10s = [], []
    for _ in range(resamples):
        m, p = _figures([cells[keys[rng.randrange(len(keys))]] for _ in keys])
        medians.append(m)
        p10s.append(p)
    return {
        "policy": policy,
        "cells": len(keys),
        "sessions": sum(len(v) for v in cells.values()),
        "median": round(median, 2),
        "median_interval": _interval(medians),
        "p10": round(p10, 2),
        "p10_interval": _interval(p10s),
        "interval": f"{INTERVAL:.0%} percentile bootstrap over cells, {resamples} resamples",
    }


def _by_cell(scores: Sequence[TrueScore], policy: str) -> dict[Key, list[float]]:
    cells: dict[Key, list[float]] = {}
    for s in scores:
        if s.outcome.policy == policy:
            cells.setdefault((s.outcome.workload, s.outcome.size), []).append(s.pct_of_best)
    return cells


def _figures(cells: Sequence[list[float]]) -> tuple[float, float]:
    pooled = [v for values in cells for v in values]
    return statistics.median(pooled), percentile(pooled, 0.10)


def versus(
    scores: Sequence[TrueScore],
    policy: str,
    other: str,
    *,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> dict[str, Any] | None:
    """`policy` minus `other` on the true % of best, median and 10th percentile over their
    sessions, with a percentile-bootstrap interval (INTERVAL) from resampling the cells both
    were scored on. None when they share no cell."""
    mine, theirs = _by_cell(scores, policy), _by_cell(scores, other)
    shared = sorted(set(mine) & set(theirs))
    if not shared:
        return None
    median_a, p10_a = _figures([mine[k] for k in shared])
    median_b, p10_b = _figures([theirs[k] for k in shared])
    rng = random.Random(f"versus:{seed}:{policy}:{other}")
    medians, p10s = [], []
    for _ in range(resamples):
        drawn = [shared[rng.randrange(len(shared))] for _ in shared]
        ma, pa = _figures([mine[k] for k in drawn])
        mb, pb = _figures([theirs[k] for k in drawn])
        medians.append(ma - mb)
        p10s.append(pa - pb)
    tail = (1.0 - INTERVAL) / 2.0

    def interval(values: list[float]) -> list[float]:
        return [round(percentile(values, tail), 2), round(percentile(values, 1.0 - tail), 2)]

    median_interval, p10_interval = interval(medians), interval(p10s)
    return {
        "policy": policy,
        "other": other,
        "cells": len(shared),
        "median_difference": round(median_a - median_b, 2),
        "median_interval": median_interval,
        "p10_difference": round(p10_a - p10_b, 2),
        "p10_interval": p10_interval,
        "interval": f"{INTERVAL:.0%} percentile bootstrap over cells, {resamples} resamples",
        "above_with_interval": median_interval[0] > 0 and p10_interval[0] > 0,
    }


def target_row(name: str, value: Any, op: str, goal: Any, note: str = "") -> dict[str, Any]:
    """`note`: how far the figure stands from another draw of the same cells (its interval),
    where there is one."""
    met = None
    if value is not None and goal is not None:
        met = {">=": value >= goal, "<=": value <= goal, ">": value > goal}[op]
    row = {"target": name, "value": value, "goal": f"{op} {goal}", "met": met}
    return {**row, "note": note} if note else row


def interval_note(figure: Mapping[str, Any] | None, which: str) -> str:
    """ "90% interval [a, b] over 16 cells" for `which` ("median" or "p10") of a
    `figure_interval`."""
    if not figure:
        return ""
    low, high = figure[f"{which}_interval"]
    return f"{INTERVAL:.0%} interval [{low}, {high}] over {figure['cells']} cells"


def ceiling_note(exhaustive: Mapping[str, Any] | None, which: str) -> str:
    """What exhaustive search reaches on the same truth pass ("pct_median" or "pct_p10"). It
    runs every configuration and ends on the observed pass's best, so it shows how far the
    observed pass's noise alone keeps a session from the true best."""
    if not exhaustive or exhaustive.get(which) is None:
        return ""
    return (
        f"exhaustive search {exhaustive[which]} in {exhaustive['runs_median']:g} runs "
        "on the same truth pass"
    )


def _joined(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def versus_note(v: Mapping[str, Any] | None) -> str:
    """ "median +4.96 [+0.68, +10.91]; p10 +11.54 [-0.34, +18.37]" of a `versus`."""
    if not v or "median_difference" not in v:
        return ""
    return "; ".join(
        f"{which} {v[f'{which}_difference']:+} "
        f"[{v[f'{which}_interval'][0]:+}, {v[f'{which}_interval'][1]:+}]"
        for which in ("median", "p10")
    )


def _system1_note(v: Mapping[str, Any] | None) -> str:
    if not v:
        return ""
    low, high = v["median_interval"]
    return (
        f"{v['other']}: {v['median_difference']:+} [{low:+}, {high:+}], same pick at "
        f"{v['same_pick']} of {v['cells']} sizes, ahead at {v['ahead']} "
        f"({v['ahead_beyond_noise']} beyond noise), behind at {v['behind']} "
        f"({v['behind_beyond_noise']} beyond noise)"
    )


def live_targets(
    live: Mapping[str, Any] | None, exhaustive: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The session targets again for the sessions `evaluate --live` ran for real from its
    seeded starts (every run a launch, as `tune` makes it), where there are any: what a user
    gets, where the replayed rows model each run from the observed pass. `exhaustive`: its
    truth-table row, for the score rows' notes."""
    row = next((r for r in (live or {}).get("table", []) if r["policy"] == "model_live"), None)
    if row is None:
        return []
    seeded, spread = row["live"], row.get("live_interval")
    name = f"live model sessions ({seeded['sessions']}, seeded starts, every run real)"
    return [
        target_row(
            f"{name}: true median % of best",
            seeded["pct_median"],
            ">=",
            97.0,
            _joined(interval_note(spread, "median"), ceiling_note(exhaustive, "pct_median")),
        ),
        target_row(
            f"{name}: true 10th percentile % of best",
            seeded["pct_p10"],
            ">=",
            92.0,
            _joined(interval_note(spread, "p10"), ceiling_note(exhaustive, "pct_p10")),
        ),
        target_row(f"{name}: median real runs", seeded["runs_median"], "<=", 5),
    ]


# what the model's sessions are compared with on the truth pass: the cold searches, then the
# baselines given the model's information (issue 43, item 4)
ECE_OF = {"not_slower": "ece_not_slower", "good": "ece_good", "unattended": "ece_unattended"}
VERSUS = ("random", "optuna_tpe", "optuna_tpe_warm", "lookup", "start_then_lookup")


def truth_targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Issue 13's table, each figure from the truth pass (System 1 too); the guard's rows are
    the caller's."""
    truth = results["truth"]
    by = {r["policy"]: r for r in truth["table"]}
    model, exhaustive = by.get("model", {}), by.get("exhaustive")
    s1 = {r["key"]: r for r in truth.get("system1", [])}
    s1_model = s1.get("model", {}).get("median")
    baselines = [
        s1.get(k, {}).get("median") for k in ("rule_of_thumb", "nearest_trained") if k in s1
    ]
    cal = results["calibration"]
    target = str(cal.get("target") or "not_slower")  # what the model's confidence states
    auto_share = round(cal["auto_moves"] / cal["decisions"], 4) if cal.get("decisions") else None
    spread = truth.get("model_interval")
    rows = [
        target_row(
            "model sessions: true median % of best",
            model.get("pct_median"),
            ">=",
            97.0,
            _joined(interval_note(spread, "median"), ceiling_note(exhaustive, "pct_median")),
        ),
        target_row(
            "model sessions: true 10th percentile % of best",
            model.get("pct_p10"),
            ">=",
            92.0,
            _joined(interval_note(spread, "p10"), ceiling_note(exhaustive, "pct_p10")),
        ),
        target_row("model sessions: median real runs", model.get("runs_median"), "<=", 5),
    ]
    rows += live_targets(results.get("live"), exhaustive)
    for other in VERSUS:
        if other not in by and other not in truth.get("versus", {}):
            continue  # an evaluation from before the equal-information baselines
        against = truth.get("versus", {}).get(other)
        rows.append(
            target_row(
                f"model above {other} on median and p10, bootstrap interval excluding 0",
                None if against is None else against["above_with_interval"],
                ">=",
                True,
                versus_note(against),
            )
        )
    rows += [
        target_row("System 1: true median % of best with 0 runs", s1_model, ">=", 95.0),
        target_row(
            "System 1 above rule of thumb and nearest trained size (true median)",
            None
            if s1_model is None or None in baselines or not baselines
            else all(s1_model > b for b in baselines),
            ">=",
            True,
            _joined(
                *(
                    _system1_note(truth.get("system1_versus", {}).get(k))
                    for k in ("nearest_trained", "rule_of_thumb")
                )
            ),
        ),
        target_row("held-out decisions that run automatically", auto_share, ">=", 0.30),
        target_row("automatic decisions not slower", cal.get("auto_not_slower"), ">=", 0.97),
        target_row(
            f"calibration error (ECE) on {target.replace('_', ' ')}",
            cal.get(ECE_OF.get(target, "ece_not_slower")),
            "<=",
            0.05,
        ),
    ]
    return rows
