"""One attempt's result and its events, as every device reports them: a run becomes a result the
coordinator accepts (no NaN, errors within bounds), a refused job is a failure without a
measurement, the events carry deterministic ids, a failed check is not a finished task; a job
the runner refuses is not launched."""

from __future__ import annotations

from pathlib import Path

from hpc_ds1.fleet.execute import (
    MAX_ERROR,
    TaskResult,
    from_run,
    refused,
    run_work_item,
    task_events,
)
from hpc_ds1.fleet.work import WorkItem
from hpc_ds1.runner import RunResult, Status
from hpc_ds1.space import Config

CONFIG = Config(ranks=1, threads=1, tile=4096)


def item(**extra: object) -> WorkItem:
    fields: dict[str, object] = {
        "task_id": "t1",
        "attempt": 3,
        "device_id": "dev-a",
        "workload": "montecarlo",
        "size": 100_000,
        "config": CONFIG.model_dump(),
        "expected_s": 0.5,
        **extra,
    }
    return WorkItem.model_validate(fields)


def run_result(**extra: object) -> RunResult:
    fields: dict[str, object] = {
        "workload": "montecarlo",
        "size": 100_000,
        "config": CONFIG,
        "status": Status.OK,
        "runtime_s": 0.25,
        "repeats": 1,
        "spread": 0.0,
        "check_ok": True,
        **extra,
    }
    return RunResult.model_validate(fields)


def events(result: TaskResult) -> list[tuple[str, str]]:
    envs = task_events(
        "t1",
        "dev-a",
        result,
        workload="montecarlo",
        size=100_000,
        expected_s=0.5,
        actor="agent",
        source="agent",
        prefix="hpcds1",
    )
    assert all(e.correlation_id == "t1" for e in envs)
    return [(e.type, e.id) for e in envs]


def test_an_ok_run_is_a_measurement_then_finished_under_fixed_ids() -> None:
    result = from_run(item(), run_result())
    assert result.status == "ok" and result.runtime_s == 0.25 and result.ran
    assert events(result) == [
        ("measurement.recorded", "measurement-task-t1-3"),
        ("task.finished", "finished-t1-3"),
    ]


def test_a_failed_check_or_run_is_a_run_failure_with_its_measurement() -> None:
    wrong = from_run(
        item(),
        run_result(status=Status.WRONG_ANSWER, check_ok=False, check_detail="pi off by 3"),
    )
    assert wrong.status == "wrong_answer" and wrong.error == "wrong answer: pi off by 3"
    assert events(wrong)[-1] == ("task.run_failed", "runfailed-t1-3")
    ok_but_wrong = TaskResult(
        attempt=3, status="ok", config=CONFIG.model_dump(), runtime_s=1.0, repeats=1, check_ok=False
    )
    assert [kind for kind, _ in events(ok_but_wrong)] == ["measurement.recorded", "task.run_failed"]


def test_numbers_a_coordinator_refuses_are_left_out() -> None:
    result = from_run(item(), run_result(runtime_s=float("nan"), spread=float("inf")))
    assert result.status == "failed" and result.runtime_s is None and result.spread is None
    assert result.error == "the run reported no runtime"
    long = from_run(item(), run_result(status=Status.FAILED, error="x" * 10_000 + "the cause"))
    assert long.error is not None and len(long.error) <= MAX_ERROR
    assert long.error.endswith("the cause")


def test_a_refused_job_is_a_failure_without_a_measurement(tmp_path: Path) -> None:
    bad = item(config={"ranks": 1, "threads": 1, "tile": 3})
    result = run_work_item(bad, home=tmp_path, max_run_s=60)
    assert result.status == "failed" and not result.ran
    assert result.error is not None and "tile=3 is not accepted" in result.error
    assert events(result) == [("task.run_failed", "runfailed-t1-3")]
    assert not (tmp_path / "device.lock").exists()  # refused before taking the device

    too_long = run_work_item(item(expected_s=100.0), home=tmp_path, max_run_s=60)
    assert too_long.status == "failed" and "past the cap of 60 s" in (too_long.error or "")

    unknown = run_work_item(item(workload="no-such-workload"), home=tmp_path, max_run_s=60)
    assert unknown.status == "failed" and "no-such-workload" in (unknown.error or "")
    assert refused(bad, "why").model_dump(exclude_none=True) == {
        "attempt": 3,
        "status": "failed",
        "config": {"ranks": 1, "threads": 1, "tile": 3},
        "error": "why",
    }
