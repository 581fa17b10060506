"""Confidence that means "this decision is not slower" (issue 13, part 2).

A decision's raw confidence is the blended probability of its choice. Isotonic regression
(scikit-learn, at training only) maps it to the observed share of out-of-fold decisions on the
training sizes that came true, apart for moves and for STOP. What "came true" means is the
calibration's target, written in the model file:

- "not_slower" (the default since 1 Dec 2026): a move is not slower when the configuration it
  leads to ran and is not slower than the current one beyond the two measurements' noise
  (runner.noise.is_faster, the rule the labels and the evaluation use); STOP is not slower when
  its fastest neighbour is not faster beyond the noise (stopping leaves no real gain behind:
  exactly when the labels call STOP right). The confidence is then what an engineer needs to
  let a move run by itself: the chance it does not make the job slower. At the spreads of a
  loaded machine (20 % and more) nearly every decision is within the noise, so the maps state
  nearly 1.0 for everything: true there, and no longer a way to tell a gain from a harmless
  step (the keep rule still reverts what turns out slower).
- "good": a move is good when its target is at most TOLERANCE (2 %) above the current
  runtime; STOP when no neighbour is more than TOLERANCE faster. Stricter than the noise at
  small spreads, looser at large ones; the earlier models' target.

The fitted maps travel in the model file as small tables of thresholds (metadata
"calibration"); inference interpolates them with numpy, no scikit-learn. A kind with fewer
than MIN_DECISIONS out-of-fold decisions keeps its raw confidence."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hpc_ds1.runner.noise import is_faster

Array = npt.NDArray[Any]
MIN_DECISIONS = 20
TOLERANCE = 0.02
BIN_EDGES = (0.0, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)
KINDS = ("move", "stop")
TARGETS = ("not_slower", "good", "unattended")
WORSE = 0.05  # a decision is wrong for discrimination when it ends >= 5 % above the best


@dataclass(frozen=True)
class Calibration:
    """Per kind ("move", "stop"): increasing x thresholds and their calibrated values."""

    tables: Mapping[str, tuple[tuple[float, ...], tuple[float, ...]]]

    def confidence(self, p: float, stop: bool) -> float:
        found = self.tables.get("stop" if stop else "move")
        if found is None:
            return p
        xs, ys = found
        return float(min(max(np.interp(p, xs, ys), 0.0), 1.0))

    def as_dict(self) -> dict[str, dict[str, list[float]]]:
        return {k: {"x": list(xs), "y": list(ys)} for k, (xs, ys) in self.tables.items()}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Mapping[str, Sequence[float]]] | None) -> Calibration:
        tables = {}
        for kind, t in (raw or {}).items():
            xs, ys = tuple(float(v) for v in t["x"]), tuple(float(v) for v in t["y"])
            if kind not in KINDS or not xs or len(xs) != len(ys):
                raise ValueError(
                    f"calibration table {kind!r}: expected kinds {KINDS} with x and y of one length"
                )
            tables[kind] = (xs, ys)
        return cls(tables)


def move_good(here_s: float, there_s: float | None) -> bool:
    """A move to a configuration that ran in `there_s` from one that ran in `here_s`."""
    return there_s is not None and there_s <= here_s * (1.0 + TOLERANCE)


def stop_good(here_s: float, neighbours_s: Sequence[float]) -> bool:
    """STOP at a configuration that ran in `here_s`, its neighbours' runtimes `neighbours_s`."""
    return all(t >= here_s * (1.0 - TOLERANCE) for t in neighbours_s)


def move_not_slower(
    here_s: float, here_spread: float | None, there_s: float | None, there_spread: float | None
) -> bool:
    """A move from a configuration that ran in `here_s` to one that ran in `there_s` (None:
    it failed or did not run) does not make the job slower beyond the measurements' noise."""
    return there_s is not None and not is_faster(here_s, here_spread, there_s, there_spread)


def stop_not_slower(
    here_s: float, here_spread: float | None, around: Sequence[tuple[float, float | None]]
) -> bool:
    """STOP at a configuration that ran in `here_s` leaves no real gain behind: its fastest
    neighbour (`around`: the neighbours' runtimes and spreads) is not faster beyond the noise,
    the rule by which the labels make STOP the right move (labels.label_outcomes)."""
    if not around:
        return True
    fastest, spread = min(around, key=lambda ts: ts[0])
    return not is_faster(fastest, spread, here_s, here_spread)


def move_unattended(
    here_s: float, here_spread: float | None, there_s: float | None, there_spread: float | None
) -> bool:
    """A move that is right to run unattended (issue 43): it makes the job faster beyond the
    noise of the two measurements."""
    return there_s is not None and is_faster(there_s, there_spread, here_s, here_spread)


def stop_unattended(here_s: float, neighbours_s: Sequence[float]) -> bool:
    """A STOP (or a revert) that is right unattended: it leaves at most TOLERANCE (2 %) on the
    table, no neighbour being more than that faster."""
    return stop_good(here_s, neighbours_s)


def worse_than_best(ends_s: float | None, here_s: float, neighbours_s: Sequence[float]) -> bool:
    """Whether a decision ends at least WORSE (5 %) above the best configuration it could have
    reached (the current one or a neighbour that ran); a failed target always is."""
    best = min([here_s, *neighbours_s])
    return ends_s is None or ends_s >= best * (1.0 + WORSE)


def ece(confidence: Array, good: Array) -> float:
    """Expected calibration error over the evaluation's confidence bins."""
    confidence, good = np.asarray(confidence, dtype=float), np.asarray(good, dtype=float)
    n = len(confidence)
    if not n:
        return 0.0
    total = 0.0
    for lo, hi in itertools.pairwise(BIN_EDGES):
        inside = (confidence >= lo) & ((confidence < hi) | ((hi == 1.0) & (confidence == 1.0)))
        if inside.any():
            total += inside.sum() / n * abs(confidence[inside].mean() - good[inside].mean())
    return float(total)


def _fit_one(p: Array, good: Array) -> tuple[tuple[float, ...], tuple[float, ...]]:
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip")
    iso.fit(p, good.astype(float))
    xs = tuple(round(float(v), 6) for v in iso.X_thresholds_)
    ys = tuple(round(float(v), 6) for v in iso.y_thresholds_)
    return xs, ys


def fit(p: Array, stop: Array, good: Array) -> Calibration:
    """Isotonic maps from raw confidence `p` to P(good), one per kind with enough decisions."""
    p, stop, good = np.asarray(p, float), np.asarray(stop, bool), np.asarray(good, bool)
    tables = {}
    for kind, where in (("move", ~stop), ("stop", stop)):
        if where.sum() >= MIN_DECISIONS:
            tables[kind] = _fit_one(p[where], good[where])
    return Calibration(tables)


def calibrated(calibration: Calibration, p: Array, stop: Array) -> Array:
    """`calibration` applied to raw confidences `p` (STOP's map where `stop`)."""
    return np.asarray(
        [calibration.confidence(float(v), bool(s)) for v, s in zip(p, stop, strict=True)]
    )


def crossed_confidence(p: Array, stop: Array, good: Array, groups: Array) -> Array:
    """Each decision's confidence under the maps fitted on the other groups (training sizes):
    calibrated, and never by its own outcome."""
    p, stop, good = np.asarray(p, float), np.asarray(stop, bool), np.asarray(good, bool)
    groups = np.asarray(groups)
    crossed = p.copy()
    for g in np.unique(groups):
        rest = groups != g
        crossed[~rest] = calibrated(fit(p[rest], stop[rest], good[rest]), p[~rest], stop[~rest])
    return crossed


def fit_and_score(
    p: Array, stop: Array, good: Array, groups: Array, target: str = "not_slower"
) -> tuple[Calibration, dict]:
    """The calibration on every out-of-fold decision, and its error measured honestly: per
    group (a training size), maps fitted on the other groups applied to it. `good`: whether
    each decision came true by `target`'s meaning (TARGETS)."""
    p, stop, good = np.asarray(p, float), np.asarray(stop, bool), np.asarray(good, bool)
    crossed = crossed_confidence(p, stop, good, groups)
    calibration = fit(p, stop, good)
    what = {
        "good": f"P(good): a move's target at most {TOLERANCE:.0%} slower; STOP: no neighbour "
        f"more than {TOLERANCE:.0%} faster",
        "not_slower": "P(not slower): a move's target not slower beyond the noise of the two "
        "measurements; STOP: its fastest neighbour not faster beyond the noise",
        "unattended": "P(right unattended): a move makes the job faster beyond the noise of the "
        f"two measurements; STOP leaves at most {TOLERANCE:.0%} on the table",
    }
    return calibration, {
        "target": target,
        "what": what[target],
        "decisions": len(p),
        "true_share": round(float(good.mean()), 4) if len(p) else None,
        "ece_before": round(ece(p, good), 4),
        "ece_after_leave_one_size_out": round(ece(crossed, good), 4),
        "kinds": {k: len(v[0]) for k, v in calibration.tables.items()},
    }
