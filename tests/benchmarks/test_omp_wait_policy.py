"""The wait-policy benchmark's small version: one tiny job, one launch per policy, quiet only.
The verdict (which policy is quicker) is the benchmark's to print on a machine left alone."""

from __future__ import annotations

import os

import pytest

from benchmarks.omp_wait_policy import POLICIES, jobs, measure, spread
from hpc_ds1.machine.allocation import detect
from hpc_ds1.runner import Job
from hpc_ds1.space import Config


def test_the_job_set_uses_every_cpu_in_one_rank() -> None:
    batch = jobs(2, repeats=5)
    assert {j.workload for j in batch} == {"gemm", "stencil", "nbody", "montecarlo"}
    assert all(j.config.ranks == 1 and j.config.threads == 2 and j.repeats == 5 for j in batch)


def test_spread_is_the_robust_relative_spread() -> None:
    assert spread([1.0, 1.0, 1.0]) == 0.0
    assert spread([0.9, 1.0, 1.1]) == pytest.approx(1.4826 * 0.1)


def test_a_small_run_times_both_policies_and_puts_the_users_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    threads = min(2, detect().usable)  # a team of 2 where the box has 2 CPUs
    config = Config(ranks=1, threads=threads, tile=32)
    job = Job(workload="gemm", size=64, config=config, repeats=2)
    rows = measure([job], rounds=1, conditions=("quiet",))
    assert POLICIES == ("default", "PASSIVE")
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    (row,) = rows
    assert row["condition"] == "quiet" and row["job"].startswith(
        f"gemm 64 ranks=1 threads={threads}"
    )
    assert row["runs"] == 2
    assert row["default_median_s"] > 0 and row["passive_median_s"] > 0
    ratio = row["default_median_s"] / row["passive_median_s"]
    assert row["default_over_passive"] == pytest.approx(ratio)
