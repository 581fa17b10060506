"""The calibration summary's arithmetic on decisions built by hand (no measurement)."""

from __future__ import annotations

import pytest

from hpc_ds1.evaluation.decisions import Checked, calibration_summary
from hpc_ds1.model import Thresholds
from hpc_ds1.space import STOP, THREADS_UP, Config

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
    # STOP is never slower: its bin states 0.55 against 1.0; the moves' bin 0.9 against 0.5
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
