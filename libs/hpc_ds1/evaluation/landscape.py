"""The held-out landscape: every configuration of a held-out (workload, size), measured for real.
Every runtime a replayed session sees is one of these measured medians."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence

from hpc_ds1.model.labels import aggregate
from hpc_ds1.model.replay import Cell, Point
from hpc_ds1.model.schema import Measurement
from hpc_ds1.space import Config, ConfigSpace


class EvaluationError(RuntimeError):
    """The evaluation cannot be computed honestly from what was measured."""


SpaceFor = Callable[[str], ConfigSpace]


def build_cells(
    measurements: Iterable[Measurement], space_for: SpaceFor
) -> tuple[list[Cell], list[str]]:
    """Complete cells (every configuration of the space measured, at least one ok) and, in
    words, the (workload, size) pairs left out because they are not."""
    outcomes = aggregate(m.model_copy(update={"held_out": False}) for m in measurements)
    grouped: dict[tuple[str, int], dict[Config, object]] = {}
    for (workload, size, config), outcome in outcomes.items():
        grouped.setdefault((workload, size), {})[config] = outcome
    cells, skipped = [], []
    for (workload, size), found in sorted(grouped.items()):
        wanted = space_for(workload).configs()
        missing = [c for c in wanted if c not in found]
        if missing:
            skipped.append(
                f"{workload} {size}: {len(missing)} of {len(wanted)} configurations not measured"
            )
            continue
        points, failed = {}, set()
        for config in wanted:
            o = outcomes[(workload, size, config)]
            if o.ok and o.runtime_s is not None:
                points[config] = Point(o.runtime_s, o.spread, o.throughput)
            else:
                failed.add(config)
        if not points:
            skipped.append(f"{workload} {size}: no configuration ran successfully")
            continue
        cells.append(Cell(workload, size, points, frozenset(failed)))
    return cells, skipped


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1): a value that was measured, never interpolated."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def nearest_size(size: int, sizes: Sequence[int]) -> int:
    """The trained size closest to `size` on a log scale (problem sizes grow geometrically)."""
    return min(sizes, key=lambda s: (abs(math.log(s / size)), s))


def noise_summary(cells: Sequence[Cell]) -> dict[str, object]:
    """How noisy the landscape is: the ceiling on what any policy can show against its best."""
    spreads = sorted(p.spread or 0.0 for c in cells for p in c.points.values())
    per_size = []
    for c in cells:
        tied = c.tied_with_best()
        per_size.append(
            {
                "workload": c.workload,
                "size": c.size,
                "tied_with_best": len(tied),
                "slowest_tied_pct_of_best": round(min(c.pct_of_best(t) for t in tied), 2),
                "best_spread": round(c.points[c.best_config].spread or 0.0, 4),
            }
        )
    return {
        "spread_median": round(statistics.median(spreads), 4) if spreads else None,
        "spread_p90": round(percentile(spreads, 0.9), 4) if spreads else None,
        "tied_with_best_median": statistics.median(len(c.tied_with_best()) for c in cells)
        if cells
        else None,
        "per_size": per_size,
        "what": "spread: relative run-to-run spread (MAD) of each configuration's repeats; "
        "tied: configurations the best does not beat by more than that noise",
    }
