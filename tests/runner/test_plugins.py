from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from hpc_ds1.runner import Job, Status, run, run_many
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import get_workload, list_workloads, register, registry, unregister
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
    other = plugins.VECTOR_SUM.__class__(**{**plugins.VECTOR_SUM.__dict__, "name": "gemm"})
    with pytest.raises(ValueError, match="already registered"):
        register(other)
    with pytest.raises(TypeError):
        register("gemm")  # type: ignore[arg-type]
