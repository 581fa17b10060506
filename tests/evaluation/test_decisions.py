"""The calibration summary's arithmetic on decisions built by hand (no measurement)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hpc_ds1.evaluation.decisions import Checked, calibration_summary, check_cell
from hpc_ds1.evaluation.landscape import Cell, Point
from hpc_ds1.model import Thresholds
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
