"""What a decision's confidence states the chance of: the calibration targets (pure logic)."""

from __future__ import annotations

import pytest

from hpc_ds1.model import train
from hpc_ds1.model.calibration import (
    move_good,
    move_not_slower,
    stop_good,
    stop_not_slower,
)


def test_a_move_is_not_slower_within_the_noise_of_the_two_runs() -> None:
    # 5 % slower at 1 % spreads: beyond max(2 %, 3 x 1.4 %) = 4.2 %: slower
    assert not move_not_slower(1.0, 0.01, 1.05, 0.01)
    # 5 % slower at 3 % spreads: inside 3 x 4.2 % = 12.7 %: not slower, but not good either
    assert move_not_slower(1.0, 0.03, 1.05, 0.03) and not move_good(1.0, 1.05)
    assert move_not_slower(1.0, 0.01, 0.5, 0.01)
    assert not move_not_slower(1.0, 0.01, None, None)  # a failed target


def test_stop_is_not_slower_when_its_fastest_neighbour_is_within_the_noise() -> None:
    assert stop_not_slower(1.0, 0.01, [])
    assert stop_not_slower(1.0, 0.01, [(0.99, 0.01), (1.2, 0.01)])
    assert not stop_not_slower(1.0, 0.01, [(1.2, 0.01), (0.9, 0.01)])
    # 4 % faster: more than good's 2 % tolerance, inside the noise of 2 % spreads (8.5 %)
    assert stop_not_slower(1.0, 0.02, [(0.96, 0.02)]) and not stop_good(1.0, [0.96])


def test_an_unknown_calibration_target_is_refused_before_anything_is_fitted() -> None:
    with pytest.raises(ValueError, match="calibrate_on='right': accepted are not_slower, good"):
        train([], {}, calibrate_on="right")
