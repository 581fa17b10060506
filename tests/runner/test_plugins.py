from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from hpc_ds1.runner import Job, Status, protocol, run, run_many
from hpc_ds1.runner.api import _early_exit, job_env, mpiexec_path
from hpc_ds1.runner.jobspec import JobSpec
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import (
    UnknownWorkload,
    get_workload,
    list_workloads,
    preserved,
    register,
    registry,
    unregister,
)
from tests.runner import plugins


@pytest.fixture
def registered() -> object:
    for wl in (plugins.VECTOR_SUM, plugins.BROKEN, plugins.LIAR):
        register(wl, replace=True)
    yield
    for wl in (plugins.VECTOR_SUM, plugins.BROKEN, plugins.LIAR):
        unregister(wl.name)


def test_plugin_workload_runs_through_the_runner(registered: object) -> None:
    assert "test-vector-sum" in list_workloads()
    results = run_many(
        [
            Job(workload="test-vector-sum", size=1000, config=Config(ranks=r, threads=1, tile=1))
            for r in (1, 2, 4)
        ]
    )
    assert [r.status for r in results] == [Status.OK] * 3
    assert all(r.check_ok and r.check_error == 0.0 for r in results)
    assert "module=tests.runner.plugins" in results[0].command


def test_a_plugin_kernel_calling_blas_runs() -> None:
    """The rank program skips numba's BLAS probe for built-in kernels only (rank.py): a
    plug-in's jitted np.dot still finds BLAS."""
    space = ConfigSpace.for_cpus(2, plugins.JITTED_DOT.tiles)
    try:
        result = run(plugins.JITTED_DOT, 80, Config(ranks=1, threads=1, tile=1), space=space)
    finally:
        unregister(plugins.JITTED_DOT.name)
    assert result.status is Status.OK, result.error
    assert result.check_ok


def test_plugin_by_object_without_prior_registration() -> None:
    unregister(plugins.VECTOR_SUM.name)
    space = ConfigSpace.for_cpus(2, plugins.VECTOR_SUM.tiles)
    r = run(plugins.VECTOR_SUM, 99, Config(ranks=2, threads=1, tile=2), space=space)
    assert r.status is Status.OK
    unregister(plugins.VECTOR_SUM.name)


def test_failure_and_wrong_answer_do_not_stop_the_batch(registered: object) -> None:
    c = Config(ranks=2, threads=1, tile=1)
    jobs = [
        Job(workload="test-broken", size=5, config=c, repeats=1),
        Job(workload="test-vector-sum", size=10, config=c, repeats=1),
        Job(workload="test-liar", size=10, config=c, repeats=1),
    ]
    broken, fine, liar = run_many(jobs, timeout_s=60)
    assert broken.status is Status.FAILED and "broken on purpose" in broken.error
    assert fine.status is Status.OK
    assert liar.status is Status.WRONG_ANSWER and liar.check_ok is False


def test_a_failing_rank_reports_its_error_in_the_file_before_the_abort(tmp_path: Path) -> None:
    """MPI_Abort may kill the launcher's proxies before a rank's last stdout line is forwarded;
    the report file holds the error whatever the abort took with it."""
    report = tmp_path / "report"
    spec = JobSpec("test-broken", 5, 1, 1, 1, module="tests.runner.plugins")
    argv = [mpiexec_path(), "-n", "2", sys.executable, "-m", "hpc_ds1.runner.rank"]
    argv += ["--job", spec.encode(), "--report-file", str(report)]
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(argv, env=job_env(1), capture_output=True, text=True, cwd=root)
    assert done.returncode != 0
    error = protocol.reported_error(report)
    assert error is not None and error["rank"] == 1
    assert error["error"] == "RuntimeError: broken on purpose"
    assert "RuntimeWarning" not in done.stderr  # `-m hpc_ds1.runner.rank` is imported once


def test_an_early_exit_says_the_reported_error_not_a_cut_stderr(tmp_path: Path) -> None:
    report = tmp_path / "report"
    cut = 'Traceback (most recent call last):\n  File "rank.py", line 135, in main'
    assert _early_exit(report, cut) == (Status.FAILED, cut)  # no file: the stderr it has
    assert _early_exit(report, "")[1] == "rank program exited early"
    protocol.report(str(report), {"event": "start", "index": 0})
    protocol.report(str(report), {"event": "error", "rank": 1, "error": "RuntimeError: x"})
    assert _early_exit(report, cut) == (Status.FAILED, "rank 1: RuntimeError: x")
    # a report file that cannot be written costs the runner the file, never the rank its abort
    protocol.report(str(tmp_path / "gone" / "report"), {"event": "error"})
    assert not (tmp_path / "gone").exists()


def test_entry_point_group_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = EntryPoint(
        name="liar", value="tests.runner.plugins:LIAR", group=registry.ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep])
    monkeypatch.setattr(registry, "_loaded", False)
    unregister("test-liar")
    try:
        assert get_workload("test-liar") is plugins.LIAR
    finally:
        unregister("test-liar")


def test_register_rejects_a_clash() -> None:
    get_workload("gemm")  # the built-ins are registered on the first lookup
    other = plugins.VECTOR_SUM.__class__(**{**plugins.VECTOR_SUM.__dict__, "name": "gemm"})
    with pytest.raises(ValueError, match="already registered"):
        register(other)
    with pytest.raises(TypeError):
        register("gemm")  # type: ignore[arg-type]


def test_what_is_registered_inside_preserved_is_forgotten_on_leaving() -> None:
    before = list_workloads()
    with preserved():
        register(plugins.VECTOR_SUM, replace=True)
        assert plugins.VECTOR_SUM.name in list_workloads()
    assert list_workloads() == before
    with pytest.raises(UnknownWorkload) as unknown:
        get_workload("no-such-workload")
    assert plugins.VECTOR_SUM.name not in str(unknown.value)
