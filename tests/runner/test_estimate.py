"""Expected durations before a run: the nearest measurement scaled by declared work (this
configuration's when measured), the model otherwise; past the cap, a refusal that explains."""

from __future__ import annotations

import pytest

from hpc_ds1.runner.checks import InvalidJob
from hpc_ds1.runner.estimate import (
    Measured,
    RunTooLong,
    check_cap,
    from_measurements,
    from_model,
    measured_rows,
)
from hpc_ds1.space import Config
from hpc_ds1.workloads import get_workload

GEMM = get_workload("gemm")
ONE = Config(ranks=1, threads=1, tile=GEMM.default_tile)
TWO = Config(ranks=2, threads=1, tile=GEMM.default_tile)


def test_the_nearest_size_of_the_same_configuration_is_scaled_by_work() -> None:
    measured = [
        Measured(100, ONE, 0.001),
        Measured(1000, ONE, 1.0),
        Measured(2000, TWO, 100.0),  # nearer, but another configuration
    ]
    estimate = from_measurements(GEMM, 2000, ONE, measured, repeats=3)
    assert estimate is not None
    assert estimate.per_run_s == pytest.approx(8.0)  # gemm work grows as n^3
    assert estimate.runs == 4 and estimate.total_s == pytest.approx(32.0)
    assert "size 1000 (this configuration)" in estimate.how and "flops: 8x" in estimate.how


def test_another_configuration_is_used_when_this_one_was_never_measured() -> None:
    estimate = from_measurements(GEMM, 1000, ONE, [Measured(500, TWO, 0.5)], repeats=1)
    assert estimate is not None and estimate.per_run_s == pytest.approx(4.0)
    assert f"configuration {TWO.label()}" in estimate.how
    assert from_measurements(GEMM, 1000, ONE, [], repeats=1) is None


def test_past_the_cap_is_refused_with_the_estimate_and_how() -> None:
    estimate = from_model(300.0, repeats=3, model_version="abc123")
    assert check_cap(estimate, 1200.0, "gemm", 4096) is estimate
    with pytest.raises(RunTooLong) as caught:
        check_cap(estimate, 600.0, "gemm", 4096)
    message = str(caught.value)
    assert isinstance(caught.value, InvalidJob)
    assert "gemm size 4096 would run for about 20 min" in message
    assert "4 runs" not in message and "3 timed runs of about 5 min each" in message
    assert "predicted by the device's model abc123" in message
    assert "cap of 600 s" in message and "HPC_DS1_MAX_RUN_S" in message
    assert check_cap(None, 1.0, "gemm", 4096) is None  # nothing to go by: the timeout caps it


def test_only_successful_rows_count() -> None:
    rows = [
        {"size": 10, "config": ONE.model_dump(), "status": "ok", "runtime_s": 0.5},
        {"size": 20, "config": ONE.model_dump(), "status": "failed", "runtime_s": None},
        {"size": 30, "config": {"ranks": 0}, "status": "ok", "runtime_s": 0.5},
        {"size": 40, "config": ONE.model_dump(), "status": "ok", "runtime_s": 0.0},
    ]
    assert measured_rows(rows) == [Measured(10, ONE, 0.5)]
