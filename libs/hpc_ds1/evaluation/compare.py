"""Policies compared offline on the same recorded landscapes: the old and the new keep rule,
with and without transfer, scored on the truth pass. Nothing is measured; a race's re-runs are
seeded (model.replay.rerun), so a comparison is deterministic for its seed.

Every variant replays every start of every development cell, and is scored on the truth pass
where its final configuration was re-measured (with `evaluate --truth-all`, everywhere); what
could not be scored is counted, never dropped silently."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpc_ds1.model import Measurement, Model, aggregate, replay
from hpc_ds1.model.replay import Cell, Point
from hpc_ds1.model.transfer import BANDWIDTHS, WEIGHTS, Table, pick, relative_table
from hpc_ds1.runner.keep import DEFAULT_RULE, OLD_RULE, KeepRule
from hpc_ds1.space import ConfigSpace
from hpc_ds1.tuning.session import PICK_MIN_GAIN

from . import policies as pol
from .landscape import build_cells, nearest_size, percentile
from .run import _trained_best, _transfer_session, training_of
from .truth import TRUTH_REPEATS, Key, TruePoint, split_passes, truth_points, within_noise

RULES: dict[str, KeepRule] = {
    "old": OLD_RULE,
    "new": DEFAULT_RULE,
    "new, race from P>=0.7": replace(DEFAULT_RULE, race_from=0.7),
    "new, at most 2 pairs": replace(DEFAULT_RULE, max_pairs=2),
    "new, at most 1 pair": replace(DEFAULT_RULE, max_pairs=1),
    "new, 2 pairs a session": replace(DEFAULT_RULE, session_pairs=2),
    "new, 1 pair a session": replace(DEFAULT_RULE, session_pairs=1),
    "new, no race": replace(DEFAULT_RULE, max_pairs=0),
}


PICK_GAINS = (0.0, 0.05, 0.10, 0.20)


@dataclass(frozen=True)
class Variant:
    name: str
    rule: KeepRule
    transfer: bool  # start from the interpolated-transfer pick instead of every start
    recommend: bool = False  # start from the model's own recommend (what `tune` does now)
    weight: float | None = None  # recommend with this transfer weight instead of the file's
    explore_first: bool = False  # never stop before a move was tried (choose_move)
    # System 1's configuration once where the session would end, as the coordinator does
    # (model.replay.model_session); False: the sessions before docs/evaluation.md section 16
    pick: bool = True
    pick_after_misses: bool = True  # ... two misses in a row included
    pick_gain: float | None = PICK_MIN_GAIN  # ... where predicted this much faster (None: any)


def default_variants() -> list[Variant]:
    out = [Variant(f"model, {name} keep rule", rule, False) for name, rule in RULES.items()]
    out += [
        Variant("model from interpolated transfer, old keep rule", OLD_RULE, True),
        Variant("model from interpolated transfer, new keep rule", DEFAULT_RULE, True),
        Variant("model from its recommend, new keep rule", DEFAULT_RULE, False, True),
        Variant("model from its recommend, explore first", DEFAULT_RULE, False, True, None, True),
        Variant("model from recommend at w=1", DEFAULT_RULE, False, True, 1.0),
        Variant("model from recommend at w=1, explore first", DEFAULT_RULE, False, True, 1.0, True),
        Variant("model, explore first", DEFAULT_RULE, False, explore_first=True),
        Variant("model, no PICK (before section 16)", DEFAULT_RULE, False, pick=False),
        Variant(
            "model from its recommend, no PICK", DEFAULT_RULE, False, recommend=True, pick=False
        ),
        Variant(
            "model, PICK instead of STOP only, ungated",
            DEFAULT_RULE,
            False,
            pick_after_misses=False,
            pick_gain=None,
        ),
        Variant("model, PICK at any end, ungated", DEFAULT_RULE, False, pick_gain=None),
        *(
            Variant(
                f"model, PICK at any end, predicted >= {gain:.0%} faster",
                DEFAULT_RULE,
                False,
                pick_gain=gain,
            )
            for gain in PICK_GAINS
            if gain != PICK_MIN_GAIN
        ),
    ]
    return out


def development_cells(
    model: Model, measurements: Sequence[Measurement], final: set[Key]
) -> list[Cell]:
    """The held-out cells, the final set left out (no development step looks at it)."""
    held = [
        m
        for m in measurements
        if m.held_out and m.workload in model.workloads and (m.workload, m.size) not in final
    ]
    cells, _ = build_cells(held, model.space_for)
    return cells


def simulated_cells(
    cells: Sequence[Cell], truth: Mapping[Key, Mapping[Any, TruePoint]], sigma: float, seed: int
) -> list[Cell]:
    """The development cells as a steadier machine would observe them: every configuration's
    observed runtime is its truth-pass median times exp(sigma * z) (z seeded per cell and
    configuration) with spread sigma, so sessions see the recorded landscape through a chosen
    noise and are scored on the same truth pass. A cell the truth pass did not measure whole
    is left out: its landscape is not known."""
    out = []
    for cell in cells:
        points = truth.get((cell.workload, cell.size), {})
        if any(c not in points for c in cell.points):
            continue
        drawn = {}
        for config, point in cell.points.items():
            true = points[config].runtime_s
            z = random.Random(f"sim:{seed}:{cell.workload}:{cell.size}:{config.label()}").gauss(
                0.0, 1.0
            )
            runtime = true * math.exp(sigma * z)
            throughput = (
                None if point.throughput is None else point.throughput * point.runtime_s / runtime
            )
            drawn[config] = Point(runtime, sigma, throughput)
        out.append(Cell(cell.workload, cell.size, drawn, cell.failed))
    return out


def _row(
    name: str,
    outcomes: Sequence[replay.SessionOutcome],
    truth: Mapping[Key, Mapping[Any, TruePoint]],
    repeats: int,
) -> dict[str, Any]:
    pcts, tied, unscored = [], [], 0
    for o in outcomes:
        points = truth.get((o.workload, o.size), {})
        if o.final not in points:
            unscored += 1
            continue
        best = min(points.values(), key=lambda p: p.runtime_s)
        pcts.append(100.0 * best.runtime_s / points[o.final].runtime_s)
        tied.append(within_noise(points[o.final], best, repeats))
    runs = [o.runs for o in outcomes]
    row: dict[str, Any] = {
        "variant": name,
        "sessions": len(outcomes),
        "unscored": unscored,
        "runs_median": statistics.median(runs),
        "runs_mean": round(statistics.fmean(runs), 2),
        "observed_pct_median": round(statistics.median(o.pct_of_best for o in outcomes), 2),
    }
    if pcts:
        row |= {
            "true_pct_median": round(statistics.median(pcts), 2),
            "true_pct_p10": round(percentile(pcts, 0.10), 2),
            "true_pct_mean": round(statistics.fmean(pcts), 2),
            "within_noise_share": round(sum(tied) / len(tied), 4),
        }
    return row


def paired_difference(
    a: Sequence[replay.SessionOutcome],
    b: Sequence[replay.SessionOutcome],
    truth: Mapping[Key, Mapping[Any, TruePoint]],
    seed: int,
    draws: int = 2000,
) -> dict[str, Any]:
    """Mean true % of best of b minus a, per cell, with a bootstrap 90 % interval over cells
    (sessions of one cell share its landscape, so the cell is the unit resampled)."""

    def per_cell(outcomes: Sequence[replay.SessionOutcome]) -> dict[Key, float]:
        got: dict[Key, list[float]] = {}
        for o in outcomes:
            points = truth.get((o.workload, o.size), {})
            if o.final in points:
                best = min(p.runtime_s for p in points.values())
                got.setdefault((o.workload, o.size), []).append(
                    100.0 * best / points[o.final].runtime_s
                )
        return {k: statistics.fmean(v) for k, v in got.items()}

    pa, pb = per_cell(a), per_cell(b)
    keys = sorted(set(pa) & set(pb))
    if not keys:
        return {"cells": 0}
    diffs = [pb[k] - pa[k] for k in keys]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choice(diffs) for _ in diffs) for _ in range(draws))
    return {
        "cells": len(keys),
        "mean_difference": round(statistics.fmean(diffs), 2),
        "interval_90": [round(percentile(means, 0.05), 2), round(percentile(means, 0.95), 2)],
        "cells_better": sum(d > 1e-9 for d in diffs),
        "cells_worse": sum(d < -1e-9 for d in diffs),
    }


def _sessions(
    model: Model, cells: Sequence[Cell], variant: Variant, seed: int, transfer: Table
) -> list[replay.SessionOutcome]:
    out = []
    recommender = model
    if variant.weight is not None:
        recommender = model.reweighted({"inside": variant.weight, "outside": variant.weight})
    for cell in cells:
        space = model.space_for(cell.workload)
        system1 = pol.system1_answer(recommender, cell, space, model.thresholds)
        if variant.transfer:
            o = _transfer_session(
                model,
                cell,
                space,
                model.thresholds,
                variant.rule,
                seed,
                transfer,
                explore_first=variant.explore_first,
                system1=system1 if variant.pick else None,
            )
            out += [o] * len(cell.points) if o is not None else []  # one per start, as run.py
            continue
        starts = sorted(cell.points, key=lambda c: c.label())
        if variant.recommend:
            start = recommender.recommend(cell.workload, cell.size, space=space).config
            # a start that failed at this size is not replayable
            starts = [start] if start in cell.points else []
        for start in starts:
            o = replay.model_session(
                model,
                cell,
                start,
                space,
                model.thresholds,
                rule=variant.rule,
                seed=seed,
                explore_first=variant.explore_first,
                system1=system1 if variant.pick else None,
                pick_after_misses=variant.pick_after_misses,
                pick_gain=variant.pick_gain,
            )
            # one per start: a recommend session stands for every start, as the transfer row
            out += [o] * (len(cell.points) if variant.recommend else 1)
    return out


def _system1(
    model: Model,
    cells: Sequence[Cell],
    training: Sequence[Measurement],
    transfer: Table,
    truth: Mapping[Key, Mapping[Any, TruePoint]],
) -> list[dict[str, Any]]:
    trained_best = _trained_best(training)
    picks: dict[str, list[float]] = {"model": [], "nearest_trained": [], "interpolated": []}
    for cell, points, best, space in _truth_cells(model, cells, truth):
        trained = sorted(s for w, s in trained_best if w == cell.workload)
        chosen = {
            "model": model.recommend(cell.workload, cell.size, space=space).config,
            "nearest_trained": trained_best[(cell.workload, nearest_size(cell.size, trained))],
            "interpolated": pick(
                transfer, cell.workload, cell.size, "interpolated", space.configs()
            ),
        }
        for key, config in chosen.items():
            picks[key].append(_pick_pct(cell, points, best, config))
    return [{"approach": key, **_summary(v)} for key, v in picks.items() if v]


def _truth_cells(
    model: Model, cells: Sequence[Cell], truth: Mapping[Key, Mapping[Any, TruePoint]]
) -> Iterator[tuple[Cell, Mapping[Any, TruePoint], float, ConfigSpace]]:
    """Each cell the truth pass measured: its true points, their best runtime, its space."""
    for cell in cells:
        points = truth.get((cell.workload, cell.size), {})
        if points:
            best = min(p.runtime_s for p in points.values())
            yield cell, points, best, model.space_for(cell.workload)


def _pick_pct(cell: Cell, points: Mapping[Any, TruePoint], best: float, config: Any) -> float:
    """A System 1 pick's % of the best on the truth pass; a pick the truth pass did not
    re-measure is scored on the observed pass, a pick that failed there is 0."""
    if config in points:
        return 100.0 * best / points[config].runtime_s
    if config in cell.points:
        return 100.0 * cell.best_runtime_s / cell.points[config].runtime_s
    return 0.0


def _summary(values: Sequence[float]) -> dict[str, Any]:
    return {
        "true_pct_median": round(statistics.median(values), 2),
        "true_pct_p10": round(percentile(values, 0.10), 2),
        "true_pct_mean": round(statistics.fmean(values), 2),
        "sizes": len(values),
    }


def system1_by_weight(
    model: Model, cells: Sequence[Cell], truth: Mapping[Key, Mapping[Any, TruePoint]]
) -> list[dict[str, Any]]:
    """The model's `recommend` with every transfer weight of WEIGHTS (the same weight inside
    and outside the trained range), scored on the truth pass: what a development step looks
    at to judge the weight the model file carries."""
    rows = []
    for weight in WEIGHTS:
        got = _recommended(model.reweighted({"inside": weight, "outside": weight}), cells, truth)
        if got:
            rows.append({"weight": weight, **_summary(got)})
    return rows


def _recommended(
    model: Model, cells: Sequence[Cell], truth: Mapping[Key, Mapping[Any, TruePoint]]
) -> list[float]:
    """`model`'s recommend at every cell the truth pass measured, as % of the true best."""
    got = []
    for cell, points, best, space in _truth_cells(model, cells, truth):
        config = model.recommend(cell.workload, cell.size, space=space).config
        got.append(_pick_pct(cell, points, best, config))
    return got


def system1_by_bandwidth(
    model: Model, cells: Sequence[Cell], truth: Mapping[Key, Mapping[Any, TruePoint]]
) -> list[dict[str, Any]]:
    """The model's `recommend` with the transfer table smoothed at every bandwidth of
    BANDWIDTHS (the model file's weights), scored on the truth pass: what a development step
    looks at to judge the smoothing the model file carries."""
    rows = []
    for bandwidth in BANDWIDTHS:
        got = _recommended(model.with_bandwidth(bandwidth), cells, truth)
        if got:
            rows.append({"bandwidth": bandwidth, **_summary(got)})
    return rows


def compare(
    model: Model,
    measurements: Sequence[Measurement],
    truth_measurements: Sequence[Measurement],
    *,
    final: set[Key],
    seeds: Sequence[int] = (0,),
    variants: Sequence[Variant] | None = None,
    repeats: int = TRUTH_REPEATS,
    simulate_sigma: float | None = None,
) -> dict[str, Any]:
    """Every variant on the development cells, for every seed (the seed draws a race's
    re-runs), scored on the truth pass. With `simulate_sigma`, the sessions observe the truth
    pass through that noise instead of the observed pass (`simulated_cells`): what a steadier
    machine would show on the same landscapes."""
    training = training_of(model, measurements)
    cells = development_cells(model, measurements, final)
    if not cells:
        raise ValueError("no complete development cell in these measurements")
    truth = truth_points(m for m in truth_measurements if (m.workload, m.size) not in final)
    transfer = relative_table(aggregate(training))
    variants = list(variants or default_variants())
    by_seed: dict[int, list[dict[str, Any]]] = {}
    differences: dict[int, dict[str, Any]] = {}
    for seed in seeds:
        seen = (
            cells if simulate_sigma is None else simulated_cells(cells, truth, simulate_sigma, seed)
        )
        sessions = {v.name: _sessions(model, seen, v, seed, transfer) for v in variants}
        by_seed[seed] = [_row(v.name, sessions[v.name], truth, repeats) for v in variants]
        base = sessions[variants[0].name]
        differences[seed] = {
            name: paired_difference(base, got, truth, seed)
            for name, got in sessions.items()
            if name != variants[0].name
        }
    truth_cover = {
        f"{c.workload} {c.size}": f"{len(truth.get((c.workload, c.size), {}))}/{len(c.points)}"
        for c in cells
    }
    return {
        "model_version": model.version,
        "seeds": list(seeds),
        "simulate_sigma": simulate_sigma,
        "cells": [f"{c.workload} {c.size}" for c in cells],
        "truth_measured": truth_cover,
        "table": by_seed,
        "difference_from_first": differences,
        "system1": _system1(model, cells, training, transfer, truth),
        "system1_by_weight": system1_by_weight(model, cells, truth),
        "system1_by_bandwidth": system1_by_bandwidth(model, cells, truth),
        "transfer_weights": model.transfer_weights,
        "transfer_bandwidth": model.transfer_bandwidth,
    }


def cached_landscape(
    path: Path, home: Path
) -> tuple[Path, Model, list[Measurement], list[Measurement]]:
    """The home, its model, and the observed and truth-pass measurements of a cache that
    `benchmarks/compare_policies.py --cache` wrote."""
    import orjson

    from hpc_ds1.api import load

    rows = orjson.loads(path.read_bytes())
    observed, truth = split_passes(rows)
    return Path(home), load(home, log_decisions=False), observed, truth
