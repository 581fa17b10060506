"""The keep rule: P(candidate faster) on log runtimes, racing an ambiguous move."""

from __future__ import annotations

import math
import random

import pytest

from hpc_ds1.runner.keep import (
    DEFAULT_RULE,
    OLD_RULE,
    KeepRule,
    Sample,
    judge,
    p_faster,
    sigma,
)


def draws(mean: float, rel_sigma: float, n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    return [Sample(mean * math.exp(rng.gauss(0.0, rel_sigma)), rel_sigma) for _ in range(n)]


def test_a_clear_gain_is_kept_a_clear_loss_is_a_miss_and_a_tie_is_within_noise() -> None:
    inc = [Sample(1.0, 0.02)]
    assert judge(inc, [Sample(0.90, 0.02)], 0).outcome == "keep"
    slower = judge(inc, [Sample(1.10, 0.02)], 0)
    assert slower.outcome == "revert" and slower.miss and not slower.within_noise
    # a tie after the last pair: reverted, but not a miss
    tie = judge(inc, [Sample(0.999, 0.02)], DEFAULT_RULE.max_pairs)
    assert tie.outcome == "revert" and tie.within_noise and not tie.miss


def test_a_5_percent_gain_at_2_percent_spread_is_kept_where_the_old_rule_missed_it() -> None:
    inc, cand = [Sample(1.0, 0.02)], [Sample(0.95, 0.02)]
    assert judge(inc, cand, 0).kept
    old = judge(inc, cand, 0, OLD_RULE)  # 3 * sqrt(2) * 2 % = 8.5 % needed
    assert old.outcome == "revert" and old.miss


def test_an_ambiguous_gain_races_and_more_runs_decide_it() -> None:
    inc, cand = [Sample(1.0, 0.03)], [Sample(0.97, 0.03)]
    first = judge(inc, cand, 0)
    assert first.outcome == "race" and 0.5 <= first.p_faster < 0.9
    # three consistent pairs: the same 3 % gain is now beyond the noise
    inc3 = [*inc, Sample(1.0, 0.03), Sample(1.005, 0.03), Sample(0.995, 0.03)]
    cand3 = [*cand, Sample(0.97, 0.03), Sample(0.968, 0.03), Sample(0.972, 0.03)]
    assert judge(inc3, cand3, 3).kept
    # a candidate that looks slower is not raced: reverted within the noise
    behind = judge(inc, [Sample(1.02, 0.03)], 0)
    assert behind.outcome == "revert" and behind.within_noise


def test_the_race_is_bounded() -> None:
    inc, cand = [Sample(1.0, 0.05)], [Sample(0.98, 0.05)]
    assert judge(inc, cand, 2).outcome == "race"
    assert judge(inc, cand, 3).outcome == "revert"
    assert judge(inc, cand, 0, KeepRule(max_pairs=0)).outcome == "revert"


def test_spread_between_runs_widens_sigma_and_the_floor_bounds_it_below() -> None:
    assert sigma([Sample(1.0, 0.0)]) == pytest.approx(DEFAULT_RULE.sigma_floor)
    assert sigma([Sample(1.0, 0.02)]) == pytest.approx(0.02)
    steady = sigma([Sample(1.0, 0.02), Sample(1.0, 0.02)])
    jumpy = sigma([Sample(1.0, 0.02), Sample(1.3, 0.02)])
    assert steady < 0.02 < jumpy


def test_p_faster_is_symmetric_and_calibrated_on_synthetic_samples() -> None:
    a, b = [Sample(1.0, 0.02)], [Sample(0.97, 0.03)]
    assert p_faster(a, b) + p_faster(b, a) == pytest.approx(1.0)
    # equal true runtimes: a keep (P >= 0.9) is a false keep; it must be rare
    false_keeps = sum(
        judge(draws(1.0, 0.03, 1, 2 * i), draws(1.0, 0.03, 1, 2 * i + 1), 0).kept
        for i in range(400)
    )
    assert false_keeps / 400 <= 0.12
    # a true 6 % gain at 3 % noise is kept most of the time after racing 3 pairs
    kept = sum(
        judge(draws(1.0, 0.03, 4, 2 * i), draws(0.94, 0.03, 4, 2 * i + 1), 3).kept
        for i in range(200)
    )
    assert kept / 200 >= 0.8


def test_bad_samples_and_bad_settings_are_refused_with_what_is_accepted() -> None:
    with pytest.raises(ValueError, match="no incumbent runs"):
        p_faster([], [Sample(1.0)])
    with pytest.raises(ValueError, match="finite and > 0"):
        p_faster([Sample(1.0)], [Sample(0.0)])
    with pytest.raises(ValueError, match=r"0\.5 < confidence < 1"):
        KeepRule(confidence=1.0)


def test_a_session_budget_stops_racing_once_the_session_has_raced_its_pairs() -> None:
    inc, cand = [Sample(1.0, 0.05)], [Sample(0.98, 0.05)]
    budget = KeepRule(session_pairs=2)
    assert judge(inc, cand, 0, budget, session_pairs_raced=1).outcome == "race"
    spent = judge(inc, cand, 0, budget, session_pairs_raced=2)
    assert spent.outcome == "revert" and spent.within_noise and not spent.miss
    # without a budget the session's count does not matter, only the move's own pairs
    assert judge(inc, cand, 0, DEFAULT_RULE, session_pairs_raced=50).outcome == "race"
    with pytest.raises(ValueError, match="session_pairs -1: accepted is 0 or more"):
        KeepRule(session_pairs=-1)
