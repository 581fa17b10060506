"""A runtime model made for ranking (issue 13): log runtime = the size's scale + the
configuration's runtime relative to it.

A tree fitted on absolute log runtime cannot follow a size past the ones it saw (its prediction
is flat there, while runtime grows with the work), so most of its error is the size's scale, and
that error says nothing about which configuration is faster. Here the scale is a linear model of
the work columns (log flops, bytes, memory ... : runtime grows smoothly with them and a linear
model extrapolates), fitted to each measured size's mean log runtime; the estimator `relative`
learns each configuration's log runtime minus its size's mean, the part that decides the order
of the configurations. A held-out size then gets the relative runtimes of the sizes nearest in
work, which is what transfer from the trained sizes does, learned per feature instead of per
size. The prediction is their sum; its differences between configurations of one size are the
relative model's alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.linear_model import LinearRegression, Ridge

from hpc_ds1.model.features import N_WORK

Array = npt.NDArray[Any]


class SizeRelative(RegressorMixin, BaseEstimator):  # type: ignore[misc]
    """`relative` on log runtime minus its size's mean; `scale_` (linear in the first
    `n_work` columns, zero weight on the others) on the size's mean."""

    def __init__(self, relative: Any = None, n_work: int = N_WORK, alpha: float = 1.0) -> None:
        self.relative = relative
        self.n_work = n_work
        self.alpha = alpha

    def fit(self, X: Array, y: Array) -> SizeRelative:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        work = X[:, : self.n_work]
        # a size is its work: the work columns are equal for every configuration of one size
        _, size_of, counts = np.unique(
            np.round(work, 9), axis=0, return_inverse=True, return_counts=True
        )
        size_of = size_of.reshape(-1)
        mean = np.bincount(size_of, weights=y) / counts
        scale = self._scale(work, mean[size_of], X.shape[1])
        self.scale_ = scale
        self.relative_ = clone(self.relative).fit(X, y - mean[size_of])
        return self

    def _scale(self, work: Array, target: Array, n_columns: int) -> LinearRegression:
        """Ridge on the standardized work columns, folded into one LinearRegression over every
        column (zero weight past the work): one MatMul in the ONNX graph."""
        centre, spread = work.mean(axis=0), work.std(axis=0)
        spread[spread == 0] = 1.0
        ridge = Ridge(alpha=self.alpha).fit((work - centre) / spread, target)
        coef = np.zeros(n_columns)
        coef[: self.n_work] = ridge.coef_ / spread
        linear = LinearRegression()
        linear.coef_ = coef
        linear.intercept_ = float(ridge.intercept_ - np.sum(ridge.coef_ * centre / spread))
        linear.n_features_in_ = n_columns
        return linear

    def predict(self, X: Array) -> Array:
        X = np.asarray(X, dtype=np.float64)
        return np.asarray(self.scale_.predict(X) + self.relative_.predict(X))
