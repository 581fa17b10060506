"""Every built-in workload under real `mpiexec` ranks, in every configuration of this machine's
space (ranks 1, 2, 4; threads 1, 2; each tile; each of the stencil's temporal blocks, whose
halo planes come from the neighbouring ranks), on small sizes, checked for correctness."""

from __future__ import annotations

import pytest

from hpc_ds1.runner import Job, RunResult, Status, run, run_many
from hpc_ds1.space import Config, ConfigSpace

SMALL = {"gemm": 67, "stencil": 14, "nbody": 50, "montecarlo": 20_000}


@pytest.fixture(scope="module")
def results() -> list[RunResult]:
    jobs = []
    for name, size in SMALL.items():
        for config in ConfigSpace.for_device(workload=name).configs():
            jobs.append(Job(workload=name, size=size, config=config, repeats=2))
    return run_many(jobs, timeout_s=180)


def test_space_includes_ranks_1_2_4() -> None:
    assert {1, 2, 4} <= set(ConfigSpace.for_device(workload="gemm").ranks)


def test_all_configurations_run_correctly(results: list[RunResult]) -> None:
    assert results
    bad = [(r.workload, r.config.label(), r.status, r.error) for r in results if not r.ok]
    assert not bad
    seen = {(r.workload, r.config) for r in results}
    for name in SMALL:
        for config in ConfigSpace.for_device(workload=name).configs():
            assert (name, config) in seen
    assert {r.config.block for r in results if r.workload == "stencil"} == {0, 2, 4}


def test_results_carry_measurements(results: list[RunResult]) -> None:
    for r in results:
        assert r.check_ok is True and r.check_error is not None
        assert r.runtime_s is not None and r.runtime_s > 0
        assert r.repeats == 2 and len(r.runtimes_s) == 2 and r.spread is not None
        assert r.throughput is not None and r.throughput > 0
        assert r.peak_memory_bytes is not None and r.peak_memory_bytes > 0
        assert r.startup_s is not None and r.jit_s is not None
        assert f"-n {r.config.ranks}" in r.command and "hpc_ds1.runner.rank" in r.command
        assert r.check_detail


def test_single_run_and_json_round_trip() -> None:
    r = run("gemm", 48, Config(ranks=2, threads=1, tile=32), repeats=1)
    assert r.status is Status.OK
    again = RunResult.model_validate_json(r.model_dump_json())
    assert again == r
