from __future__ import annotations

import pytest

from hpc_ds1.runner import is_faster, noise_threshold, relative_spread
from hpc_ds1.runner.noise import coefficient_of_variation


def test_spread_is_robust_and_relative() -> None:
    assert relative_spread([1.0]) == 0.0
    assert relative_spread([1.0, 1.0, 1.0]) == 0.0
    assert relative_spread([1.0, 1.1, 0.9, 1.0, 5.0]) == pytest.approx(1.4826 * 0.1 / 1.0)
    assert relative_spread([2.0, 2.2, 1.8, 2.0, 10.0]) == pytest.approx(
        relative_spread([1.0, 1.1, 0.9, 1.0, 5.0])
    )
    assert coefficient_of_variation([1.0, 1.0]) == 0.0


def test_faster_means_faster_than_noise() -> None:
    assert noise_threshold(0.0, 0.0) == 0.02  # floor
    assert noise_threshold(0.05, 0.05) == pytest.approx(3 * (2 * 0.05**2) ** 0.5)
    assert not is_faster(0.95, 0.05, 1.0, 0.05)  # 5% better, but the noise is ~21%
    assert is_faster(0.5, 0.05, 1.0, 0.05)
    assert is_faster(0.97, 0.0, 1.0, 0.0) and not is_faster(0.99, 0.0, 1.0, 0.0)
