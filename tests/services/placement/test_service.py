"""The placement service on real NATS: two devices with measurements and heartbeats; a task
submitted while none is online waits and says so, then goes to the device with the lower
measured runtime at the configuration of its best run, with its work item on that device's
queue; the next one counts the first in that device's queue; a restarted service places
nothing twice. Without a measurement, the device's own model (from the models bucket) predicts,
and its familiarity guard is heard."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from nats.errors import TimeoutError as NatsTimeout

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import placement_subject
from hpc_ds1.events import (
    DeviceRegistered,
    Envelope,
    Event,
    MeasurementRecorded,
    ModelPublished,
    TaskSubmitted,
    envelope,
)
from hpc_ds1.fleet import liveness
from hpc_ds1.fleet.work import WorkItem, device_queue
from hpc_ds1.machine.hardware import Fingerprint
from hpc_ds1.model import Model, TrainedModel
from hpc_ds1.models_store import models_bucket
from hpc_ds1.process.runtime import run_service
from hpc_ds1.settings import Settings
from tests.support.waiting import until

WAIT_S = 30.0
SLOW = {"ranks": 1, "threads": 1, "tile": 64, "gpu": False}
FAST = {"ranks": 2, "threads": 1, "tile": 32, "gpu": False}


async def publish(bus: EventBus, event: Event) -> int:
    return await bus.publish(envelope(event, actor="tester", source="test", prefix=bus.prefix))


async def task_events(bus: EventBus, task_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(env.type, env.data) for _, env in await bus.history("task", task_id)]


async def wait_for(bus: EventBus, task_id: str, kind: str) -> dict[str, Any]:
    async def events() -> list[dict[str, Any]]:
        return [data for t, data in await task_events(bus, task_id) if t == kind]

    found: list[dict[str, Any]] = await until(f"{kind} for {task_id}", events, WAIT_S, 0.1)
    return found[-1]


@contextlib.asynccontextmanager
async def placement(settings: Settings) -> AsyncIterator[None]:
    assert settings.nats_url and settings.database_url
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_service("placement", settings, settings.nats_url, settings.database_url, stop)
    )
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def measurement(mid: str, device_id: str, runtime_s: float, config: dict[str, Any]) -> Event:
    return MeasurementRecorded(
        measurement_id=mid,
        device_id=device_id,
        workload="nbody",
        size=512,
        config=config,
        status="ok",
        runtime_s=runtime_s,
        check_ok=True,
        purpose="setup",
    )


@pytest.fixture
async def fleet(settings: Settings, bus: EventBus) -> Any:
    for device_id in ("dev-a", "dev-b"):
        await publish(bus, DeviceRegistered(device_id=device_id, hostname=device_id))
    await publish(bus, measurement("m-a", "dev-a", 2.0, SLOW))
    await publish(bus, measurement("m-b1", "dev-b", 3.0, SLOW))
    await publish(bus, measurement("m-b2", "dev-b", 0.5, FAST))
    return await liveness.liveness_bucket(bus.js, settings)


async def test_a_task_goes_to_the_lower_measured_runtime_at_its_best_config(
    settings: Settings, bus: EventBus, fleet: Any
) -> None:
    submit = TaskSubmitted(task_id="t0", workload="nbody", size=512, submitted_by="eng")
    async with placement(settings):
        await publish(bus, submit)
        waiting = await wait_for(bus, "t0", "task.waiting")
        assert "no device is online (dev-a, dev-b offline)" in waiting["reason"]

        for device_id in ("dev-a", "dev-b"):  # the devices' agents say they are alive
            await liveness.beat(fleet, liveness.Heartbeat(device_id=device_id, time=time.time()))
        first = await wait_for(bus, "t0", "task.placed")
        assert first["device_id"] == "dev-b" and first["attempt"] == 1
        assert first["config"] == FAST and first["basis"] == "measured"
        assert first["expected_s"] == 0.5 and first["queue_s"] == 0.0
        assert first["reason"].startswith(
            "dev-b: queue 0.0 s + best measured 0.5 s (ranks=2 threads=1 tile=32)"
        )
        assert first["runner_up"] == "dev-a"

        queue = await device_queue(bus.js, settings, "dev-b")
        msgs = await queue.fetch(1, timeout=10)
        item = WorkItem.model_validate_json(msgs[0].data)
        await msgs[0].ack()
        assert (item.task_id, item.attempt, item.device_id) == ("t0", 1, "dev-b")
        assert item.config == FAST and item.expected_s == 0.5

        # dev-b holds t0 (not started): 0.5 s queued + 0.5 s < dev-a's 2.0 s
        await publish(bus, submit.model_copy(update={"task_id": "t1"}))
        second = await wait_for(bus, "t1", "task.placed")
        assert second["device_id"] == "dev-b" and second["queue_s"] == 0.5

    # The queues are lost while placement is down. A restart folds the log again: nothing is
    # placed twice, and what was placed and not started is on its queue again, once.
    await bus.js.delete_stream(settings.work_stream)
    async with placement(settings):
        await publish(bus, submit.model_copy(update={"task_id": "t2"}))
        third = await wait_for(bus, "t2", "task.placed")
        assert third["queue_s"] == 1.0  # t0 and t1, both still queued on dev-b
        queue = await device_queue(bus.js, settings, "dev-b")
        queued = []
        with contextlib.suppress(NatsTimeout):
            while len(queued) < 4:
                for msg in await queue.fetch(1, timeout=2):
                    queued.append(WorkItem.model_validate_json(msg.data).task_id)
                    await msg.ack()
        assert queued == ["t0", "t1", "t2"]
    for task_id in ("t0", "t1"):
        kinds = [t for t, _ in await task_events(bus, task_id)]
        assert kinds.count("task.placed") == 1, kinds


async def test_without_a_measurement_the_devices_own_model_predicts_and_its_guard_is_heard(
    settings: Settings, bus: EventBus, trained: TrainedModel, fp: Fingerprint
) -> None:
    """The model (tests/support/measured.py: gemm 48-96 measured on this machine) goes to the models
    bucket like an uploaded one; placement loads it from there and asks it, with the device's
    own fingerprint."""
    data = trained.to_onnx()
    store = await models_bucket(bus.js, settings)
    assert store is not None
    await store.put("dev-m/v1.onnx", data)
    fingerprint = fp.model_dump(mode="json")
    await publish(bus, DeviceRegistered(device_id="dev-m", hostname="m", fingerprint=fingerprint))
    await publish(
        bus,
        ModelPublished(
            model_version="dev-m:v1",
            device_id="dev-m",
            artifact="dev-m/v1.onnx",
            sha256=hashlib.sha256(data).hexdigest(),
            trained_on=10,
        ),
    )
    kv = await liveness.liveness_bucket(bus.js, settings)
    await liveness.beat(kv, liveness.Heartbeat(device_id="dev-m", time=time.time()))
    rec = Model.from_onnx(data).recommend("gemm", 64, fingerprint=fp)
    async with placement(settings):
        await publish(bus, TaskSubmitted(task_id="p1", workload="gemm", size=64, submitted_by="e"))
        got = await wait_for(bus, "p1", "task.placed")
        assert got["device_id"] == "dev-m" and got["basis"] == "predicted"
        assert got["config"] == rec.config.model_dump() and not got["guard_rejected"]
        assert got["expected_s"] == pytest.approx(rec.predicted_runtime_s)
        assert "predicted" in got["reason"] and "its model dev-m:v1" in got["reason"]

        # Far outside what it measured: its guard rejects it, and it is the only device.
        await publish(
            bus, TaskSubmitted(task_id="p2", workload="gemm", size=3000, submitted_by="e")
        )
        far = await wait_for(bus, "p2", "task.placed")
        assert far["device_id"] == "dev-m" and far["guard_rejected"]
        assert "every device's familiarity guard rejects gemm size 3000" in far["reason"]
        assert "outside the measured range" in far["reason"]

        # Asking for the estimate places nothing; bad input is answered, not dropped.
        reply = await bus.nc.request(
            placement_subject(settings), orjson.dumps({"workload": "gemm", "size": 64}), timeout=10
        )
        answer = orjson.loads(reply.data)
        assert answer["ok"] and answer["device_id"] == "dev-m" and answer["basis"] == "predicted"
        bad = await bus.nc.request(placement_subject(settings), b"{}", timeout=10)
        assert orjson.loads(bad.data)["status"] == 422


async def test_a_follower_that_keeps_failing_is_made_again_from_where_it_was(
    settings: Settings, bus: EventBus, fleet: Any
) -> None:
    async with placement(settings):
        for device_id in ("dev-a", "dev-b"):
            await liveness.beat(fleet, liveness.Heartbeat(device_id=device_id, time=time.time()))
        await publish(
            bus, TaskSubmitted(task_id="f1", workload="nbody", size=512, submitted_by="e")
        )
        await wait_for(bus, "f1", "task.placed")
        await bus.js.delete_consumer(settings.stream, "placement")  # its consumer is gone
        await publish(
            bus, TaskSubmitted(task_id="f2", workload="nbody", size=512, submitted_by="e")
        )
        second = await wait_for(bus, "f2", "task.placed")
        assert second["device_id"] == "dev-b" and second["queue_s"] == 0.5  # f1 still counted
    kinds = [t for t, _ in await task_events(bus, "f1")]
    assert kinds.count("task.placed") == 1


async def test_an_event_of_a_type_it_does_not_know_does_not_block_the_task(
    settings: Settings, bus: EventBus, fleet: Any
) -> None:
    """A newer version's event on the task (or an unreadable one) moves the task's version on:
    placement appends after it instead of conflicting with it forever."""
    async with placement(settings):
        await publish(
            bus, TaskSubmitted(task_id="u1", workload="nbody", size=512, submitted_by="e")
        )
        await wait_for(bus, "u1", "task.waiting")
        note = Envelope(
            type="task.annotated",
            version=1,
            subject=f"{bus.prefix}.task.u1.annotated",
            actor="future",
            source="test",
            data={"note": "from a newer version"},
        )
        await bus.publish(note)
        await asyncio.sleep(1.0)  # the follower takes it
        for device_id in ("dev-a", "dev-b"):
            await liveness.beat(fleet, liveness.Heartbeat(device_id=device_id, time=time.time()))
        placed = await wait_for(bus, "u1", "task.placed")
        assert placed["device_id"] == "dev-b"
    kinds = [t for t, _ in await task_events(bus, "u1")]
    assert kinds == ["task.submitted", "task.waiting", "task.annotated", "task.placed"]
