"""The local agent as a device of the fleet, against real NATS, Postgres and runs: a WorkItem on
its queue is started, run for real and recorded (task.started, a measurement of purpose "task",
task.finished with the measured runtime), each event under its deterministic id; a job the
runner refuses and a run past the cap are task.run_failed with the reason; an attempt that is
no longer current is not run; the agent's heartbeats are in the liveness bucket."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.events import Envelope, TaskPlaced, TaskSubmitted, envelope
from hpc_ds1.fleet.liveness import last_beat, liveness_bucket
from hpc_ds1.fleet.work import WorkItem, enqueue, ensure_work_stream
from hpc_ds1.settings import Settings
from hpc_ds1.stack import Stack, open_stack
from hpc_ds1.workloads import command_workload, get_workload, register, unregister
from hpc_ds1.workloads.recorded import recorded_workload
from tests.support.waiting import until

WAIT_S = 90.0
MONTECARLO = {"ranks": 1, "threads": 1, "tile": get_workload("montecarlo").default_tile}


@pytest.fixture
async def local(settings: Settings, engine: Engine) -> AsyncIterator[tuple[Stack, str]]:
    async with open_stack(
        settings, ("projector", "agent"), "test-fleet", fleet_device=True
    ) as stack:
        yield stack, await stack.local_device()


async def place(
    stack: Stack,
    device_id: str,
    workload: str,
    size: int,
    config: dict[str, Any],
    attempts: int = 1,
) -> str:
    """A task submitted and placed on `device_id` (attempts 1..`attempts`), as placement does."""
    task_id = uuid.uuid4().hex[:16]
    prefix = stack.bus.prefix
    events: list[Any] = [
        TaskSubmitted(task_id=task_id, workload=workload, size=size, submitted_by="tester")
    ]
    for attempt in range(1, attempts + 1):
        events.append(
            TaskPlaced(
                task_id=task_id,
                attempt=attempt,
                device_id=device_id,
                config=config,
                expected_s=0.1,
                queue_s=0.0,
                basis="measured",
                reason="test",
            )
        )
    for event in events:
        await stack.bus.publish(envelope(event, actor="test", source="test", prefix=prefix))
    return task_id


async def put(stack: Stack, settings: Settings, item: WorkItem) -> None:
    await enqueue(stack.bus.js, settings, item)


async def history(stack: Stack, task_id: str) -> list[Envelope]:
    return [env for _, env in await stack.bus.history("task", task_id)]


async def wait_for_event(stack: Stack, task_id: str, kind: str) -> Envelope:
    async def event() -> Envelope | None:
        return next((env for env in await history(stack, task_id) if env.type == kind), None)

    found: Envelope = await until(f"{kind} of task {task_id}", event, WAIT_S, every_s=0.1)
    return found


def measurement(engine: Engine, measurement_id: str) -> dict[str, Any] | None:
    m = tables.measurements
    with engine.connect() as conn:
        row = conn.execute(select(m).where(m.c.measurement_id == measurement_id)).first()
    return None if row is None else dict(row._mapping)


async def test_a_task_on_the_local_queue_runs_for_real_and_is_recorded(
    local: tuple[Stack, str], settings: Settings, engine: Engine
) -> None:
    stack, device_id = local
    task_id = await place(stack, device_id, "montecarlo", 100_000, MONTECARLO)
    await put(
        stack,
        settings,
        WorkItem(
            task_id=task_id,
            attempt=1,
            device_id=device_id,
            workload="montecarlo",
            size=100_000,
            config=MONTECARLO,
            expected_s=0.1,
        ),
    )
    finished = await wait_for_event(stack, task_id, "task.finished")
    envs = await history(stack, task_id)
    kinds = [e.type for e in envs]
    assert kinds.index("task.started") < kinds.index("task.finished")
    assert "task.run_failed" not in kinds
    started = next(e for e in envs if e.type == "task.started")
    assert started.id == f"started-{task_id}-1"
    assert started.data["device_id"] == device_id
    assert finished.id == f"finished-{task_id}-1"
    assert finished.data["device_id"] == device_id and finished.data["attempt"] == 1
    assert finished.data["runtime_s"] > 0
    assert finished.data["config"] == {**MONTECARLO, "gpu": False}
    assert finished.data["expected_s"] == 0.1
    mid = finished.data["measurement_id"]
    assert mid == f"task-{task_id}-1"

    await stack.caught_up()
    row = await asyncio.to_thread(measurement, engine, mid)
    assert row is not None, "the task's run is not among the measurements"
    assert row["purpose"] == "task" and row["status"] == "ok"
    assert row["device_id"] == device_id and row["workload"] == "montecarlo"
    assert row["runtime_s"] == finished.data["runtime_s"]
    t = tables.tasks
    with engine.connect() as conn:
        task = conn.execute(select(t).where(t.c.task_id == task_id)).one()
    assert task.status == "finished" and task.runtime_s == finished.data["runtime_s"]

    # The agent says it is alive, as its device, in the liveness bucket.
    kv = await liveness_bucket(stack.bus.js, settings)
    beat = await last_beat(kv, device_id)
    assert beat is not None and beat.device_id == device_id
    assert abs(beat.time - time.time()) < settings.offline_after_s


async def test_a_job_the_runner_refuses_is_a_run_failure_without_a_measurement(
    local: tuple[Stack, str], settings: Settings, engine: Engine
) -> None:
    stack, device_id = local
    bad = {**MONTECARLO, "tile": 3}  # not one of montecarlo's tiles
    task_id = await place(stack, device_id, "montecarlo", 100_000, bad)
    await put(
        stack,
        settings,
        WorkItem(
            task_id=task_id,
            attempt=1,
            device_id=device_id,
            workload="montecarlo",
            size=100_000,
            config=bad,
        ),
    )
    failed = await wait_for_event(stack, task_id, "task.run_failed")
    assert failed.id == f"runfailed-{task_id}-1"
    assert "tile=3 is not accepted" in failed.data["error"], failed.data
    envs = await history(stack, task_id)
    assert "task.finished" not in [e.type for e in envs]
    await stack.caught_up()
    assert await asyncio.to_thread(measurement, engine, f"task-{task_id}-1") is None


@pytest.fixture
def replayed() -> Any:
    """The A6000 convolution fixture replayed as a workload (a recorded GPU, issue 42)."""
    data = Path(__file__).resolve().parents[2] / "tuning" / "data"
    wl = recorded_workload(
        "test-fleet-replayed",
        data / "convolution_milo_A6000_cut.json",
        data / "convolution_milo_cut.json",
    )
    register(wl, replace=True)
    yield wl
    unregister(wl.name)


async def test_a_task_of_a_recorded_gpu_is_replayed_and_recorded(
    local: tuple[Stack, str], settings: Settings, engine: Engine, replayed: Any
) -> None:
    """An agent whose home holds a recorded workload stands for that GPU: a task placed on it
    runs one draw of the recorded repeats per timed repeat, and is recorded as any run is."""
    stack, device_id = local
    landscape = replayed.landscape()
    ran = next(c for c, r in landscape.records.items() if not isinstance(r, str))
    config = {"ranks": 1, "threads": 1, "tile": 1, "knobs": landscape.space.as_dict(ran)}
    task_id = await place(stack, device_id, replayed.name, 1, config)
    item = WorkItem(
        task_id=task_id, attempt=1, device_id=device_id, workload=replayed.name, size=1,
        config=config, expected_s=0.001,
    )  # fmt: skip
    await put(stack, settings, item)
    finished = await wait_for_event(stack, task_id, "task.finished")
    assert finished.data["config"]["knobs"] == config["knobs"]
    repeats = landscape.records[ran]
    assert min(repeats) <= finished.data["runtime_s"] <= max(repeats)
    await stack.caught_up()
    row = await asyncio.to_thread(measurement, engine, finished.data["measurement_id"])
    assert row is not None and row["status"] == "ok" and row["config"]["knobs"] == config["knobs"]


@pytest.fixture
def sleeper() -> Any:
    wl = command_workload("test-fleet-sleep", f"{sys.executable} -c 'import time; time.sleep(30)'")
    register(wl, replace=True)
    yield wl.name
    unregister(wl.name)


@pytest.fixture
async def capped(
    settings: Settings, engine: Engine, sleeper: str
) -> AsyncIterator[tuple[Stack, str]]:
    tight = settings.model_copy(update={"max_run_s": 1.0})
    async with open_stack(
        tight, ("projector", "agent"), "test-fleet-capped", fleet_device=True
    ) as stack:
        yield stack, await stack.local_device()


async def test_a_run_past_the_cap_is_killed_measured_and_a_run_failure(
    capped: tuple[Stack, str], settings: Settings, engine: Engine, sleeper: str
) -> None:
    stack, device_id = capped
    config = {"ranks": 1, "threads": 1, "tile": 1}
    task_id = await place(stack, device_id, sleeper, 1, config)
    started = time.monotonic()
    await put(
        stack,
        settings,
        WorkItem(
            task_id=task_id, attempt=1, device_id=device_id, workload=sleeper, size=1, config=config
        ),
    )
    failed = await wait_for_event(stack, task_id, "task.run_failed")
    assert time.monotonic() - started < 25, "the run was not stopped at the cap"
    assert failed.data["error"], failed.data
    await stack.caught_up()
    row = await asyncio.to_thread(measurement, engine, f"task-{task_id}-1")
    assert row is not None and row["status"] == "timed_out" and row["purpose"] == "task"


async def test_an_attempt_no_longer_current_is_not_run(
    local: tuple[Stack, str], settings: Settings, engine: Engine
) -> None:
    stack, device_id = local
    task_id = await place(stack, device_id, "montecarlo", 100_000, MONTECARLO, attempts=2)
    await stack.caught_up()
    for attempt in (1, 2):  # attempt 1 was requeued: only attempt 2 is current
        await put(
            stack,
            settings,
            WorkItem(
                task_id=task_id,
                attempt=attempt,
                device_id=device_id,
                workload="montecarlo",
                size=100_000,
                config=MONTECARLO,
            ),
        )
    finished = await wait_for_event(stack, task_id, "task.finished")
    assert finished.data["attempt"] == 2
    envs = await history(stack, task_id)
    started = [e.data["attempt"] for e in envs if e.type == "task.started"]
    assert started == [2]


async def test_a_stop_kills_the_running_task_and_records_a_run_failure(
    settings: Settings, engine: Engine, bus: Any, sleeper: str
) -> None:
    config = {"ranks": 1, "threads": 1, "tile": 1}
    async with open_stack(
        settings, ("projector", "agent"), "test-fleet-stop", fleet_device=True
    ) as stack:
        device_id = await stack.local_device()
        task_id = await place(stack, device_id, sleeper, 1, config)
        await put(
            stack,
            settings,
            WorkItem(
                task_id=task_id,
                attempt=1,
                device_id=device_id,
                workload=sleeper,
                size=1,
                config=config,
            ),
        )
        await wait_for_event(stack, task_id, "task.started")
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 15, "the stop waited for the 30 s job"
    envs = [env for _, env in await bus.history("task", task_id)]
    failed = [e for e in envs if e.type == "task.run_failed"]
    assert len(failed) == 1 and "stopped during the run" in failed[0].data["error"]
    assert "task.finished" not in [e.type for e in envs]


async def test_a_commands_own_stack_serves_no_fleet(settings: Settings, engine: Engine) -> None:
    """A command that starts its own services (no serve running) ends with them: its agent
    must neither look alive to the fleet nor take a queued task it would kill on the way out."""
    async with open_stack(settings, ("projector", "agent"), "test-own-stack") as stack:
        device = await stack.local_device()
        task_id = await place(stack, device, "montecarlo", 100_000, MONTECARLO)
        item = WorkItem(
            task_id=task_id,
            attempt=1,
            device_id=device,
            workload="montecarlo",
            size=100_000,
            config=MONTECARLO,
        )
        await ensure_work_stream(stack.bus.js, settings)
        await put(stack, settings, item)
        kv = await liveness_bucket(stack.bus.js, settings)
        await asyncio.sleep(settings.heartbeat_interval_s + 1.0)
        assert await last_beat(kv, device) is None
        with engine.connect() as conn:
            status = conn.execute(
                select(tables.tasks.c.status).where(tables.tasks.c.task_id == task_id)
            ).scalar()
        assert status == "placed"  # still waiting for a device that serves the fleet
