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
than MIN_DECISIONS out-of-fold decisions keeps its raw confidence.

A map of the raw probability alone cannot tell two decisions of the same probability apart,
and on a noisy machine that probability sits near one value for most decisions (issue 43:
out-of-fold AUROC 0.44-0.52). So each kind may also get a logistic map over what the decision
itself says (`decision_features`): the probability of the choice, its margin over the
runner-up, and the runtime model's predicted gain (a move: its predicted speed-up; STOP: the
largest one it leaves). It is kept for a kind only where, fitted on the other training sizes,
it scores a lower Brier score than the isotonic map on each held-out size's decisions (the
choice is made on the training sizes alone); the isotonic table stays in the file beside it,
so an older hpc-ds1 reads the file as before."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
FEATURES = ("logit_p", "margin", "gain_log10")
P_CLIP = 1e-4
LOGISTIC_C = 1.0  # scikit-learn's default L2 strength: a few hundred decisions, three features


def decision_features(proba: Array, deltas: Array, stop_index: int) -> Array:
    """Per decision (a row of probabilities over its actions, the action taken being the most
    probable, and a row of the runtime model's predicted log10(runtime after / now) per action,
    NaN where it has none, STOP's included): the logit of the choice's probability, its margin
    over the runner-up, and the predicted gain of the choice in log10: a move's predicted
    speed-up, or for STOP the largest speed-up it leaves (0 when no move has a prediction)."""
    proba = np.atleast_2d(np.asarray(proba, dtype=np.float64))
    deltas = np.atleast_2d(np.asarray(deltas, dtype=np.float64))
    chosen = proba.argmax(axis=1)
    rows = np.arange(len(proba))
    top = proba[rows, chosen]
    ordered = np.sort(proba, axis=1)
    runner_up = ordered[:, -2] if proba.shape[1] > 1 else np.zeros(len(proba))
    clipped = np.clip(top, P_CLIP, 1.0 - P_CLIP)
    gains = -deltas.copy()
    gains[:, stop_index] = np.nan
    left = np.where(np.isfinite(gains).any(axis=1), np.nanmax(_finite_or(gains, -np.inf), 1), 0.0)
    own = np.nan_to_num(gains[rows, chosen], nan=0.0)
    gain = np.where(chosen == stop_index, left, own)
    return np.column_stack([np.log(clipped / (1.0 - clipped)), top - runner_up, gain])


def _finite_or(values: Array, fill: float) -> Array:
    return np.where(np.isfinite(values), values, fill)


@dataclass(frozen=True)
class Logistic:
    """P(came true) = sigmoid(intercept + coef . (features - mean) / scale)."""

    intercept: float
    coef: tuple[float, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]

    def __call__(self, features: Array) -> Array:
        x = (np.atleast_2d(features) - np.asarray(self.mean)) / np.asarray(self.scale)
        z = self.intercept + x @ np.asarray(self.coef)
        return np.asarray(1.0 / (1.0 + np.exp(-z)))

    def as_dict(self) -> dict[str, Any]:
        return {
            "features": list(FEATURES),
            "intercept": self.intercept,
            "coef": list(self.coef),
            "mean": list(self.mean),
            "scale": list(self.scale),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Logistic:
        names = tuple(raw.get("features") or ())
        if names != FEATURES:
            raise ValueError(f"calibration features {names}: this version reads {FEATURES}")
        parts = [tuple(float(v) for v in raw[k]) for k in ("coef", "mean", "scale")]
        if any(len(p) != len(FEATURES) for p in parts) or min(parts[2]) <= 0:
            raise ValueError(f"calibration logistic: coef, mean, scale of {len(FEATURES)} each")
        return cls(float(raw["intercept"]), *parts)


def fit_logistic(features: Array, good: Array) -> Logistic | None:
    """A logistic map from decision features to P(good); None where `good` has one value."""
    from sklearn.linear_model import LogisticRegression

    good = np.asarray(good, dtype=bool)
    if good.all() or not good.any():
        return None
    mean = features.mean(axis=0)
    scale = features.std(axis=0)
    scale = np.where(scale > 1e-9, scale, 1.0)
    model = LogisticRegression(C=LOGISTIC_C).fit((features - mean) / scale, good)
    return Logistic(
        round(float(model.intercept_[0]), 6),
        tuple(round(float(v), 6) for v in model.coef_[0]),
        tuple(round(float(v), 6) for v in mean),
        tuple(round(float(v), 6) for v in scale),
    )


@dataclass(frozen=True)
class Calibration:
    """Per kind ("move", "stop"): increasing x thresholds and their calibrated values, and
    where training chose it, a logistic map over `decision_features` that replaces them."""

    tables: Mapping[str, tuple[tuple[float, ...], tuple[float, ...]]]
    logistic: Mapping[str, Logistic] = field(default_factory=dict)

    def confidence(self, p: float, stop: bool, features: Array | None = None) -> float:
        kind = "stop" if stop else "move"
        logistic = self.logistic.get(kind)
        if logistic is not None and features is not None:
            return float(logistic(np.asarray(features, dtype=np.float64))[0])
        found = self.tables.get(kind)
        if found is None:
            return p
        xs, ys = found
        return float(min(max(np.interp(p, xs, ys), 0.0), 1.0))

    def as_dict(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {
            k: {"x": list(xs), "y": list(ys)} for k, (xs, ys) in self.tables.items()
        }
        for kind, logistic in self.logistic.items():
            out.setdefault(kind, {"x": [0.0, 1.0], "y": [0.0, 1.0]})["logistic"] = (
                logistic.as_dict()
            )
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Mapping[str, Any]] | None) -> Calibration:
        tables, logistic = {}, {}
        for kind, t in (raw or {}).items():
            xs, ys = tuple(float(v) for v in t["x"]), tuple(float(v) for v in t["y"])
            if kind not in KINDS or not xs or len(xs) != len(ys):
                raise ValueError(
                    f"calibration table {kind!r}: expected kinds {KINDS} with x and y of one length"
                )
            tables[kind] = (xs, ys)
            if t.get("logistic"):
                logistic[kind] = Logistic.from_dict(t["logistic"])
        return cls(tables, logistic)


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


def ece(confidence: Array, good: Array, edges: Sequence[float] = BIN_EDGES) -> float:
    """The expected calibration error: |stated - observed| per confidence bin (`edges`, the
    last bin closed), weighted by the bin's share. The one ECE of the code base: training, the
    move model's metrics (ten equal bins) and the evaluation's reliability tables use it."""
    confidence, good = np.asarray(confidence, dtype=float), np.asarray(good, dtype=float)
    n = len(confidence)
    if not n:
        return 0.0
    total = 0.0
    for lo, hi in itertools.pairwise(edges):
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


def fit(
    p: Array,
    stop: Array,
    good: Array,
    features: Array | None = None,
    logistic_kinds: Sequence[str] = (),
) -> Calibration:
    """Isotonic maps from raw confidence `p` to P(good), one per kind with enough decisions;
    and for the kinds in `logistic_kinds`, a logistic map over `features` (one row a
    decision, `decision_features`)."""
    p, stop, good = np.asarray(p, float), np.asarray(stop, bool), np.asarray(good, bool)
    tables, logistic = {}, {}
    for kind, where in (("move", ~stop), ("stop", stop)):
        if where.sum() < MIN_DECISIONS:
            continue
        tables[kind] = _fit_one(p[where], good[where])
        if kind in logistic_kinds and features is not None:
            found = fit_logistic(np.asarray(features, float)[where], good[where])
            if found is not None:
                logistic[kind] = found
    return Calibration(tables, logistic)


def calibrated(
    calibration: Calibration, p: Array, stop: Array, features: Array | None = None
) -> Array:
    """`calibration` applied to raw confidences `p` (STOP's map where `stop`)."""
    rows = [None] * len(p) if features is None else list(np.asarray(features, float))
    return np.asarray(
        [
            calibration.confidence(float(v), bool(s), f)
            for v, s, f in zip(p, stop, rows, strict=True)
        ]
    )


def crossed_confidence(
    p: Array,
    stop: Array,
    good: Array,
    groups: Array,
    features: Array | None = None,
    logistic_kinds: Sequence[str] = (),
) -> Array:
    """Each decision's confidence under the maps fitted on the other groups (training sizes):
    calibrated, and never by its own outcome."""
    p, stop, good = np.asarray(p, float), np.asarray(stop, bool), np.asarray(good, bool)
    groups = np.asarray(groups)
    crossed = p.copy()
    for g in np.unique(groups):
        rest, here = groups != g, groups == g
        maps = fit(
            p[rest],
            stop[rest],
            good[rest],
            None if features is None else features[rest],
            logistic_kinds,
        )
        crossed[here] = calibrated(
            maps, p[here], stop[here], None if features is None else features[here]
        )
    return crossed


def choose_logistic(
    p: Array, stop: Array, good: Array, groups: Array, features: Array
) -> tuple[tuple[str, ...], dict[str, dict[str, float]]]:
    """The kinds whose logistic map beats the isotonic one on the Brier score of the held-out
    sizes (leave-one-size-out), and both scores per kind."""
    p, stop, good = np.asarray(p, float), np.asarray(stop, bool), np.asarray(good, bool)
    isotonic = crossed_confidence(p, stop, good, groups)
    logistic = crossed_confidence(p, stop, good, groups, features, KINDS)
    chosen, scores = [], {}
    for kind, where in (("move", ~stop), ("stop", stop)):
        if where.sum() < MIN_DECISIONS:
            continue
        b_iso = float(np.mean((isotonic[where] - good[where]) ** 2))
        b_log = float(np.mean((logistic[where] - good[where]) ** 2))
        scores[kind] = {"isotonic": round(b_iso, 5), "logistic": round(b_log, 5)}
        if b_log < b_iso and math.isfinite(b_log):
            chosen.append(kind)
    return tuple(chosen), scores


def fit_and_score(
    p: Array,
    stop: Array,
    good: Array,
    groups: Array,
    target: str = "not_slower",
    features: Array | None = None,
) -> tuple[Calibration, dict]:
    """The calibration on every out-of-fold decision, and its error measured honestly: per
    group (a training size), maps fitted on the other groups applied to it. `good`: whether
    each decision came true by `target`'s meaning (TARGETS). With `features`
    (`decision_features`), a kind takes the logistic map where it scores better held out."""
    p, stop, good = np.asarray(p, float), np.asarray(stop, bool), np.asarray(good, bool)
    kinds: tuple[str, ...] = ()
    brier: dict[str, dict[str, float]] = {}
    if features is not None and len(np.unique(groups)) >= 2:
        kinds, brier = choose_logistic(p, stop, good, groups, features)
    crossed = crossed_confidence(p, stop, good, groups, features, kinds)
    calibration = fit(p, stop, good, features, kinds)
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
        "logistic": sorted(calibration.logistic),
        "brier_leave_one_size_out": brier,
    }
