"""The calibration benchmark's scoring on the tiny real measurement set (tests/support/measured.py):
one decision per held-out state, each figure a share. The figures are the benchmark's to print."""

from __future__ import annotations

from benchmarks.compare_calibration import FIGURES, scored
from hpc_ds1.model import Measurement, Model, Thresholds


def test_every_held_out_state_is_decided_once_and_scored(
    model: Model, measurements: list[Measurement]
) -> None:
    thresholds = Thresholds()
    states = {(m.workload, m.size, m.as_config()) for m in measurements if m.held_out and m.ok}
    found = scored(model, measurements, thresholds)
    assert found["decisions"] == len(states) > 0
    assert found["cells"] == len({(w, s) for w, s, _ in states})
    for key in FIGURES:
        if key != "auto_moves" and found[key] is not None:
            assert 0.0 <= found[key] <= 1.0, key
    assert 0 <= found["auto_moves"] <= found["decisions"]
    assert scored(model, measurements, thresholds) == found  # decisions are deterministic
