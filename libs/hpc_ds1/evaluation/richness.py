"""How much a knob adds to a space, on a truth pass: per held-out size, the share of the
configurations within noise of the true best (few: a space with something to learn), and how much
faster the best is than the best of the space without the knob (what the knob is worth)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hpc_ds1.model.schema import Measurement
from hpc_ds1.space import Config

from .truth import TRUTH_REPEATS, TruePoint, truth_points, within_noise

Subspace = Callable[[Config], bool]


def without_block(config: Config) -> bool:
    """The space before the block was a knob: block 0."""
    return config.block == 0


def _best(points: Mapping[Config, TruePoint]) -> Config:
    return min(points, key=lambda c: (points[c].runtime_s, c.label()))


def richness(
    truth: Iterable[Measurement],
    *,
    subspace: Subspace = without_block,
    repeats: int = TRUTH_REPEATS,
) -> dict[str, Any]:
    """Per (workload, size) of a truth pass that measured every configuration, and pooled per
    workload: the share within noise of the true best in the whole space and in `subspace`, and
    the whole space's best speed-up over the subspace's best (t_sub_best / t_best)."""
    rows: list[dict[str, Any]] = []
    for (workload, size), points in sorted(truth_points(truth).items()):
        sub = {c: p for c, p in points.items() if subspace(c)}
        if not sub or len(sub) == len(points):
            continue
        best, sub_best = _best(points), _best(sub)
        tied = sum(within_noise(p, points[best], repeats) for p in points.values())
        sub_tied = sum(within_noise(p, sub[sub_best], repeats) for p in sub.values())
        rows.append(
            {
                "workload": workload,
                "size": size,
                "configurations": len(points),
                "within_noise_share": round(tied / len(points), 4),
                "subspace_configurations": len(sub),
                "subspace_within_noise_share": round(sub_tied / len(sub), 4),
                "best": best.label(),
                "subspace_best": sub_best.label(),
                "speedup_over_subspace": round(sub[sub_best].runtime_s / points[best].runtime_s, 4),
                "best_beyond_noise_of_subspace": not within_noise(
                    sub[sub_best], points[best], repeats
                ),
            }
        )
    pooled: dict[str, Any] = {}
    for workload in sorted({r["workload"] for r in rows}):
        mine = [r for r in rows if r["workload"] == workload]
        speedups = [r["speedup_over_subspace"] for r in mine]
        pooled[workload] = {
            "sizes": len(mine),
            "within_noise_share_median": statistics.median(r["within_noise_share"] for r in mine),
            "subspace_within_noise_share_median": statistics.median(
                r["subspace_within_noise_share"] for r in mine
            ),
            "speedup_over_subspace_median": round(statistics.median(speedups), 4),
            "speedup_over_subspace_min": round(min(speedups), 4),
            "speedup_over_subspace_max": round(max(speedups), 4),
            "sizes_best_beyond_noise_of_subspace": sum(
                r["best_beyond_noise_of_subspace"] for r in mine
            ),
        }
    return {"per_size": rows, "per_workload": pooled, "repeats": repeats}
