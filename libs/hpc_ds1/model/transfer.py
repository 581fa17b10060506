"""Transfer from the sizes it knows: a configuration for an unseen size, from the measured
relative runtimes of the trained sizes of the same workload.

A configuration's relative runtime at a size is its measured runtime over the size's geometric
mean (log r = log t - mean log t over the configurations that ran there), so sizes of very
different runtimes compare. For an asked size:

- "nearest": the relative runtimes of the trained size closest on a log scale;
- "interpolated": those of the trained sizes on either side, linear in log size (outside the
  trained range, the nearest end's);

and the pick is the argmin. A configuration must have run at every size used; one that failed
at either neighbour is never picked.

A trained size's relative runtimes are noisy (a setup times each configuration twice), and the
nearest size's argmin keeps that noise. With a bandwidth h > 0, each configuration's log
relative runtimes are first smoothed across the workload's sizes: a local-linear fit in ln size
with a Gaussian kernel of width h (`smoothed`); h = 0 is the table as measured. The bandwidth is
chosen by leave-one-size-out on the training sizes (`choose_bandwidth`), smoothing only the
sizes left in, so the size scored never informs its own prediction."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

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


def _local_linear(x0: float, points: Sequence[tuple[float, float]], bandwidth: float) -> float:
    """The value at x0 of a weighted least-squares line through `points` (x, y), Gaussian
    weights of width `bandwidth` around x0; the weighted mean where the points leave the slope
    undetermined (one point, or all the weight on one x)."""
    weights = [math.exp(-0.5 * ((x - x0) / bandwidth) ** 2) for x, _ in points]
    total = sum(weights)
    mean_x = sum(w * x for w, (x, _) in zip(weights, points, strict=True)) / total
    mean_y = sum(w * y for w, (_, y) in zip(weights, points, strict=True)) / total
    sxx = sum(w * (x - mean_x) ** 2 for w, (x, _) in zip(weights, points, strict=True))
    if sxx <= 1e-12 * total:
        return mean_y
    sxy = sum(w * (x - mean_x) * (y - mean_y) for w, (x, y) in zip(weights, points, strict=True))
    return mean_y + sxy / sxx * (x0 - mean_x)


def smooth_sizes(
    sizes: Mapping[int, Mapping[Config, float]], bandwidth: float
) -> dict[int, dict[Config, float]]:
    """One workload's log relative runtimes, each configuration's smoothed across the sizes
    where it ran (local-linear in ln size, Gaussian kernel of width `bandwidth`); the same
    sizes and configurations. bandwidth 0: a copy as measured."""
    if bandwidth < 0:
        raise ValueError(f"bandwidth {bandwidth}: accepted is 0 (none) or a positive width")
    if bandwidth == 0:
        return {s: dict(rel) for s, rel in sizes.items()}
    xs = {s: math.log(s) for s in sizes}
    out: dict[int, dict[Config, float]] = {}
    for size, rel in sizes.items():
        out[size] = {
            c: _local_linear(
                xs[size], [(xs[t], sizes[t][c]) for t in sorted(sizes) if c in sizes[t]], bandwidth
            )
            for c in rel
        }
    return out


def smoothed(table: Table, bandwidth: float) -> Table:
    """Every workload's relative runtimes smoothed across its sizes (`smooth_sizes`)."""
    return {w: smooth_sizes(sizes, bandwidth) for w, sizes in table.items()}


def predict(
    table: Table, workload: str, size: int, how: How = "interpolated", bandwidth: float = 0.0
) -> dict[Config, float]:
    """Predicted log relative runtime at `size` of every configuration that ran at every size
    used; with `bandwidth`, from the workload's sizes smoothed first (`smooth_sizes`)."""
    sizes = table.get(workload)
    if not sizes:
        raise ValueError(
            f"no trained size of {workload!r} to transfer from; known: {sorted(table)}"
        )
    if bandwidth:
        sizes = smooth_sizes(sizes, bandwidth)
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
    bandwidth: float = 0.0,
) -> Config | None:
    """The configuration with the lowest predicted relative runtime (ties: by label); None when
    no allowed configuration ran at every size used."""
    scores = predict(table, workload, size, how, bandwidth)
    if allowed is not None:
        keep = set(allowed)
        scores = {c: v for c, v in scores.items() if c in keep}
    if not scores:
        return None
    return min(scores, key=lambda c: (scores[c], c.label()))


# --- the transfer prior inside the model (issue 13, part 2) ---------------------------------
#
# The table travels in the model file (metadata "transfer"), so an agent or a decision service
# with only the .onnx file recommends from it. `recommend` blends, per configuration, the
# transfer prediction with the runtime model's, both as log10 runtime relative to the mean over
# the configurations they share: prior = w * transfer + (1 - w) * model. The weight is chosen
# by leave-one-size-out on the training sizes, apart for a size inside the trained range
# (interpolated) and outside it (the nearest end's relative runtimes).

LN10 = math.log(10.0)
WEIGHTS = tuple(i / 10 for i in range(11))
Kind = Literal["inside", "outside"]
KINDS: tuple[Kind, Kind] = ("inside", "outside")


def kind_of(size: int, sizes: Iterable[int]) -> Kind:
    known = sorted(set(sizes))
    return "inside" if known and known[0] < size < known[-1] else "outside"


def to_metadata(table: Table) -> dict[str, dict[str, list[list[Any]]]]:
    """JSON for the model file: workload -> size -> [ranks, threads, tile, gpu, log relative],
    and the block after them where it is not 0 (a file written before the block has none), and
    after the block a table of the workload's own knobs where it has any."""
    return {
        w: {
            str(s): [
                [
                    c.ranks,
                    c.threads,
                    c.tile,
                    int(c.gpu),
                    round(v, 5),
                    *([c.block] if c.block or c.knobs else []),
                    *([dict(c.knobs)] if c.knobs else []),
                ]
                for c, v in sorted(rel.items(), key=lambda cv: cv[0].label())
            ]
            for s, rel in sorted(sizes.items())
        }
        for w, sizes in sorted(table.items())
    }


def from_metadata(raw: Mapping[str, Mapping[str, Iterable[Iterable[Any]]]]) -> Table:
    table: Table = {}
    for w, sizes in raw.items():
        for s, rows in sizes.items():
            rel: dict[Config, float] = {}
            for ranks, threads, tile, gpu, value, *rest in rows:
                c = Config(
                    ranks=int(ranks),
                    threads=int(threads),
                    tile=int(tile),
                    block=int(rest[0]) if rest else 0,
                    gpu=bool(gpu),
                    knobs=tuple(rest[1].items()) if len(rest) > 1 else (),
                )
                rel[c] = float(value)
            table.setdefault(w, {})[int(s)] = rel
    return table


def blend_logs(
    logs: Mapping[Config, float], prior: Mapping[Config, float], weight: float
) -> dict[Config, float]:
    """log10 runtimes with the shape of `prior` (log10 relative runtimes) blended in where both
    know a configuration; the level (mean over the shared ones) stays the model's, and a
    configuration the prior does not know keeps the model's value."""
    shared = [c for c in logs if c in prior]
    if weight <= 0.0 or len(shared) < 2:
        return dict(logs)
    level = sum(logs[c] for c in shared) / len(shared)
    centre = sum(prior[c] for c in shared) / len(shared)
    out = dict(logs)
    for c in shared:
        out[c] = level + weight * (prior[c] - centre) + (1.0 - weight) * (logs[c] - level)
    return out


def blended_deltas(
    model_deltas: Iterable[float],
    prior: Mapping[Config, float],
    here: Config,
    targets: Sequence[Config],
    weight: float,
) -> list[float]:
    """A decision's predicted log10(runtime after the move / runtime now), one per target:
    w * the prior's difference + (1 - w) * the model's, where the prior (log10 relative
    runtimes) knows both configurations, else the model's alone. The differences of
    `blend_logs` (its level cancels), so `decide` ranks neighbours as `recommend` ranks the
    whole space."""
    if weight <= 0.0 or here not in prior:
        return [float(d) for d in model_deltas]
    base = prior[here]
    return [
        weight * (prior[t] - base) + (1.0 - weight) * float(d) if t in prior else float(d)
        for d, t in zip(model_deltas, targets, strict=True)
    ]


def loso_prior(
    table: Table, workload: str, size: int, bandwidth: float = 0.0
) -> tuple[dict[Config, float], Kind] | None:
    """The prior a size of the training set gets from the workload's other sizes (log10
    relative runtimes, smoothed at `bandwidth` among themselves), and whether it lies inside
    their range: what `decide` would use at that size had it not been trained on; None when the
    workload has no other size."""
    others = {s: rel for s, rel in table.get(workload, {}).items() if s != size}
    if not others:
        return None
    rel = predict({workload: others}, workload, size, bandwidth=bandwidth)
    return {c: v / LN10 for c, v in rel.items()}, kind_of(size, others)


def _argmin(values: Mapping[Config, float]) -> Config:
    return min(values, key=lambda c: (values[c], c.label()))


def tied_with(values: Sequence[float], best: Sequence[float]) -> bool:
    """Whether per-fold scores `values` are within one standard error of `best`'s (paired,
    fold by fold): their mean falls short by no more than the standard error of the
    differences. With a single fold nothing is tied but the best itself."""
    diffs = [b - v for v, b in zip(values, best, strict=True)]
    mean = sum(diffs) / len(diffs)
    if len(diffs) < 2:
        return mean <= 1e-9
    var = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
    return mean <= math.sqrt(var / len(diffs)) + 1e-9


def choose_weights(
    table: Table,
    oof_log10: Mapping[StateKey, float],
    measured: Mapping[StateKey, float],
    bandwidth: float = 0.0,
) -> dict[str, Any]:
    """Leave one size out: for every trained size of every workload with another size, the
    transfer from the other sizes and the runtime model fitted without it (`oof_log10`: its
    out-of-fold log10 runtimes) blended at every weight of WEIGHTS; the pick is scored on the
    size's measured runtimes (`measured`, s) as % of its best, and the blend's log10 relative
    runtimes against the measured ones (RMSE). Per kind (inside/outside the other sizes'
    range), the one-standard-error rule: among the weights whose mean % of best is within one
    standard error (of the paired per-fold differences) of the highest (the highest mean, then
    the lowest RMSE, then the larger weight), the largest. No fold of a kind: the other kind's
    weight; none at all: 0 (the model alone). The transfer from the other sizes is smoothed
    among them at `bandwidth` (choose_bandwidth)."""
    pct: dict[Kind, dict[float, list[float]]] = {k: {w: [] for w in WEIGHTS} for k in KINDS}
    err: dict[Kind, dict[float, list[float]]] = {k: {w: [] for w in WEIGHTS} for k in KINDS}
    folds: dict[Kind, list[str]] = {k: [] for k in KINDS}
    for workload, sizes in sorted(table.items()):
        for size in sorted(sizes):
            others = {s: rel for s, rel in sizes.items() if s != size}
            if not others:
                continue
            here = {
                c: t
                for (w, s, c), t in measured.items()
                if w == workload and s == size and t > 0 and (w, s, c) in oof_log10
            }
            if len(here) < 2:
                continue
            rel = predict({workload: others}, workload, size, bandwidth=bandwidth)
            prior = {c: v / LN10 for c, v in rel.items()}
            model = {c: oof_log10[(workload, size, c)] for c in here}
            shared = [c for c in here if c in prior]
            if len(shared) < 2:
                continue
            kind = kind_of(size, others)
            folds[kind].append(f"{workload} {size}")
            best = min(here.values())
            truth = {c: math.log10(here[c]) for c in shared}
            t_mean = sum(truth.values()) / len(truth)
            for weight in WEIGHTS:
                mixed = blend_logs(model, prior, weight)
                pct[kind][weight].append(100.0 * best / here[_argmin(mixed)])
                m_mean = sum(mixed[c] for c in shared) / len(shared)
                err[kind][weight] += [
                    (mixed[c] - m_mean - (truth[c] - t_mean)) ** 2 for c in shared
                ]
    chosen: dict[str, float] = {}
    rmse: dict[str, float | None] = {}
    table_out: dict[str, list[dict[str, float]]] = {}
    for kind in KINDS:
        if not folds[kind]:
            continue
        rows = [
            (
                weight,
                sum(pct[kind][weight]) / len(pct[kind][weight]),
                math.sqrt(sum(err[kind][weight]) / len(err[kind][weight])),
            )
            for weight in WEIGHTS
        ]
        best = max(rows, key=lambda r: (round(r[1], 6), -round(r[2], 9), r[0]))[0]
        tied = {w for w, _, _ in rows if tied_with(pct[kind][w], pct[kind][best])}
        # within the noise of the folds, the measured relative runtimes win: a held-out size
        # between two trained ones interpolates over half the gap a left-out size does, so
        # leave-one-size-out understates the transfer more than the runtime model
        top = max((r for r in rows if r[0] in tied), key=lambda r: r[0])
        chosen[kind], rmse[kind] = top[0], round(top[2], 5)
        table_out[kind] = [
            {
                "weight": w,
                "pct_of_best": round(p, 3),
                "rmse_log10": round(e, 5),
                "within_one_se_of_best": w in tied,
            }
            for w, p, e in rows
        ]
    for kind, other in (("inside", "outside"), ("outside", "inside")):
        if kind not in chosen:
            chosen[kind] = chosen.get(other, 0.0)
            rmse[kind] = rmse.get(other)
    return {
        "weight": chosen,
        "rmse_log10": rmse,
        "folds": folds,
        "by_weight": table_out,
        "chosen_by": "leave-one-size-out on the training sizes, one-standard-error rule: among "
        "the weights whose mean % of best of the pick is within one standard error of the "
        "highest, the largest",
    }


BANDWIDTHS = (0.0, 0.15, 0.3, 0.6, 1.2)  # in ln size; the trained sizes lie 0.2-0.5 apart


def choose_bandwidth(table: Table, measured: Mapping[StateKey, float]) -> dict[str, Any]:
    """Leave one size out: for every trained size of a workload with another size, the
    interpolated transfer from the other sizes smoothed among themselves at each bandwidth of
    BANDWIDTHS; its pick scored on the size's measured runtimes (`measured`, s) as % of their
    best. The bandwidth with the highest mean over the folds; ties to the smaller (0: the
    table as measured). No fold: 0."""
    pct: dict[float, list[float]] = {h: [] for h in BANDWIDTHS}
    folds: list[str] = []
    for workload, sizes in sorted(table.items()):
        for size in sorted(sizes):
            others = {s: rel for s, rel in sizes.items() if s != size}
            here = {
                c: t for (w, s, c), t in measured.items() if w == workload and s == size and t > 0
            }
            if not others or len(here) < 2:
                continue
            folds.append(f"{workload} {size}")
            best = min(here.values())
            for h in BANDWIDTHS:
                rel = predict({workload: others}, workload, size, bandwidth=h)
                scores = {c: v for c, v in rel.items() if c in here}
                if not scores:
                    pct[h].append(100.0 * best / max(here.values()))  # nothing to pick from
                    continue
                pct[h].append(100.0 * best / here[_argmin(scores)])
    rows = [(h, sum(v) / len(v) if v else 0.0) for h, v in pct.items()]
    chosen = max(rows, key=lambda r: (round(r[1], 6), -r[0]))[0] if folds else 0.0
    return {
        "bandwidth": chosen,
        "folds": len(folds),
        "by_bandwidth": [
            {
                "bandwidth": h,
                "pct_of_best": round(mean, 3),
                "min": round(min(pct[h]), 2) if pct[h] else None,
            }
            for h, mean in rows
        ],
        "chosen_by": "leave-one-size-out on the training sizes: the mean % of best of the "
        "interpolated pick from the other sizes smoothed at each bandwidth (ln size), ties to "
        "the smaller",
    }
