"""Discrimination of a confidence (issue 43): hand-made cases with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from hpc_ds1.model.discrimination import auroc, brier, report, selective_risk


def test_a_confidence_stuck_at_the_base_rate_does_not_discriminate() -> None:
    right = np.array([True] * 98 + [False] * 2)
    spike = np.full(100, 0.98)
    assert auroc(spike, right) == 0.5
    parts = brier(spike, right)
    assert parts is not None and parts["resolution"] == 0.0  # perfectly calibrated, useless
    assert parts["reliability"] == pytest.approx(0.0)
    curve = selective_risk(spike, right)["curve"]
    assert curve == [{"coverage": 1.0, "risk": 0.02}]  # one point: nothing to choose from


def test_perfect_separation_has_auroc_1_and_a_curve_that_starts_at_0() -> None:
    confidence = np.array([0.9, 0.8, 0.7, 0.3, 0.2])
    right = np.array([True, True, True, False, False])
    assert auroc(confidence, right) == 1.0
    assert auroc(confidence, ~right) == 0.0
    curve = selective_risk(confidence, right, coverages=(0.2, 0.6, 0.8, 1.0))["curve"]
    assert [p["risk"] for p in curve] == [0.0, 0.0, 0.25, 0.4]
    at = selective_risk(confidence, right, threshold=0.75)["at_threshold"]
    assert at == {"threshold": 0.75, "coverage": 0.4, "risk": 0.0}


def test_auroc_counts_ties_a_half_and_needs_both_kinds() -> None:
    assert auroc([0.5, 0.5], [True, False]) == 0.5
    assert auroc([0.6, 0.5, 0.5], [True, True, False]) == 0.75
    assert auroc([0.6, 0.5], [True, True]) is None
    with pytest.raises(ValueError, match="2 confidences for 3 outcomes"):
        auroc([0.1, 0.2], [True, False, True])


def test_the_brier_decomposition_adds_up() -> None:
    rng = np.random.default_rng(0)
    confidence = rng.choice([0.1, 0.5, 0.7, 0.95], size=400)
    right = rng.random(400) < confidence * 0.9
    parts = brier(confidence, right)
    assert parts is not None
    assert parts["brier"] == pytest.approx(
        parts["reliability"] - parts["resolution"] + parts["uncertainty"]
    )
    assert parts["resolution"] > 0
    whole = report(confidence, right, threshold=0.85)
    assert whole["decisions"] == 400 and 0.5 < whole["auroc"] <= 1
    assert whole["selective_risk"]["at_threshold"]["coverage"] == pytest.approx(
        float(np.mean(confidence >= 0.85)), abs=1e-4
    )
