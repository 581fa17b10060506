"""Whether a confidence tells good decisions from bad ones, not only whether it is calibrated
(issue 43): a confidence stuck at the base rate scores an ECE near 0 and tells nothing.

- `auroc(confidence, right)`: the chance that a decision that came out right has a higher
  confidence than one that did not (ties count a half; Mann-Whitney U). 0.5: no
  discrimination; 1: perfect. None when every decision is of one kind.
- `brier(confidence, right)`: the Brier score with Murphy's (1973) decomposition over the
  distinct confidence values: reliability - resolution + uncertainty. Resolution is the part a
  constant confidence cannot have: how far the outcome rates of the groups it makes are from
  the base rate.
- `selective_risk(confidence, right)`: decisions taken in order of confidence, highest first:
  at each coverage (the share taken), the error among those taken. A confidence that
  discriminates has a curve that starts low and rises; one that does not is flat at the base
  error. `at_threshold` is the point an auto threshold gives.

Pure numpy; the inputs are the out-of-fold decisions of training, or an evaluation's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]
COVERAGES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def _inputs(confidence: Any, right: Any) -> tuple[Array, Array]:
    c = np.asarray(confidence, dtype=np.float64).reshape(-1)
    r = np.asarray(right, dtype=bool).reshape(-1)
    if len(c) != len(r):
        raise ValueError(f"{len(c)} confidences for {len(r)} outcomes")
    return c, r


def _ranks(values: Array) -> Array:
    """Ranks 1..n, ties given their average rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return np.asarray(sums[inverse] / counts[inverse])


def auroc(confidence: Any, right: Any) -> float | None:
    c, r = _inputs(confidence, right)
    positives, negatives = int(r.sum()), int((~r).sum())
    if not positives or not negatives:
        return None
    ranks = _ranks(c)
    u = float(ranks[r].sum()) - positives * (positives + 1) / 2.0
    return u / (positives * negatives)


def brier(confidence: Any, right: Any) -> dict[str, float] | None:
    c, r = _inputs(confidence, right)
    if not len(c):
        return None
    outcome = r.astype(np.float64)
    base = float(outcome.mean())
    values, inverse, counts = np.unique(c, return_inverse=True, return_counts=True)
    rate = np.bincount(inverse, weights=outcome) / counts
    weight = counts / len(c)
    return {
        "brier": float(np.mean((c - outcome) ** 2)),
        "reliability": float(np.sum(weight * (values - rate) ** 2)),
        "resolution": float(np.sum(weight * (rate - base) ** 2)),
        "uncertainty": base * (1.0 - base),
    }


def selective_risk(
    confidence: Any,
    right: Any,
    coverages: Sequence[float] = COVERAGES,
    threshold: float | None = None,
) -> dict[str, Any]:
    """The error among the decisions taken at each coverage (highest confidence first; the
    decisions tied at the cut are taken together, so a constant confidence has one point), and
    at `threshold` the share taken and their error."""
    c, r = _inputs(confidence, right)
    n = len(c)
    out: dict[str, Any] = {"curve": [], "at_threshold": None}
    if not n:
        return out
    order = np.argsort(-c, kind="stable")
    wrong = np.cumsum(~r[order])
    for coverage in coverages:
        k = max(1, round(coverage * n))
        cut = c[order][k - 1]
        k = int(np.sum(c >= cut))  # ties at the cut go together
        point = {"coverage": round(k / n, 4), "risk": round(float(wrong[k - 1]) / k, 4)}
        if not out["curve"] or out["curve"][-1] != point:
            out["curve"].append(point)
    if threshold is not None:
        taken = c >= threshold
        out["at_threshold"] = {
            "threshold": threshold,
            "coverage": round(float(taken.mean()), 4),
            "risk": round(float((~r[taken]).mean()), 4) if taken.any() else None,
        }
    return out


def report(confidence: Any, right: Any, threshold: float | None = None) -> dict[str, Any]:
    """AUROC, the Brier decomposition and the selective-risk curve of one set of decisions."""
    c, r = _inputs(confidence, right)
    found = auroc(c, r)
    parts = brier(c, r)
    return {
        "decisions": len(c),
        "right_share": round(float(r.mean()), 4) if len(c) else None,
        "auroc": None if found is None else round(found, 4),
        "brier": None if parts is None else {k: round(v, 5) for k, v in parts.items()},
        "selective_risk": selective_risk(c, r, threshold=threshold),
    }
