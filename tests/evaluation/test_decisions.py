"""The calibration summary's arithmetic on decisions built by hand (no measurement), with
issue 43's labels (right unattended, ending >= 5 % above the best) and their discrimination."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hpc_ds1.evaluation.decisions import Checked, calibration_summary, check_cell
from hpc_ds1.model import Thresholds
from hpc_ds1.model.replay import Cell, Point
from hpc_ds1.space import RANKS_UP, STOP, THREADS_UP, Config, ConfigSpace

HERE = Config(ranks=1, threads=1, tile=64)


def checked(choice: str, confidence: float, *, slower: bool, good: bool) -> Checked:
    mode = "auto" if confidence >= 0.85 else "confirm"
    return Checked("gemm", 640, HERE, choice, STOP, confidence, mode, (), False, slower, good)


def test_the_moves_alone_are_scored_apart_from_stop() -> None:
    checks = [
        checked(STOP, 0.55, slower=False, good=False),
        checked(STOP, 0.55, slower=False, good=True),
        checked(THREADS_UP, 0.9, slower=False, good=True),
        checked(THREADS_UP, 0.9, slower=True, good=False),
    ]
    cal = calibration_summary(checks, Thresholds(auto=0.85, escalate=0.5))
    # neither STOP leaves a gain behind: their bin states 0.55 against 1.0; the moves' bin
    # 0.9 against 0.5
    assert cal["ece_not_slower"] == pytest.approx(0.5 * 0.45 + 0.5 * 0.4)
    assert cal["moves"] == 2 and cal["moves_not_slower"] == 0.5
    assert cal["ece_not_slower_moves"] == pytest.approx(0.4)
    assert cal["ece_good_moves"] == pytest.approx(0.4)
    assert cal["ece_good"] == pytest.approx(0.5 * 0.05 + 0.5 * 0.4)
    assert cal["auto_moves"] == 2 and cal["auto_not_slower"] == 0.5


def test_no_moves_leaves_their_figures_empty() -> None:
    cal = calibration_summary(
        [checked(STOP, 0.7, slower=False, good=True)], Thresholds(auto=0.85, escalate=0.5)
    )
    assert cal["moves"] == 0 and cal["moves_not_slower"] is None
    assert cal["ece_not_slower_moves"] is None and cal["ece_not_slower"] == pytest.approx(0.3)


class Always:
    """Decides `choice` at every state with confidence 0.9 (check_cell reads no more)."""

    def __init__(self, choice: str) -> None:
        self.choice = choice

    def decide(self, state: Any, **_: Any) -> Any:
        return SimpleNamespace(
            choice=self.choice, confidence=0.9, mode="auto", reasons=[], distance=None,
            distance_threshold=None,
        )  # fmt: skip


def test_a_stop_that_leaves_a_gain_beyond_the_noise_behind_is_slower() -> None:
    space = ConfigSpace.for_cpus(2, (64,))
    cell = Cell(
        "gemm",
        640,
        {
            HERE: Point(1.0, 0.01, None),
            Config(ranks=1, threads=2, tile=64): Point(0.6, 0.01, None),  # THREADS_UP: faster
            Config(ranks=2, threads=1, tile=64): Point(0.99, 0.01, None),  # RANKS_UP: a tie
        },
        frozenset(),
    )
    thresholds = Thresholds(auto=0.85, escalate=0.5)

    def at_here(choice: str) -> Checked:
        found = check_cell(Always(choice), cell, lambda _: space, thresholds)
        return next(c for c in found if c.config == HERE)

    stop, faster, tie = at_here(STOP), at_here(THREADS_UP), at_here(RANKS_UP)
    assert stop.slower and not stop.right and not stop.good
    assert not faster.slower and faster.right and faster.good
    assert not tie.slower and not tie.right and tie.good  # within the noise: not slower
    # at the fastest configuration STOP leaves nothing behind
    best = Config(ranks=1, threads=2, tile=64)
    found = check_cell(Always(STOP), cell, lambda _: space, thresholds)
    assert not next(c for c in found if c.config == best).slower


def test_each_decision_records_unattended_and_whether_it_ends_5_pct_worse() -> None:
    space = ConfigSpace.for_cpus(2, (64,))
    best = Config(ranks=1, threads=2, tile=64)
    cell = Cell(
        "gemm",
        640,
        {
            HERE: Point(1.0, 0.01, None),
            best: Point(0.6, 0.01, None),  # THREADS_UP: faster beyond the noise
            Config(ranks=2, threads=1, tile=64): Point(0.99, 0.01, None),  # RANKS_UP: a tie
        },
        frozenset({Config(ranks=2, threads=2, tile=64)}),  # RANKS_UP from `best`: it failed
    )
    thresholds = Thresholds(auto=0.85, escalate=0.5)

    def at(config: Config, choice: str) -> Checked:
        found = check_cell(Always(choice), cell, lambda _: space, thresholds)
        return next(c for c in found if c.config == config)

    stop, faster, tie = at(HERE, STOP), at(HERE, THREADS_UP), at(HERE, RANKS_UP)
    # STOP leaves 40 % on the table: not unattended, and it ends >= 5 % above the best (0.6)
    assert not stop.unattended and stop.worse_5
    assert faster.unattended and not faster.worse_5
    # within the noise: not slower, yet not a gain and 65 % above the best available
    assert not tie.slower and not tie.unattended and tie.worse_5
    # at the fastest configuration STOP is right unattended and the best; a move to a
    # configuration that failed is neither
    assert at(best, STOP).unattended and not at(best, STOP).worse_5
    failed = at(best, RANKS_UP)
    assert not failed.unattended and failed.worse_5


def decided(confidence: float, *, worse_5: bool, unattended: bool | None = None) -> Checked:
    mode = "auto" if confidence >= 0.85 else "confirm" if confidence >= 0.5 else "escalate"
    fine = not worse_5 if unattended is None else unattended
    return Checked(
        "gemm", 640, HERE, THREADS_UP, STOP, confidence, mode, (), False, False, fine, fine,
        worse_5,
    )  # fmt: skip


def test_a_confidence_spike_at_the_base_rate_is_calibrated_and_tells_nothing() -> None:
    # 49 of 50 decisions end within 5 % of the best; every one stated at 0.98
    checks = [decided(0.98, worse_5=i == 0) for i in range(50)]
    cal = calibration_summary(checks, Thresholds(auto=0.85, escalate=0.5))
    assert cal["ece_unattended"] == pytest.approx(0.0)
    assert cal["reliability_unattended"] == [
        {"bin": "0.95–1.00", "decisions": 50, "mean_confidence": 0.98, "accuracy": 0.98}  # noqa: RUF001
    ]
    d = cal["discrimination"]
    assert d["auroc"] == 0.5 and d["unattended"]["auroc"] == 0.5
    assert d["brier"]["resolution"] == 0.0
    # one point: every decision is taken together
    assert d["selective_risk"]["curve"] == [{"coverage": 1.0, "risk": 0.02}]
    assert d["selective_risk"]["at_threshold"] == {"threshold": 0.85, "coverage": 1.0, "risk": 0.02}
    assert cal["mode_shares"] == {"auto": 1.0, "confirm": 0.0, "escalate": 0.0}
    assert cal["auto_within_5"] == 0.98 and cal["worse_5"] == 0.02


def test_perfect_separation_has_auroc_1_and_no_error_among_the_automatic() -> None:
    checks = [decided(0.9, worse_5=False) for _ in range(6)]
    checks += [decided(0.6, worse_5=True) for _ in range(3)]
    checks += [decided(0.3, worse_5=True)]
    cal = calibration_summary(checks, Thresholds(auto=0.85, escalate=0.5))
    d = cal["discrimination"]
    assert d["auroc"] == 1.0 and d["unattended"]["auroc"] == 1.0
    assert d["right_share"] == 0.6 and d["brier"]["resolution"] == pytest.approx(0.24)
    assert d["selective_risk"]["curve"][0] == {"coverage": 0.6, "risk": 0.0}
    assert d["selective_risk"]["curve"][-1] == {"coverage": 1.0, "risk": 0.4}
    assert d["selective_risk"]["at_threshold"] == {"threshold": 0.85, "coverage": 0.6, "risk": 0.0}
    assert cal["modes"] == {"auto": 6, "confirm": 3, "escalate": 1}
    assert cal["mode_shares"] == {"auto": 0.6, "confirm": 0.3, "escalate": 0.1}
    assert cal["auto_within_5"] == 1.0 and cal["auto_unattended"] == 1.0
    # the bins: 0.9 states 0.9 against 1.0; 0.6 against 0; 0.3 against 0
    assert cal["ece_unattended"] == pytest.approx(0.6 * 0.1 + 0.3 * 0.6 + 0.1 * 0.3)


def test_the_unattended_label_is_scored_apart_from_ending_within_5_pct() -> None:
    # a move within 5 % of the best that is no gain beyond the noise: fine for the 5 % figure,
    # not right unattended
    checks = [decided(0.9, worse_5=False, unattended=False), decided(0.4, worse_5=True)]
    cal = calibration_summary(checks, Thresholds(auto=0.85, escalate=0.5))
    assert cal["unattended"] == 0.0 and cal["auto_unattended"] == 0.0
    assert cal["auto_within_5"] == 1.0
    assert cal["discrimination"]["auroc"] == 1.0
    assert cal["discrimination"]["unattended"]["auroc"] is None  # one kind only


def test_no_decisions_leaves_the_new_figures_empty() -> None:
    cal = calibration_summary([], Thresholds(auto=0.85, escalate=0.5))
    assert cal["ece_unattended"] is None and cal["auto_within_5"] is None
    assert cal["mode_shares"] == {"auto": None, "confirm": None, "escalate": None}
    assert cal["discrimination"]["auroc"] is None
    assert cal["discrimination"]["selective_risk"] == {"curve": [], "at_threshold": None}
