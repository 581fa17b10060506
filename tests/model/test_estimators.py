"""The runtime model's scores and its choice among the candidates (pure, hand-computed)."""

from __future__ import annotations

import numpy as np
import pytest

from hpc_ds1.model import estimators as est


def test_pairwise_order_weights_each_pair_by_its_measured_gap() -> None:
    keys = [("gemm", 1)] * 3 + [("gemm", 2)] * 2
    target = np.array([0.0, 0.1, 0.4, 1.0, 1.5])
    # size 1: (0,1) right (gap 0.1), (0,2) right (0.4), (1,2) wrong (0.3); size 2: right (0.5)
    pred = np.array([0.0, 0.3, 0.2, 1.2, 1.3])
    scores = est.regression_scores(pred, target, keys)
    assert scores["pairwise_order"] == pytest.approx((0.1 + 0.4 + 0.5) / (0.1 + 0.4 + 0.3 + 0.5))
    assert scores["system1_pct_of_best"] == pytest.approx(100.0)  # both argmins are right
    assert est.regression_scores(target + 5.0, target, keys)["pairwise_order"] == 1.0
    assert est.regression_scores(-target, target, keys)["pairwise_order"] == 0.0


def test_the_selection_decides_between_a_close_fit_and_a_right_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two fixed 'estimators': one near in value but wrong in order, one far off but in order."""

    class Fixed:
        def __init__(self, shift: float, flip: bool) -> None:
            self.shift, self.flip = shift, flip

        def fit(self, X: np.ndarray, y: np.ndarray) -> Fixed:
            return self

        def predict(self, X: np.ndarray) -> np.ndarray:
            values = X[:, 0] + self.shift
            if self.flip:  # swap the two configurations of each size
                values = values.reshape(-1, 2)[:, ::-1].reshape(-1)
            return values

    monkeypatch.setattr(
        est,
        "regressor_candidates",
        lambda seed: {"close": lambda: Fixed(0.0, True), "ordered": lambda: Fixed(0.5, False)},
    )
    X = np.array([[0.0], [0.05], [1.0], [1.05]])
    y = X[:, 0].copy()
    groups = np.array([0, 0, 1, 1])
    keys = [("w", 1), ("w", 1), ("w", 2), ("w", 2)]
    assert est.choose_regressor(X, y, groups, keys, 0, "rmse")[0] == "close"
    name, results, rmse = est.choose_regressor(X, y, groups, keys, 0, "order")
    assert name == "ordered" and rmse == results["ordered"]["rmse_log10"] == 0.5
    with pytest.raises(ValueError, match="accepted are rmse, order"):
        est.choose_regressor(X, y, groups, keys, 0, "r2")
