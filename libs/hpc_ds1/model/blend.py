"""Move probabilities from the runtime model, blended with the move classifier's.

The runtime model ranks a state's neighbours by predicted runtime; a softmax over the predicted
log10 speed-ups, with STOP scored as a move that would gain exactly the noise floor, turns that
ranking into probabilities. How much of each to use (alpha: the classifier's share) and how
sharp the softmax is (tau) are chosen on the training sizes only: by the tuning sessions their
out-of-fold decisions make on the training sizes' own measured landscape. A temperature fitted
on the out-of-fold log loss then calibrates the confidence without changing any choice."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hpc_ds1.runner.noise import DEFAULT_FLOOR
from hpc_ds1.space import ALL_ACTIONS, STOP

Array = npt.NDArray[Any]
STOP_INDEX = ALL_ACTIONS.index(STOP)
STOP_GAIN_LOG10 = math.log10(1.0 - DEFAULT_FLOOR)  # STOP is worth a move that gains the floor
ALPHAS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
TAUS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)
TEMPERATURES = tuple(float(t) for t in np.geomspace(0.25, 16.0, 49))


def runtime_proba(delta: Array, mask: Array, tau: float) -> Array:
    """Rows of predicted log10(runtime after / runtime now) per action (STOP's column is
    ignored) -> probabilities over the feasible actions (mask)."""
    d = np.array(delta, dtype=np.float64, copy=True)
    d[:, STOP_INDEX] = STOP_GAIN_LOG10
    feasible = mask > 0
    scores = np.where(feasible, -np.nan_to_num(d, nan=np.inf) / tau, -np.inf)
    scores -= scores.max(axis=1, keepdims=True)
    weights = np.where(feasible, np.exp(scores), 0.0)
    return np.asarray(weights / weights.sum(axis=1, keepdims=True))


def tempered(p: Array, temperature: float) -> Array:
    """Temperature scaling along the last axis: the ranking stays, the confidence is
    calibrated (T > 1 flattens an overconfident distribution)."""
    if temperature == 1.0:
        return p
    q = np.power(np.clip(p, 0.0, None), 1.0 / temperature)
    return np.asarray(q / q.sum(axis=-1, keepdims=True))


@dataclass(frozen=True)
class Blend:
    """alpha = 1, temperature = 1: the classifier alone (models trained before the blend)."""

    alpha: float = 1.0
    tau: float = 0.02
    temperature: float = 1.0

    def mixed(self, classifier: Array, delta: Array, mask: Array) -> Array:
        if self.alpha >= 1.0:
            return classifier
        runtime = runtime_proba(delta, mask, self.tau)
        return np.asarray(self.alpha * classifier + (1.0 - self.alpha) * runtime)

    def proba(self, classifier: Array, delta: Array, mask: Array) -> Array:
        return tempered(self.mixed(classifier, delta, mask), self.temperature)

    def for_state(self, classifier: Array, move_deltas: Array) -> Array:
        """One state: `classifier` over [*moves, STOP], `move_deltas` over the moves."""
        p = np.asarray(classifier, dtype=np.float64)
        if self.alpha < 1.0:
            d = np.append(np.asarray(move_deltas, dtype=np.float64), STOP_GAIN_LOG10)
            weights = np.exp(-(d - d.min()) / self.tau)
            p = self.alpha * p + (1.0 - self.alpha) * weights / weights.sum()
        return tempered(p, self.temperature)

    def as_dict(self) -> dict[str, float]:
        return {"alpha": self.alpha, "tau": self.tau, "temperature": self.temperature}


def log_loss(proba: Array, y: Array) -> float:
    return float(-np.log(np.clip(proba[np.arange(len(y)), y], 1e-12, 1.0)).mean())


def fit_temperature(p: Array, y: Array) -> float:
    """The temperature with the lowest out-of-fold log loss (Guo et al., 2017)."""
    return min(TEMPERATURES, key=lambda t: (log_loss(tempered(p, t), y), abs(math.log(t))))


def choose_blend(
    classifier_oof: Array,
    delta_oof: Array,
    mask: Array,
    y: Array,
    session_score: Callable[[Blend], float] | None = None,
) -> tuple[Blend, dict[str, Any]]:
    """The (alpha, tau) whose out-of-fold tuning sessions on the training sizes reach the
    highest mean % of the best configuration (ties, and no `session_score`: the lower
    out-of-fold log loss, then the larger alpha); then its calibrating temperature."""
    scored = []
    for alpha, tau in itertools.product(ALPHAS, TAUS):
        blend = Blend(alpha, tau)
        loss = log_loss(blend.proba(classifier_oof, delta_oof, mask), y)
        sessions = session_score(blend) if session_score else 0.0
        scored.append((-round(sessions, 6), round(loss, 9), -alpha, blend, sessions, loss))
    row = min(scored, key=lambda s: s[:3])
    chosen: Blend = row[3]
    mixed = chosen.mixed(classifier_oof, delta_oof, mask)
    best = Blend(chosen.alpha, chosen.tau, fit_temperature(mixed, y))
    by_loss = min(scored, key=lambda s: s[1:3])
    classifier_only = next(s for s in scored if s[3].alpha == 1.0)
    return best, {
        **best.as_dict(),
        "chosen_by": "mean % of best of leave-one-size-out sessions on the training sizes"
        if session_score
        else "leave-one-size-out log loss",
        "sessions_pct_of_best": round(row[4], 3) if session_score else None,
        "log_loss_before_temperature": round(row[5], 5),
        "log_loss": round(log_loss(best.proba(classifier_oof, delta_oof, mask), y), 5),
        "lowest_log_loss": {**by_loss[3].as_dict(), "log_loss": round(by_loss[5], 5)},
        "classifier_only": {
            "log_loss": round(classifier_only[5], 5),
            "sessions_pct_of_best": round(classifier_only[4], 3) if session_score else None,
        },
        "grid": {"alpha": list(ALPHAS), "tau": list(TAUS)},
    }
