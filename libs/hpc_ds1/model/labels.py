"""The right move for each measured state: the neighbour with the lowest measured runtime, or
STOP when none beats the current configuration by more than the measured noise."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from hpc_ds1.knobs import Knob, Value
from hpc_ds1.model.schema import Measurement
from hpc_ds1.runner.noise import is_faster
from hpc_ds1.space import STOP, Config, ConfigSpace, neighbours

StateKey = tuple[str, int, Config]


@dataclass(frozen=True)
class Outcome:
    """All runs of one (workload, size, config) folded together."""

    ok: bool
    runtime_s: float | None  # median over the ok runs
    spread: float | None  # the largest spread among them
    throughput: float | None


def aggregate(measurements: Iterable[Measurement]) -> dict[StateKey, Outcome]:
    """Fold repeated measurements; held-out rows are left out. A configuration counts as ok when
    any of its runs was ok."""
    runs: dict[StateKey, list[Measurement]] = {}
    for m in measurements:
        if m.held_out:
            continue
        runs.setdefault((m.workload, m.size, m.as_config()), []).append(m)
    out: dict[StateKey, Outcome] = {}
    for key, group in runs.items():
        good = [m for m in group if m.ok]
        if not good:
            out[key] = Outcome(False, None, None, None)
            continue
        spreads = [m.spread for m in good if m.spread is not None]
        tputs = [m.throughput for m in good if m.throughput is not None]
        out[key] = Outcome(
            True,
            statistics.median(m.runtime_s for m in good if m.runtime_s is not None),
            max(spreads) if spreads else None,
            statistics.median(tputs) if tputs else None,
        )
    return out


def measured_space(keys: Iterable[StateKey], workload: str) -> ConfigSpace:
    """The space spanned by what was measured for `workload` (pure: no hardware, no registry)."""
    configs = [c for w, _, c in keys if w == workload]
    if not configs:
        raise ValueError(f"nothing was measured for {workload!r}")
    return ConfigSpace(
        knobs=_measured_knobs(configs),
        ranks=tuple(sorted({c.ranks for c in configs})),
        threads=tuple(sorted({c.threads for c in configs})),
        tiles=tuple(sorted({c.tile for c in configs})),
        blocks=tuple(sorted({c.block for c in configs})),
        gpus=max((c.ranks for c in configs if c.gpu), default=0),
        max_workers=max(c.ranks * c.threads for c in configs),
    )


def _measured_knobs(configs: list[Config]) -> tuple[Knob, ...]:
    """A workload's own knobs over the values measured: numbers ordered, words categories."""
    values: dict[str, set[Value]] = {}
    for c in configs:
        for name, value in c.knobs:
            values.setdefault(name, set()).add(value)
    out = []
    for name, found in sorted(values.items()):
        if all(isinstance(v, bool) for v in found):
            out.append(Knob(name, "bool", (False, True), min(found)))
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in found):
            ordered = tuple(sorted(found))  # type: ignore[type-var]
            out.append(Knob(name, "int", ordered, ordered[0]))
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in found):
            ordered = tuple(sorted(found))  # type: ignore[type-var]
            out.append(Knob(name, "ordered", ordered, ordered[0]))
        else:
            words = tuple(sorted(found, key=str))
            out.append(Knob(name, "category", words, words[0]))
    return tuple(out)


SpaceFor = Callable[[str], ConfigSpace]


def label_outcomes(
    outcomes: Mapping[StateKey, Outcome], space_for: SpaceFor | None = None
) -> dict[StateKey, str]:
    spaces: dict[str, ConfigSpace] = {}

    def space(workload: str) -> ConfigSpace:
        if workload not in spaces:
            spaces[workload] = (
                space_for(workload) if space_for else measured_space(outcomes, workload)
            )
        return spaces[workload]

    labels: dict[StateKey, str] = {}
    for (workload, size, config), here in outcomes.items():
        if not here.ok or here.runtime_s is None:
            continue  # a failed state has no right move to learn
        best_move, best = STOP, None
        for move, nxt in neighbours(config, space(workload)).items():
            there = outcomes.get((workload, size, nxt))
            if there is None or not there.ok or there.runtime_s is None:
                continue  # unmeasured is unknown; failed is worse than any ok configuration
            if best is None or there.runtime_s < (best.runtime_s or 0.0):
                best_move, best = move, there
        if (
            best is not None
            and best.runtime_s is not None
            and is_faster(best.runtime_s, best.spread, here.runtime_s, here.spread)
        ):
            labels[(workload, size, config)] = best_move
        else:
            labels[(workload, size, config)] = STOP
    return labels


def label_moves(
    measurements: Iterable[Measurement], space_for: SpaceFor | None = None
) -> dict[StateKey, str]:
    """(workload, size, config) -> the right move, for every ok, not held-out, measured state.

    Neighbours come from `space_for(workload)` when given, else from the measured space."""
    return label_outcomes(aggregate(measurements), space_for)
