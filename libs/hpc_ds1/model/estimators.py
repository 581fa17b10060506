"""Candidate estimators (all convertible by skl2onnx) and their choice by leave-one-size-out CV.

Folds: group k holds the k-th measured size of every workload, so each fold asks how well the
model does on sizes it never saw."""

from __future__ import annotations

import functools
import itertools
import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, clone
from sklearn.calibration import CalibratedClassifierCV
from sklearn.ensemble import (
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler

from hpc_ds1.model.calibration import ece
from hpc_ds1.model.relative import SizeRelative
from hpc_ds1.space import ALL_ACTIONS

Array = npt.NDArray[Any]
Splits = list[tuple[Array, Array]]
N_ACTIONS = len(ALL_ACTIONS)


def group_splits(groups: Array) -> Splits:
    values = np.unique(groups)
    return [(np.flatnonzero(groups != g), np.flatnonzero(groups == g)) for g in values]


MAX_INNER_FOLDS = 3


def _calibrated(base: BaseEstimator, inner_groups: Array) -> BaseEstimator:
    """Sigmoid calibration on out-of-fold predictions over grouped (by size) inner folds, then
    one final base model (ensemble=False: one model in the ONNX graph, not one per fold)."""
    values = np.unique(inner_groups)
    merged = np.searchsorted(values, inner_groups) % MAX_INNER_FOLDS
    splits = group_splits(merged)
    cv: Any = splits if len(splits) >= 2 else 2
    return CalibratedClassifierCV(base, method="sigmoid", cv=cv, ensemble=False)


def classifier_candidates(seed: int) -> dict[str, Callable[[Array], BaseEstimator]]:
    """name -> factory(groups of its training rows). Sigmoid calibration converts exactly;
    isotonic does not (differs by up to 0.02 in onnxruntime), so it is not offered."""
    gb = GradientBoostingClassifier(n_estimators=60, max_depth=3, random_state=seed)
    rf = RandomForestClassifier(
        n_estimators=100, min_samples_leaf=2, max_features=0.5, random_state=seed, n_jobs=2
    )
    lr = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=3000))
    out: dict[str, Callable[[Array], BaseEstimator]] = {}
    bases: tuple[tuple[str, BaseEstimator], ...] = (
        ("gradient_boosting", gb),
        ("random_forest", rf),
        ("logistic", lr),
    )
    for name, base in bases:
        out[name] = functools.partial(_raw, base)
        out[f"{name}+sigmoid"] = functools.partial(_sigmoid, base)
    return out


def _raw(base: BaseEstimator, groups: Array) -> BaseEstimator:
    return clone(base)


def _sigmoid(base: BaseEstimator, groups: Array) -> BaseEstimator:
    base = clone(base)
    if isinstance(base, Pipeline):
        # The scaler stays outside the calibration. skl2onnx calibrates a calibrated
        # pipeline's probabilities where scikit-learn calibrates its decision function, so that
        # file computed another model (probabilities up to 0.58 apart); a calibrated final step
        # converts exactly. Scaling is unsupervised, so fitting it on every row leaks nothing.
        *before, (_, final) = base.steps
        return Pipeline([*before, ("calibrated", _calibrated(final, groups))])
    return _calibrated(base, groups)


def regressor_candidates(seed: int) -> dict[str, Callable[[], BaseEstimator]]:
    return {
        "gradient_boosting": lambda: GradientBoostingRegressor(
            n_estimators=200, max_depth=3, learning_rate=0.1, random_state=seed
        ),
        "random_forest": lambda: RandomForestRegressor(
            n_estimators=100, min_samples_leaf=1, max_features=0.7, random_state=seed, n_jobs=2
        ),
        "ridge": lambda: make_pipeline(StandardScaler(), Ridge(alpha=1.0)),
        # the size's scale apart from each configuration's relative runtime (relative.py): a
        # tree then only has to carry the order of the configurations across sizes
        "gradient_boosting_relative": lambda: SizeRelative(
            GradientBoostingRegressor(
                n_estimators=200, max_depth=3, learning_rate=0.1, random_state=seed
            )
        ),
        "ridge_poly2_relative": lambda: SizeRelative(
            make_pipeline(StandardScaler(), PolynomialFeatures(degree=2), Ridge(alpha=1.0))
        ),
        "random_forest_relative": lambda: SizeRelative(
            RandomForestRegressor(
                n_estimators=100, min_samples_leaf=1, max_features=0.7, random_state=seed, n_jobs=2
            )
        ),
        # pairwise interactions (ranks x size, threads x intensity, ...): where the best
        # configuration crosses over between sizes, a linear model cannot follow
        "ridge_poly2": lambda: make_pipeline(
            StandardScaler(), PolynomialFeatures(degree=2), Ridge(alpha=1.0)
        ),
    }


def fit_quietly(estimator: Any, X: Array, y: Array) -> Any:
    """Fit; a size fold may lack a rare move, which scikit-learn warns about (it is expected:
    the out-of-fold probability of that move is then 0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        return estimator.fit(X, y)


def full_proba(estimator: Any, X: Array) -> Array:
    """predict_proba spread over ALL_ACTIONS columns (classes are indices into ALL_ACTIONS)."""
    p = np.asarray(estimator.predict_proba(X), dtype=np.float64)
    out = np.zeros((len(X), N_ACTIONS))
    out[:, np.asarray(estimator.classes_, dtype=int)] = p
    return out


def masked(proba: Array, mask: Array) -> Array:
    """Infeasible moves removed, the rest renormalised (uniform over feasible if all are 0)."""
    p = proba * mask
    total = p.sum(axis=1, keepdims=True)
    uniform = mask / np.maximum(mask.sum(axis=1, keepdims=True), 1)
    return np.where(total > 0, p / np.where(total > 0, total, 1), uniform)


def calibration_table(confidence: Array, correct: Array, bins: int = 10) -> list[dict[str, float]]:
    edges = np.linspace(0.0, 1.0, bins + 1)
    table = []
    for lo, hi in itertools.pairwise(edges):
        sel = (confidence >= lo) & ((confidence < hi) if hi < 1 else (confidence <= hi))
        if sel.any():
            table.append(
                {
                    "stated": round(float(confidence[sel].mean()), 4),
                    "observed": round(float(correct[sel].mean()), 4),
                    "count": int(sel.sum()),
                }
            )
    return table


def ten_bin_ece(confidence: Array, correct: Array) -> float:
    """The expected calibration error over ten equal bins (model.calibration.ece's, with these
    edges): the figure a move model's metrics report."""
    return ece(confidence, correct, edges=tuple(np.linspace(0.0, 1.0, 11)))


def classification_scores(proba: Array, y: Array) -> dict[str, Any]:
    choice = proba.argmax(axis=1)
    confidence = proba.max(axis=1)
    correct = (choice == y).astype(float)
    p_true = np.clip(proba[np.arange(len(y)), y], 1e-12, 1.0)
    onehot = np.zeros_like(proba)
    onehot[np.arange(len(y)), y] = 1.0
    return {
        "log_loss": round(float(-np.log(p_true).mean()), 5),
        "accuracy": round(float(correct.mean()), 5),
        "brier": round(float(((proba - onehot) ** 2).sum(axis=1).mean()), 5),
        "ece": round(ten_bin_ece(confidence, correct), 5),
        "mean_confidence": round(float(confidence.mean()), 5),
    }


def cv_classifier(
    factory: Callable[[Array], BaseEstimator], X: Array, y: Array, groups: Array, mask: Array
) -> tuple[dict[str, Any], Array]:
    """Out-of-fold masked probabilities and their scores."""
    started = time.perf_counter()
    oof = np.zeros((len(y), N_ACTIONS))
    for train, test in group_splits(groups):
        est = factory(groups[train])
        if len(np.unique(y[train])) < 2:
            oof[test] = np.eye(N_ACTIONS)[np.full(len(test), int(y[train][0]))]
            continue
        fit_quietly(est, X[train], y[train])
        oof[test] = full_proba(est, X[test])
    oof = masked(oof, mask)
    scores = classification_scores(oof, y)
    scores["cv_seconds"] = round(time.perf_counter() - started, 3)
    return scores, oof


def choose_classifier(
    X: Array,
    y: Array,
    groups: Array,
    mask: Array,
    seed: int,
    names: Sequence[str] | None = None,
) -> tuple[str, dict[str, dict[str, Any]], Array]:
    """Every candidate through leave-one-size-out CV; the lowest log loss wins (a proper
    scoring rule: it rewards being right and being honest about how sure)."""
    results: dict[str, dict[str, Any]] = {}
    oofs: dict[str, Array] = {}
    candidates = classifier_candidates(seed)
    unknown = sorted(set(names or ()) - set(candidates))
    if unknown:
        raise ValueError(f"unknown candidates {unknown}; known: {sorted(candidates)}")
    for name in names or candidates:
        try:
            results[name], oofs[name] = cv_classifier(candidates[name], X, y, groups, mask)
        except ValueError as error:
            # e.g. sigmoid calibration when an inner fold lacks some moves: that candidate
            # cannot be fitted on this data; the others still compete.
            results[name] = {"failed": str(error)}
    fitted = [n for n in results if "failed" not in results[n]]
    if not fitted:
        raise ValueError(f"no move-model candidate could be fitted: {results}")
    best = min(fitted, key=lambda n: (results[n]["log_loss"], -results[n]["accuracy"]))
    return best, results, oofs[best]


def ranked(results: dict[str, dict[str, Any]]) -> list[str]:
    """Fitted candidates, best first (the fallback order for the final fit)."""
    fitted = [n for n in results if "failed" not in results[n]]
    return sorted(fitted, key=lambda n: (results[n]["log_loss"], -results[n]["accuracy"]))


PAIR_BLOCK = 1024  # rows per block of the pairwise order (a recorded space has 11,130 at once)


def regression_scores(
    pred: Array, target: Array, keys: Sequence[tuple[str, int]]
) -> dict[str, float]:
    """RMSE in log10 runtime, median relative error, System 1 regret (per held-out (workload,
    size), runtime of the predicted-best config over the measured best), and the pairwise order:
    of every two configurations of one size, the share the prediction puts in the measured
    order, each pair weighted by how far apart they measured (a near tie hardly counts; a pair
    a decision would get badly wrong counts most)."""
    err = pred - target
    rel = np.abs(10.0**err - 1.0)
    regrets: list[float] = []
    agree = weight = 0.0
    by_key: dict[tuple[str, int], list[int]] = {}
    for i, k in enumerate(keys):
        by_key.setdefault(k, []).append(i)
    for rows in by_key.values():
        idx = np.asarray(rows)
        chosen = idx[int(np.argmin(pred[idx]))]
        regrets.append(float(10.0 ** (target[chosen] - target[idx].min())))
        t, p = target[idx], pred[idx]
        for start in range(0, len(idx), PAIR_BLOCK):  # a block of rows x all: n^2 in pieces
            block = slice(start, start + PAIR_BLOCK)
            true_gap = t[block, None] - t[None, :]
            pred_gap = p[block, None] - p[None, :]
            # each unordered pair once: column above the row
            above = np.arange(start, start + len(true_gap))[:, None] < np.arange(len(t))[None, :]
            w = np.where(above, np.abs(true_gap), 0.0)
            agree += float(np.sum(w * (np.sign(pred_gap) == np.sign(true_gap))))
            weight += float(np.sum(w))
    return {
        "rmse_log10": round(float(math.sqrt(np.mean(err**2))), 5),
        "median_relative_error": round(float(np.median(rel)), 5),
        "p90_relative_error": round(float(np.quantile(rel, 0.9)), 5),
        "system1_mean_slowdown_vs_best": round(float(np.mean(regrets)), 5),
        "system1_pct_of_best": round(float(100.0 * np.mean([1.0 / r for r in regrets])), 3),
        "pairwise_order": round(agree / weight, 5) if weight > 0 else 1.0,
    }


# How the runtime model is chosen among the candidates, from their leave-one-size-out scores:
# name -> (what it says, the sort key: lower is better, ties to the lower RMSE).
RUNTIME_SELECTIONS: dict[str, tuple[str, Callable[[dict[str, Any]], tuple[float, ...]]]] = {
    "rmse": (
        "lowest leave-one-size-out RMSE of log10 runtime",
        lambda s: (s["rmse_log10"],),
    ),
    "order": (
        "highest leave-one-size-out pairwise order (weighted by the measured gap)",
        lambda s: (-s["pairwise_order"], s["rmse_log10"]),
    ),
}


def choose_regressor(
    X: Array,
    y: Array,
    groups: Array,
    keys: Sequence[tuple[str, int]],
    seed: int,
    selection: str = "rmse",
    names: Sequence[str] | None = None,
) -> tuple[str, dict[str, dict[str, Any]], float]:
    """The candidate `selection` (RUNTIME_SELECTIONS) prefers among `names` (default: every
    one of regressor_candidates); returns its RMSE too (used by System 1's confidence)."""
    if selection not in RUNTIME_SELECTIONS:
        raise ValueError(
            f"runtime selection {selection!r}: accepted are {', '.join(RUNTIME_SELECTIONS)}"
        )
    results: dict[str, dict[str, Any]] = {}
    candidates = regressor_candidates(seed)
    unknown = sorted(set(names or ()) - set(candidates))
    if unknown:
        raise ValueError(
            f"runtime model candidates {unknown}: accepted are {', '.join(candidates)}"
        )
    for name, factory in candidates.items():
        if names is not None and name not in names:
            continue
        started = time.perf_counter()
        oof = np.zeros(len(y))
        for train, test in group_splits(groups):
            est = factory()
            est.fit(X[train], y[train])
            oof[test] = est.predict(X[test])
        scores: dict[str, Any] = dict(regression_scores(oof, y, keys))
        scores["cv_seconds"] = round(time.perf_counter() - started, 3)
        results[name] = scores
    rank = RUNTIME_SELECTIONS[selection][1]
    best = min(results, key=lambda n: rank(results[n]))
    return best, results, float(results[best]["rmse_log10"])
