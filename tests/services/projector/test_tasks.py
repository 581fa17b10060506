"""The task lifecycle and device liveness folded into `tasks` and `devices`: repeated, late
and stale events change nothing, and a rebuild gives the same rows."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.audit import AuditFile
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import (
    DeviceDraining,
    DeviceLeft,
    DeviceRegistered,
    DeviceStatusChanged,
    Envelope,
    PlacementCandidate,
    TaskFailed,
    TaskFinished,
    TaskPlaced,
    TaskRequeued,
    TaskRunFailed,
    TaskStarted,
    TaskSubmitted,
    TaskWaiting,
    envelope,
    typed,
)
from hpc_ds1.fleet.tasks import fold
from hpc_ds1.services.projector import project, rebuild
from hpc_ds1.settings import Settings

CONFIG_A = {"ranks": 1, "threads": 2, "tile": 64}
CONFIG_B = {"ranks": 2, "threads": 1, "tile": 64}


def wrap(bus: EventBus, event: Any) -> Envelope:
    return envelope(event, actor="alice", source="test", prefix=bus.prefix)


def placed(task_id: str, attempt: int, device_id: str, config: dict[str, Any]) -> TaskPlaced:
    candidate = PlacementCandidate(
        device_id=device_id,
        finish_s=4.0,
        queue_s=1.0,
        runtime_s=3.0,
        basis="measured",
        config=config,
        accepted=True,
    )
    return TaskPlaced(
        task_id=task_id,
        attempt=attempt,
        device_id=device_id,
        config=config,
        expected_s=3.0,
        queue_s=1.0,
        basis="measured",
        reason=f"{device_id}: queue 1.0 s + best measured 3.0 s = 4.0 s",
        runner_up="other 9.0 s",
        candidates=[candidate],
    )


def finished(task_id: str, attempt: int, device_id: str, runtime_s: float) -> TaskFinished:
    return TaskFinished(
        task_id=task_id,
        attempt=attempt,
        device_id=device_id,
        config=CONFIG_B,
        runtime_s=runtime_s,
        expected_s=3.0,
        measurement_id=f"m-{runtime_s}",
    )


async def fold_all(settings: Settings, engine: Engine, bus: EventBus, events: list[Any]) -> None:
    await bus.publish_many([wrap(bus, e) for e in events])
    raw = [e async for chunk in bus.replay() for e in chunk]
    project(engine, raw, AuditFile(settings.audit_path))


async def agrees_with_the_pure_fold(bus: EventBus, row: dict[str, Any]) -> None:
    """The coordinator's fold (hpc_ds1.fleet.tasks) reads the task's history as the row does."""
    history = [(seq, typed(env)) for seq, env in await bus.history("task", row["task_id"])]
    state = fold([(seq, e) for seq, e in history if e is not None])
    assert (state.status, state.attempt, state.device_id) == (
        row["status"],
        row["attempt"],
        row["device_id"],
    )
    assert list(state.failures) == row["failures"]


def task(engine: Engine, task_id: str) -> dict[str, Any]:
    with engine.connect() as conn:
        query = select(tables.tasks).where(tables.tasks.c.task_id == task_id)
        return dict(conn.execute(query).mappings().one())


def snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    with engine.connect() as conn:
        return {
            t.name: [tuple(r) for r in conn.execute(select(t).order_by(*t.primary_key.columns))]
            for t in (tables.tasks, tables.devices)
        }


async def test_a_task_is_folded_through_requeue_and_stale_results_change_nothing(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    story = [
        TaskSubmitted(task_id="t1", workload="nbody", size=4096, submitted_by="alice"),
        TaskWaiting(task_id="t1", reason="no device is online"),
        placed("t1", 1, "dev-a", CONFIG_A),
        TaskStarted(task_id="t1", attempt=1, device_id="dev-a"),
        TaskRunFailed(task_id="t1", attempt=1, device_id="dev-a", error="exit 1"),
        TaskRunFailed(task_id="t1", attempt=1, device_id="dev-a", error="exit 1"),  # repeated
        TaskRequeued(task_id="t1", attempt=1, device_id="dev-a", reason="failed on dev-a: exit 1"),
        TaskRequeued(task_id="t1", attempt=1, device_id="dev-a", reason="again"),  # repeated
        placed("t1", 2, "dev-b", CONFIG_B),
        placed("t1", 1, "dev-a", CONFIG_A),  # an older placement, late
        TaskStarted(task_id="t1", attempt=1, device_id="dev-a"),  # the requeued attempt, late
        finished("t1", 1, "dev-a", 1.0),  # the requeued attempt's result, late
    ]
    await fold_all(settings, engine, bus, story)
    row = task(engine, "t1")
    assert (row["status"], row["attempt"], row["device_id"]) == ("placed", 2, "dev-b")
    assert row["config"] == CONFIG_B and row["started_at"] is None
    assert row["failures"] == ["failed on dev-a: exit 1"]
    assert row["placement"]["attempt"] == 2
    assert row["placement"]["candidates"][0]["device_id"] == "dev-b"
    assert (row["basis"], row["expected_s"], row["queue_s"]) == ("measured", 3.0, 1.0)
    assert row["reason"].startswith("dev-b: queue 1.0 s") and row["runner_up"] == "other 9.0 s"
    assert row["runtime_s"] is None and row["finished_at"] is None
    await agrees_with_the_pure_fold(bus, row)

    await fold_all(
        settings,
        engine,
        bus,
        [
            TaskStarted(task_id="t1", attempt=2, device_id="dev-b"),
            finished("t1", 2, "dev-b", 2.5),
            finished("t1", 2, "dev-b", 7.0),  # a second result of the same attempt
            TaskStarted(task_id="t1", attempt=2, device_id="dev-b"),  # a late start
            TaskRunFailed(task_id="t1", attempt=2, device_id="dev-b", error="late"),
            TaskRequeued(task_id="t1", attempt=2, device_id="dev-b", reason="dev-b went offline"),
            TaskFailed(task_id="t1", reasons=["x", "y", "z"]),
        ],
    )
    row = task(engine, "t1")
    assert (row["status"], row["runtime_s"], row["measurement_id"]) == ("finished", 2.5, "m-2.5")
    assert row["started_at"] is not None and row["finished_at"] >= row["started_at"]
    assert row["failures"] == ["failed on dev-a: exit 1"]
    await agrees_with_the_pure_fold(bus, row)


async def test_offline_requeues_and_a_final_failure_keep_every_reason_once(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    offline = "dev-a went offline: no heartbeat for 20 s"
    await fold_all(
        settings,
        engine,
        bus,
        [
            TaskSubmitted(task_id="t2", workload="gemm", size=512, submitted_by="bob"),
            placed("t2", 1, "dev-a", CONFIG_A),
            TaskRequeued(task_id="t2", attempt=1, device_id="dev-a", reason=offline),
            placed("t2", 2, "dev-a", CONFIG_A),
            TaskStarted(task_id="t2", attempt=2, device_id="dev-a"),
            TaskRequeued(task_id="t2", attempt=2, device_id="dev-a", reason=offline),
            TaskRequeued(task_id="t2", attempt=2, device_id="dev-a", reason=offline),
            placed("t2", 3, "dev-c", CONFIG_A),
            TaskRunFailed(task_id="t2", attempt=3, device_id="dev-c", error="wrong answer"),
        ],
    )
    row = task(engine, "t2")
    assert row["status"] == "placed" and row["attempt"] == 3
    assert row["failures"] == [offline, offline, "failed on dev-c: wrong answer"]
    await agrees_with_the_pure_fold(bus, row)
    reasons = [offline, offline, "failed on dev-c: wrong answer"]
    await fold_all(
        settings,
        engine,
        bus,
        [
            TaskFailed(task_id="t2", reasons=reasons),
            placed("t2", 4, "dev-d", CONFIG_A),  # nothing moves a failed task
            TaskFailed(task_id="t2", reasons=["other"]),
        ],
    )
    row = task(engine, "t2")
    assert (row["status"], row["attempt"], row["failures"]) == ("failed", 3, reasons)
    await agrees_with_the_pure_fold(bus, row)


async def test_device_draining_and_liveness_are_folded_and_a_rebuild_gives_the_same_rows(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    await fold_all(
        settings,
        engine,
        bus,
        [
            DeviceRegistered(device_id="dev-a", hostname="a"),
            DeviceRegistered(device_id="dev-b", hostname="b"),
            DeviceStatusChanged(device_id="dev-a", status="online"),
            DeviceStatusChanged(device_id="dev-b", status="online"),
            DeviceDraining(device_id="dev-a", draining=True, by="admin"),
            DeviceStatusChanged(
                device_id="dev-a", status="offline", reason="no heartbeat for 20 s"
            ),
            DeviceLeft(device_id="dev-b", reason="revoked"),
            TaskSubmitted(task_id="t3", workload="nbody", size=64, submitted_by="alice"),
            placed("t3", 1, "dev-b", CONFIG_A),
        ],
    )
    with engine.connect() as conn:
        rows = {r["device_id"]: r for r in conn.execute(select(tables.devices)).mappings().all()}
    a, b = rows["dev-a"], rows["dev-b"]
    assert (a["status"], a["draining"], a["liveness"]) == ("online", True, "offline")
    assert a["liveness_reason"] == "no heartbeat for 20 s"
    assert (b["status"], b["draining"], b["liveness"], b["liveness_reason"]) == (
        "left",
        False,
        "online",
        None,
    )
    live = snapshot(engine)
    assert await rebuild(engine, bus) == await bus.last_sequence()
    assert snapshot(engine) == live
