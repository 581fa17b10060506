"""Transfer from the sizes it knows: a configuration for an unseen size, from the measured
relative runtimes of the trained sizes of the same workload.

A configuration's relative runtime at a size is its measured runtime over the size's geometric
mean (log r = log t - mean log t over the configurations that ran there), so sizes of very
different runtimes compare. For an asked size:

- "nearest": the relative runtimes of the trained size closest on a log scale;
- "interpolated": those of the trained sizes on either side, linear in log size (outside the
  trained range, the nearest end's);

and the pick is the argmin. A configuration must have run at every size used; one that failed
at either neighbour is never picked."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from typing import Literal

from hpc_ds1.space import Config

from .labels import Outcome, StateKey

Table = dict[str, dict[int, dict[Config, float]]]  # workload -> size -> config -> log relative
How = Literal["nearest", "interpolated"]


def relative_table(outcomes: Mapping[StateKey, Outcome]) -> Table:
    """Log relative runtimes of every ok configuration, per (workload, size)."""
    raw: dict[str, dict[int, dict[Config, float]]] = {}
    for (workload, size, config), o in outcomes.items():
        if o.ok and o.runtime_s is not None and o.runtime_s > 0:
            raw.setdefault(workload, {}).setdefault(size, {})[config] = math.log(o.runtime_s)
    table: Table = {}
    for workload, sizes in raw.items():
        for size, logs in sizes.items():
            mean = sum(logs.values()) / len(logs)
            table.setdefault(workload, {})[size] = {c: v - mean for c, v in logs.items()}
    return table


def neighbours_of(size: int, sizes: Iterable[int]) -> list[tuple[int, float]]:
    """The trained sizes used for `size`, each with its weight (weights sum to 1)."""
    known = sorted(set(sizes))
    if not known:
        raise ValueError("no trained size to transfer from")
    if size <= known[0]:
        return [(known[0], 1.0)]
    if size >= known[-1]:
        return [(known[-1], 1.0)]
    i = bisect.bisect_left(known, size)
    lo, hi = known[i - 1], known[i]
    if hi == size:
        return [(hi, 1.0)]
    w = math.log(size / lo) / math.log(hi / lo)
    return [(lo, 1.0 - w), (hi, w)]


def predict(
    table: Table, workload: str, size: int, how: How = "interpolated"
) -> dict[Config, float]:
    """Predicted log relative runtime at `size` of every configuration that ran at every size
    used."""
    sizes = table.get(workload)
    if not sizes:
        raise ValueError(
            f"no trained size of {workload!r} to transfer from; known: {sorted(table)}"
        )
    used = neighbours_of(size, sizes)
    if how == "nearest":
        near = min(sizes, key=lambda s: (abs(math.log(s / size)), s))
        used = [(near, 1.0)]
    elif how != "interpolated":
        raise ValueError(f"transfer {how!r}: accepted are 'nearest' and 'interpolated'")
    common = set.intersection(*(set(sizes[s]) for s, _ in used))
    return {c: sum(w * sizes[s][c] for s, w in used) for c in common}


def pick(
    table: Table,
    workload: str,
    size: int,
    how: How = "interpolated",
    allowed: Iterable[Config] | None = None,
) -> Config | None:
    """The configuration with the lowest predicted relative runtime (ties: by label); None when
    no allowed configuration ran at every size used."""
    scores = predict(table, workload, size, how)
    if allowed is not None:
        keep = set(allowed)
        scores = {c: v for c, v in scores.items() if c in keep}
    if not scores:
        return None
    return min(scores, key=lambda c: (scores[c], c.label()))
