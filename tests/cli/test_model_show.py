"""`hpc-ds1 model show` says how well the confidence discriminates (issue 43)."""

from __future__ import annotations

from typing import Any

from hpc_ds1.cli.modelinfo import render


def _described(discrimination: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "version": "v1", "name": "m", "path": "/m.onnx", "trained_at": "t", "device_id": "d",
        "hostname": "h", "cpu_model": "c", "logical_cpus": 2, "gpus": 0, "this_machine": True,
        "hardware_difference": None, "thresholds": {"auto": 0.85, "escalate": 0.5},
        "confidence_means": "unattended", "workloads": {}, "summary": [],
        "metrics": {"move_model": {"discrimination": discrimination}} if discrimination else {},
    }  # fmt: skip


def test_discrimination_is_shown_beside_the_calibration() -> None:
    found = {
        "decisions": 120,
        "auroc": 0.5,
        "brier": {"brier": 0.02, "resolution": 0.0},
        "selective_risk": {"at_threshold": {"threshold": 0.85, "coverage": 1.0, "risk": 0.02}},
    }
    text = render(_described(found))
    assert "right to run unattended" in text
    assert (
        "discrimination 120 out-of-fold decisions: AUROC 0.500 for ending < 5 % above the best, "
        "Brier 0.0200 (resolution 0.0000); at auto 100% taken, 2.0% of them wrong"
    ) in text
    none = {**found, "selective_risk": {"at_threshold": {"coverage": 0.0, "risk": None}}}
    assert "at auto none taken" in render(_described(none))
    assert "discrimination" not in render(_described(None))  # a file from before
