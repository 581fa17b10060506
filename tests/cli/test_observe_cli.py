"""`hpc-ds1 observe`: a production run's measured runtime becomes a measurement of the home's
device (purpose "observed"), read by training like setup's; bad input is exit 2 saying what is
accepted, before anything is recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine

from hpc_ds1.cli import main
from hpc_ds1.model.schema import Measurement
from hpc_ds1.settings import Settings
from services.trainer.training import load_measurements
from tests.support.commands import hpc


async def test_an_observed_run_is_a_measurement_training_reads(
    settings: Settings, engine: Engine
) -> None:
    done = await hpc(
        settings,
        *("observe", "--workload", "gemm", "--size", "256", "--ranks", "2", "--threads", "1"),
        *("--tile", "64", "--runtime-s", "0.125", "--json"),
    )
    assert done.returncode == 0, done.stderr
    recorded = json.loads(done.stdout)
    assert recorded["purpose"] == "observed" and recorded["status"] == "ok"
    device = recorded["device_id"]
    rows = load_measurements(engine, device)
    assert [r["measurement_id"] for r in rows] == [recorded["measurement_id"]]
    row = rows[0]
    assert row["runtime_s"] == pytest.approx(0.125)
    assert row["config"] == {"ranks": 2, "threads": 1, "tile": 64, "gpu": False}
    assert row["throughput"] == pytest.approx(2 * 256**3 / 0.125 / 1e9)  # GFLOP/s of gemm
    # Training takes it as it takes setup's rows.
    kept = Measurement.model_validate(row)
    assert kept.runtime_s == pytest.approx(0.125) and not kept.held_out

    text = await hpc(
        settings,
        *("observe", "--workload", "gemm", "--size", "256", "--ranks", "1", "--threads", "2"),
        *("--runtime-s", "0.2", "--failed"),
    )
    assert text.returncode == 0, text.stderr
    assert f"on device {device}" in text.stdout and "failed" in text.stdout
    statuses = sorted(r["status"] for r in load_measurements(engine, device))
    assert statuses == ["failed", "ok"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workload", "nope"], "unknown workload 'nope': known are"),
        (["--size", "0"], "--size must be a positive integer, not 0"),
        (["--ranks", "0"], "--ranks: Input should be greater than or equal to 1"),
        (["--runtime-s", "nan"], "--runtime-s must be a positive number of seconds"),
        (["--runtime-s", "0"], "--runtime-s must be a positive number of seconds"),
    ],
)
def test_bad_input_is_refused_before_anything_is_recorded(
    tmp_path: Path, args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = {"--workload": "gemm", "--size": "64", "--ranks": "1", "--threads": "1"}
    base["--runtime-s"] = "1.0"
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    argv = ["observe", "--home", str(tmp_path)] + [x for kv in base.items() for x in kv]
    assert main(argv) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "postgres").exists()  # nothing was started
