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


def test_decision_features_name_the_choice_its_margin_and_its_predicted_gain() -> None:
    import numpy as np

    from hpc_ds1.model.calibration import decision_features

    proba = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])  # column 2 is STOP
    deltas = np.array([[-0.1, 0.05, np.nan], [-0.02, -0.3, np.nan]])
    f = decision_features(proba, deltas, stop_index=2)
    assert f[0, 0] == pytest.approx(np.log(0.7 / 0.3))
    assert f[0, 1] == pytest.approx(0.5) and f[1, 1] == pytest.approx(0.3)
    assert f[0, 2] == pytest.approx(0.1)  # a move: its own predicted speed-up
    assert f[1, 2] == pytest.approx(0.3)  # STOP: the largest speed-up it leaves
    # no move with a prediction: STOP leaves nothing
    assert decision_features(np.array([[0.2, 0.8]]), np.array([[np.nan, np.nan]]), 1)[0, 2] == 0


def test_the_logistic_map_is_kept_where_it_tells_what_the_raw_probability_cannot() -> None:
    """Every decision has the same raw probability, so the isotonic map is a constant (AUROC
    0.5); the predicted gain tells the right moves from the wrong ones, and held out (leave
    one size out) the logistic map separates them and scores the lower Brier score."""
    import numpy as np

    from hpc_ds1.model.calibration import Calibration, fit_and_score
    from hpc_ds1.model.discrimination import auroc

    rng = np.random.default_rng(0)
    n = 240
    gain = rng.uniform(-0.1, 0.1, n)
    good = gain > 0
    p = np.full(n, 0.6)
    stop = np.zeros(n, dtype=bool)
    groups = np.arange(n) % 4
    features = np.column_stack([np.full(n, np.log(0.6 / 0.4)), np.full(n, 0.2), gain])
    calibration, report = fit_and_score(p, stop, good, groups, "unattended", features)
    assert report["logistic"] == ["move"]
    assert report["brier_leave_one_size_out"]["move"]["logistic"] < 0.1
    assert report["brier_leave_one_size_out"]["move"]["isotonic"] > 0.2
    confidence = [calibration.confidence(0.6, False, f) for f in features]
    assert auroc(confidence, good) > 0.95
    assert calibration.confidence(0.6, False) == pytest.approx(good.mean(), abs=0.01)
    # the map travels in the model file and reads back the same
    again = Calibration.from_dict(calibration.as_dict())
    assert again.confidence(0.6, False, features[0]) == pytest.approx(
        calibration.confidence(0.6, False, features[0]), abs=1e-5
    )


def test_without_what_it_needs_the_logistic_map_is_left_out() -> None:
    import numpy as np

    from hpc_ds1.model.calibration import fit_and_score

    n = 120
    p = np.linspace(0.3, 0.95, n)
    good = p > 0.6  # the raw probability already separates them
    stop = np.zeros(n, dtype=bool)
    groups = np.arange(n) % 3
    noise = np.random.default_rng(1).normal(size=(n, 3))
    calibration, report = fit_and_score(p, stop, good, groups, "unattended", noise)
    assert report["logistic"] == []  # noise features do not beat the isotonic map held out
    assert not calibration.logistic
    _, report = fit_and_score(p, stop, good, groups, "unattended")
    assert report["logistic"] == [] and report["brier_leave_one_size_out"] == {}
