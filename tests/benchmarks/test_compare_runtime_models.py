"""The runtime-model comparison's replay on the tiny real measurement set
(tests/support/measured.py), its held-out runs standing in for a truth pass: every model replays
every start of every cell, and a model compared with itself differs by exactly nothing. The
figures are the benchmark's."""

from __future__ import annotations

from benchmarks.compare_runtime_models import COLUMNS, VARIANTS, replay
from hpc_ds1.machine.hardware import Fingerprint
from hpc_ds1.model import Measurement, Model, train


def test_each_model_replays_every_start_and_a_model_against_itself_differs_by_zero(
    model: Model, measurements: list[Measurement], fp: Fingerprint
) -> None:
    wide = train(measurements, fp, seed=0, features=COLUMNS["all"], runtime_selection="rmse")
    models = {"current": model, "same": model, "wide": Model.from_onnx(wide.to_onnx())}
    truth = [m for m in measurements if m.held_out]
    got = replay(models, measurements, truth, seeds=[0])
    starts = sum(1 for m in measurements if m.held_out and m.ok)
    assert len(got["cells"]) == len({(m.workload, m.size) for m in measurements if m.held_out})
    rows = got["seeds"][0]["rows"]
    assert len(rows) == len(VARIANTS) * len(models)
    every_start = [r for r in rows if r["variant"].endswith(VARIANTS[0].name)]
    assert all(r["sessions"] == starts for r in every_start)
    assert rows[0] | {"variant": ""} == rows[1] | {"variant": ""}  # current and same
    for name, diff in got["seeds"][0]["differences"].items():
        if name.startswith("same - current"):
            assert diff["mean_difference"] == 0 and diff["cells_better"] == 0, diff
            assert diff["cells_worse"] == 0 and diff["cells"] == len(got["cells"])
    assert set(got["system1"]) == set(models)
    assert got["system1"]["current"] == got["system1"]["same"]
