"""The coordinator's fleet lifecycle over real NATS (log, liveness KV) and Postgres (the
projector running beside it): a silent device goes offline once and its task is requeued; a
task that fails on three devices fails with each reason; a result or message that comes twice
is acted on once; a restarted lifecycle announces nothing again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.audit import AuditFile
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import (
    DeviceLeft,
    DeviceRegistered,
    Envelope,
    Event,
    TaskPlaced,
    TaskRunFailed,
    TaskStarted,
    TaskSubmitted,
    decode,
    envelope,
)
from hpc_ds1.fleet.liveness import Heartbeat, beat, liveness_bucket
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.services.coordinator.fleet import ActiveTask, FleetLifecycle, pickup_timeout_s
from hpc_ds1.services.projector import Projector
from hpc_ds1.settings import Settings
from tests.support.waiting import until

# Liveness is judged on a clock the tests move (Clock below), never on how fast a loaded machine
# runs: the heartbeat bucket's TTL (offline_after_s, real seconds) is far longer than any stall,
# and a device is silent when the test says so and moves the clock past offline_after_s.
OFFLINE_AFTER_S = 60.0
CONFIG = {"ranks": 1, "threads": 1, "tile": 64}


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return settings.model_copy(update={"offline_after_s": OFFLINE_AFTER_S})


@pytest.fixture
async def ctx(fast: Settings, engine: Engine, bus: EventBus) -> AsyncIterator[ServiceContext]:
    """The coordinator's context, with the projector folding the log beside it."""
    assert fast.nats_url and fast.database_url
    stop = asyncio.Event()
    projector = Projector(engine, bus, AuditFile(fast.audit_path))
    running = asyncio.create_task(projector.run(stop))
    yield ServiceContext("coordinator", fast, fast.nats_url, fast.database_url, bus, engine, stop)
    stop.set()
    await running


class Clock:
    """The lifecycle's and the heartbeats' time: real time, plus what the test jumped."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


class Running:
    """A FleetLifecycle running until stopped (a restart is a second one)."""

    def __init__(self, ctx: ServiceContext, clock: Clock) -> None:
        self.fleet = FleetLifecycle(ctx, tick_s=0.2, clock=clock)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.fleet.run(self.stop))

    async def ticks(self, n: int) -> None:
        """Wait for n more complete passes of the liveness loop."""
        target = self.fleet.ticks + n
        await until(f"{n} ticks", lambda: self.fleet.ticks >= target)

    async def close(self) -> None:
        self.stop.set()
        await self.task


async def publish(bus: EventBus, event: Event) -> int:
    return await bus.publish(envelope(event, actor="tester", source="test", prefix=bus.prefix))


async def events_of(bus: EventBus, kind: str) -> list[Envelope]:
    """Every event of a type ('task.requeued'), in log order."""
    aggregate, name = kind.split(".")
    found = []
    async for chunk in bus.replay(1, f"{bus.prefix}.{aggregate}.*.{name}"):
        found += [decode(r.data, r.subject) for r in chunk]
    return found


async def register(bus: EventBus, *devices: str) -> None:
    for device_id in devices:
        await publish(bus, DeviceRegistered(device_id=device_id, hostname=device_id))


async def place(bus: EventBus, task_id: str, attempt: int, device_id: str) -> None:
    await publish(
        bus,
        TaskPlaced(
            task_id=task_id,
            attempt=attempt,
            device_id=device_id,
            config=CONFIG,
            expected_s=1.0,
            queue_s=0.0,
            basis="measured",
            reason=f"{device_id}: best measured 1.0 s",
        ),
    )


class Beating:
    """Heartbeats for some devices every 0.2 s on `clock`, until stopped."""

    def __init__(self, ctx: ServiceContext, clock: Clock, *devices: str) -> None:
        self.ctx = ctx
        self.clock = clock
        self.devices = set(devices)
        self.round = asyncio.Lock()  # a round of beats, or a jump: never one inside the other
        self.task = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        kv = await liveness_bucket(self.ctx.bus.js, self.ctx.settings)
        while True:
            async with self.round:
                for device_id in list(self.devices):
                    await beat(kv, Heartbeat(device_id=device_id, time=self.clock()))
            await asyncio.sleep(0.2)

    async def silence(self, device_id: str) -> None:
        """`device_id` stops beating and the clock jumps past offline_after_s. The others beat
        at the new time before the jump, so no tick between the two finds them stale."""
        kv = await liveness_bucket(self.ctx.bus.js, self.ctx.settings)
        jump = self.ctx.settings.offline_after_s + 1.0
        async with self.round:
            self.devices.discard(device_id)
            for other in list(self.devices):
                await beat(kv, Heartbeat(device_id=other, time=self.clock() + jump))
            self.clock.offset += jump

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def test_a_silent_device_goes_offline_once_and_its_running_task_is_requeued(
    ctx: ServiceContext, bus: EventBus
) -> None:
    await register(bus, "dev-a", "dev-b")
    clock = Clock()
    beating = Beating(ctx, clock, "dev-a", "dev-b")
    running = Running(ctx, clock)
    try:
        await until("both devices online", lambda: running.fleet.devices_online() == 2)
        await publish(bus, TaskSubmitted(task_id="t1", workload="nbody", size=64, submitted_by="x"))
        await place(bus, "t1", 1, "dev-a")
        await publish(bus, TaskStarted(task_id="t1", attempt=1, device_id="dev-a"))

        # A restart in between announces nothing again: its state comes from the log.
        await running.close()
        running = Running(ctx, clock)
        await running.ticks(3)
        statuses = await events_of(bus, "device.status_changed")
        assert sorted((e.data["device_id"], e.data["status"]) for e in statuses) == [
            ("dev-a", "online"),
            ("dev-b", "online"),
        ]

        await beating.silence("dev-a")
        requeued = await until("the requeue", lambda: events_of(bus, "task.requeued"))
        await running.ticks(3)
        assert len(await events_of(bus, "task.requeued")) == 1
        assert requeued[0].id == "requeued-t1-1"
        assert requeued[0].data["attempt"] == 1 and requeued[0].data["device_id"] == "dev-a"
        assert requeued[0].data["reason"] == "dev-a went offline: no heartbeat for 60 s"
        offline = [e.data for e in await events_of(bus, "device.status_changed")][2:]
        assert offline == [
            {"device_id": "dev-a", "status": "offline", "reason": "no heartbeat for 60 s"}
        ]
        assert running.fleet.devices_online() == 1

        beating.devices.add("dev-a")  # back
        await until("dev-a back online", lambda: running.fleet.devices_online() == 2)
        changes = [
            (e.data["device_id"], e.data["status"])
            for e in await events_of(bus, "device.status_changed")
        ]
        assert changes[2:] == [("dev-a", "offline"), ("dev-a", "online")]
    finally:
        await running.close()
        await beating.close()


async def test_a_task_that_fails_on_three_devices_fails_with_each_reason(
    ctx: ServiceContext, bus: EventBus
) -> None:
    devices = ("dev-a", "dev-b", "dev-c")
    await register(bus, *devices)
    clock = Clock()
    beating = Beating(ctx, clock, *devices)
    running = Running(ctx, clock)
    try:
        await publish(bus, TaskSubmitted(task_id="t2", workload="gemm", size=64, submitted_by="x"))
        for attempt, device_id in enumerate(devices, start=1):
            await place(bus, "t2", attempt, device_id)
            failure = TaskRunFailed(
                task_id="t2", attempt=attempt, device_id=device_id, error=f"exit {attempt}"
            )
            await publish(bus, failure)
            if attempt < len(devices):
                found = await until(
                    f"requeue {attempt}",
                    lambda a=attempt: _count(bus, "task.requeued", a),
                    within_s=30,
                )
                assert found[-1].data["reason"] == f"failed on {device_id}: exit {attempt}"
        failed = await until("the task failed", lambda: events_of(bus, "task.failed"))
        assert failed[0].id == "failed-t2"
        assert failed[0].data == {
            "task_id": "t2",
            "reasons": [
                "failed on dev-a: exit 1",
                "failed on dev-b: exit 2",
                "failed on dev-c: exit 3",
            ],
        }
        assert len(await events_of(bus, "task.requeued")) == 2
    finally:
        await running.close()
        await beating.close()


async def _count(bus: EventBus, kind: str, n: int) -> list[Envelope] | None:
    found = await events_of(bus, kind)
    return found if len(found) >= n else None


async def test_a_run_failure_that_comes_twice_requeues_once_and_a_left_device_gives_its_task_back(
    ctx: ServiceContext, bus: EventBus
) -> None:
    await register(bus, "dev-a", "dev-b")
    clock = Clock()
    beating = Beating(ctx, clock, "dev-a", "dev-b")
    running = Running(ctx, clock)
    try:
        await publish(bus, TaskSubmitted(task_id="t3", workload="gemm", size=64, submitted_by="x"))
        await place(bus, "t3", 1, "dev-a")
        failure = TaskRunFailed(task_id="t3", attempt=1, device_id="dev-a", error="oom")
        first = envelope(failure, actor="tester", source="test", prefix=bus.prefix)
        seq = await bus.publish(first)
        await publish(bus, failure)  # the same result posted again (another envelope)
        await until("the requeue", lambda: events_of(bus, "task.requeued"))
        # The consumer's redelivery of the message, and a restarted lifecycle.
        await running.fleet.on_run_failed(first, seq)
        assert await running.fleet.settle("t3", 1, None) is None
        assert await running.fleet.settle("t3", 1, "dev-a went offline") is None
        await running.close()
        running = Running(ctx, clock)
        await running.ticks(3)
        requeued = await events_of(bus, "task.requeued")
        assert [(e.id, e.data["reason"]) for e in requeued] == [
            ("requeued-t3-1", "failed on dev-a: oom")
        ]

        await place(bus, "t3", 2, "dev-b")
        await publish(bus, TaskStarted(task_id="t3", attempt=2, device_id="dev-b"))
        await publish(bus, DeviceLeft(device_id="dev-b", reason="revoked"))
        found = await until(
            "the second requeue", lambda: _count(bus, "task.requeued", 2), within_s=30
        )
        assert (found[1].id, found[1].data["reason"]) == ("requeued-t3-2", "dev-b left: revoked")
        await running.ticks(3)
        assert len(await events_of(bus, "task.requeued")) == 2
    finally:
        await running.close()
        await beating.close()


async def test_a_placed_task_is_given_back_when_its_online_device_sat_idle_past_the_pickup(
    ctx: ServiceContext,
) -> None:
    fleet = FleetLifecycle(ctx)
    timeout = pickup_timeout_s(ctx.settings)
    now = 1_000_000.0
    placed_at = datetime.fromtimestamp(now - timeout - 5, UTC)
    beats = {"dev-a": Heartbeat(device_id="dev-a", time=now - 1)}
    placed = ActiveTask("t", "dev-a", "placed", 1, placed_at)
    assert fleet.abandon_reason(placed, beats, {}, now) == (
        f"not picked up by dev-a in {timeout:g} s"
    )
    running = ActiveTask("t", "dev-a", "running", 1, placed_at)
    assert fleet.abandon_reason(running, beats, {}, now) is None
    # Another of its tasks started lately, or a heartbeat said it was busy: a queue, not a loss.
    assert fleet.abandon_reason(placed, beats, {"dev-a": now - 10}, now) is None
    fleet.busy_at["dev-a"] = now - 10
    assert fleet.abandon_reason(placed, beats, {}, now) is None
    # Silent past offline_after_s: offline wins, whatever the task's state.
    assert fleet.abandon_reason(running, {}, {}, now) == (
        "dev-a went offline: no heartbeat for 60 s"
    )


async def test_once_its_watch_has_the_bucket_a_tick_reads_no_key(
    ctx: ServiceContext, bus: EventBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Liveness by a KV watch (issue 46): after the watch's first sync the ticks take the
    pushed beats; reading the bucket key by key is left to the ticks before it."""
    from hpc_ds1.services.coordinator import fleet as lifecycle

    reads: list[float] = []
    listing = lifecycle.all_beats

    async def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(time.monotonic())
        return await listing(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "all_beats", counted)
    await register(bus, "dev-a", "dev-b")
    clock = Clock()
    beating = Beating(ctx, clock, "dev-a", "dev-b")
    running = Running(ctx, clock)
    try:
        await until("both devices online", lambda: running.fleet.devices_online() == 2)
        watch = running.fleet.watch
        assert watch is not None
        await asyncio.wait_for(watch.synced.wait(), 10)
        before = len(reads)
        await running.ticks(5)
        assert len(reads) == before and watch.updates > 0
        await beating.silence("dev-b")
        await until("dev-b offline", lambda: running.fleet.devices_online() == 1)
        assert len(reads) == before
    finally:
        await running.close()
        await beating.close()
