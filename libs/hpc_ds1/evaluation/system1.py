"""System 1: a whole configuration chosen before anything runs, scored on the landscape."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from hpc_ds1.model import Model, Thresholds
from hpc_ds1.model.replay import Cell
from hpc_ds1.model.transfer import Table, pick
from hpc_ds1.space import Config

from .landscape import SpaceFor, nearest_size, percentile

APPROACHES = {
    "model": "the model's recommendation",
    "default": "default (1 rank, 1 thread, default tile)",
    "rule_of_thumb": "rule of thumb (1 rank, threads = cores)",
    "nearest_trained": "best configuration of the nearest trained size",
    "interpolated_transfer": "interpolated transfer (relative runtimes of the trained sizes on "
    "either side, in log size)",
    "exhaustive": "exhaustive search (reference)",
}


def _pcts(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "p10": round(percentile(values, 0.10), 2),
    }


def system1(
    model: Model,
    cells: Sequence[Cell],
    trained_best: Mapping[tuple[str, int], Config],
    default_tile: Mapping[str, int],
    space_for: SpaceFor,
    thresholds: Thresholds,
    transfer: Table | None = None,
) -> dict[str, Any]:
    """`trained_best`: (workload, trained size) -> its fastest measured configuration;
    `transfer`: the trained sizes' relative runtimes (model.transfer)."""
    picks: dict[str, list[float]] = {k: [] for k in APPROACHES}
    runs: dict[str, int] = dict.fromkeys(APPROACHES, 0)
    per_cell = []
    modes: dict[str, int] = {}
    for cell in cells:
        space = space_for(cell.workload)
        tile = default_tile[cell.workload]
        rec = model.recommend(cell.workload, cell.size, space=space, thresholds=thresholds)
        modes[rec.mode] = modes.get(rec.mode, 0) + 1
        trained = sorted(s for w, s in trained_best if w == cell.workload)
        chosen = {
            "model": rec.config,
            "default": Config(ranks=1, threads=1, tile=tile, block=space.default_block),
            "rule_of_thumb": space.default(tile),
            "exhaustive": cell.best_config,
        }
        if trained:
            chosen["nearest_trained"] = trained_best[
                (cell.workload, nearest_size(cell.size, trained))
            ]
        if transfer and cell.workload in transfer:
            moved = pick(transfer, cell.workload, cell.size, "interpolated", space.configs())
            if moved is not None:
                chosen["interpolated_transfer"] = moved
        row: dict[str, Any] = {"workload": cell.workload, "size": cell.size}
        for key, config in chosen.items():
            picks[key].append(cell.pct_of_best(config))
            row[key] = {"config": config.label(), "pct_of_best": round(cell.pct_of_best(config), 2)}
        runs["exhaustive"] = max(runs["exhaustive"], len(space.configs()))
        per_cell.append(row)
    table = [
        {"approach": label, "key": key, **_pcts(picks[key]), "real_runs": runs[key]}
        for key, label in APPROACHES.items()
        if picks[key]
    ]
    return {"table": table, "per_size": per_cell, "model_modes": modes}
