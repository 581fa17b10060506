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
    with pytest.raises(
        ValueError, match="calibrate_on='right': accepted are not_slower, good, unattended"
    ):
        train([], {}, calibrate_on="right")


def test_right_unattended_means_faster_beyond_the_noise_or_a_stop_that_leaves_2_percent() -> None:
    from hpc_ds1.model.calibration import move_unattended, stop_unattended, worse_than_best

    assert move_unattended(1.0, 0.01, 0.8, 0.01)  # clearly faster
    assert not move_unattended(1.0, 0.05, 0.97, 0.05)  # within the noise: an engineer's call
    assert not move_unattended(1.0, 0.01, None, None)  # failed
    assert stop_unattended(1.0, [0.99, 1.3]) and not stop_unattended(1.0, [0.97])
    assert worse_than_best(1.05, 1.0, [1.2]) and not worse_than_best(1.04, 1.0, [1.2])
    assert worse_than_best(1.0, 1.0, [0.9]) and worse_than_best(None, 1.0, [])
