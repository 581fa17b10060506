"""The size-relative runtime model (model/relative.py) on synthetic, exactly known runtimes."""

from __future__ import annotations

import numpy as np
from sklearn.ensemble import GradientBoostingRegressor

from hpc_ds1.model.relative import SizeRelative

N_WORK = 2


def landscape(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per size: log work columns; per configuration: one column; log runtime = 1.5 x log
    work + an effect of the configuration that turns over with size (best config changes)."""
    rows, ys = [], []
    for size in sizes:
        work = [np.log10(size**3), np.log10(size**2)]
        for config in (0, 1, 2, 3):
            effect = 0.1 * config if size < 40 else 0.3 - 0.1 * config
            rows.append([*work, float(config)])
            ys.append(1.5 * work[0] + effect)
    return np.asarray(rows), np.asarray(ys)


def tree() -> GradientBoostingRegressor:
    return GradientBoostingRegressor(n_estimators=100, max_depth=3, random_state=0)


def test_the_scale_follows_sizes_past_the_trained_ones_and_the_order_is_the_trees() -> None:
    X, y = landscape([16, 24, 32, 48, 64])
    model = SizeRelative(tree(), n_work=N_WORK).fit(X, y)
    plain = tree().fit(X, y)
    Xn, yn = landscape([128])  # twice the largest trained size
    err_relative = np.abs(model.predict(Xn) - yn).max()
    err_plain = np.abs(plain.predict(Xn) - yn).max()
    assert err_plain > 1.0  # the plain tree stays at size 64's runtimes, 8x less work
    assert err_relative < 0.25 * err_plain
    # at one size, the differences between configurations are the relative model's alone
    got = model.predict(Xn)
    assert np.allclose(got - got[0], model.relative_.predict(Xn) - model.relative_.predict(Xn)[0])
    assert int(np.argmin(got)) == int(np.argmin(yn)) == 3
    # the scale is linear in the work columns only: zero weight on the configuration column
    assert model.scale_.coef_[N_WORK:].tolist() == [0.0]


def test_the_relative_target_has_mean_zero_per_size() -> None:
    X, y = landscape([16, 24, 32, 48, 64])
    model = SizeRelative(tree(), n_work=N_WORK).fit(X, y)
    relative = model.relative_.predict(X).reshape(5, 4)
    assert np.abs(relative.mean(axis=1)).max() < 0.02  # fitted on y minus its size's mean
