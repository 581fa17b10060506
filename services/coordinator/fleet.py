"""The fleet's lifecycle decisions, made here and nowhere else: a failed run is requeued (or,
after max_task_attempts devices, the task fails with each reason); a device's liveness crossings
become device.status_changed events; the tasks of a device that went offline, left, or never
picked its work up go back to placement.

Restart-safe: the devices' state is folded from the log at start and kept by a durable consumer;
tasks are read from the projection and every decision is checked against the task's own history
(hpc_ds1.fleet.tasks.fold) and appended with that history's version as the expected one, under a
deterministic envelope id (`requeued-<task>-<attempt>`, `failed-<task>`), so a redelivered
message, a second coordinator tick or a restart never emits a decision twice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from nats.js.kv import KeyValue
from sqlalchemy import Engine, func, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import ConcurrencyConflict
from hpc_ds1.events import (
    DeviceLeft,
    DeviceRegistered,
    DeviceStatusChanged,
    Envelope,
    Event,
    MalformedEvent,
    TaskFailed,
    TaskRequeued,
    TaskRunFailed,
    decode,
    envelope,
    typed,
)
from hpc_ds1.fleet.liveness import (
    BeatWatch,
    Heartbeat,
    all_beats,
    is_online,
    liveness_bucket,
)
from hpc_ds1.fleet.tasks import ACTIVE, TaskState, fold
from hpc_ds1.log import get_logger
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.settings import Settings

log = get_logger("coordinator.fleet")

SOURCE = "coordinator"
TICK_S = 1.0
CONFLICT_RETRIES = 5


def pickup_timeout_s(settings: Settings) -> float:
    """How long an idle, online device may hold a placed task without starting it: three long
    polls and a margin, so only a hand-out that was lost gets there."""
    return 3 * settings.long_poll_s + 30.0


def _seconds(value: float) -> str:
    return f"{value:g}"


def offline_reason(settings: Settings) -> str:
    return f"no heartbeat for {_seconds(settings.offline_after_s)} s"


@dataclass(frozen=True)
class DeviceView:
    """What the lifecycle needs of one device, folded from its events."""

    registered: bool = False
    left: str | None = None  # why it left; None while it belongs to the fleet
    liveness: str | None = None  # online / offline as last announced; None: never
    version: int = 0  # the stream sequence of its last event


def evolve_device(view: DeviceView, seq: int, event: Event) -> DeviceView:
    view = replace(view, version=max(view.version, seq))
    match event:
        case DeviceRegistered():
            return replace(view, registered=True, left=None)
        case DeviceLeft():
            return replace(view, left=event.reason or "left")
        case DeviceStatusChanged():
            return replace(view, liveness=event.status)
    return view


@dataclass(frozen=True)
class ActiveTask:
    task_id: str
    device_id: str
    status: str
    attempt: int
    placed_at: datetime | None


def _active_tasks(engine: Engine) -> tuple[list[ActiveTask], dict[str, float]]:
    """Tasks out on a device (from the projection) and, per device, when one last started."""
    t = tables.tasks
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.c.task_id, t.c.device_id, t.c.status, t.c.attempt, t.c.placed_at).where(
                t.c.status.in_(ACTIVE), t.c.device_id.is_not(None)
            )
        ).all()
        placed = {r.device_id for r in rows if r.status == "placed"}
        started: dict[str, float] = {}
        if placed:
            for device_id, last in conn.execute(
                select(t.c.device_id, func.max(t.c.started_at))
                .where(t.c.device_id.in_(placed), t.c.started_at.is_not(None))
                .group_by(t.c.device_id)
            ):
                started[device_id] = last.timestamp()
    return [ActiveTask(*r) for r in rows], started


class FleetLifecycle:
    def __init__(
        self, ctx: ServiceContext, tick_s: float = TICK_S, clock: Callable[[], float] = time.time
    ) -> None:
        self.ctx = ctx
        self.clock = clock  # Unix seconds; a test passes its own to decide when time passes
        self.settings = ctx.settings
        self.bus = ctx.bus
        self.tick_s = tick_s
        self.devices: dict[str, DeviceView] = {}
        self.busy_at: dict[str, float] = {}  # when a heartbeat last said the device was running
        self.kv: KeyValue | None = None
        self.watch: BeatWatch | None = None  # every heartbeat, pushed (run() starts it)
        self.ticks = 0
        self.requeued = 0
        self.failed = 0
        self.status_changes = 0

    # --- state --------------------------------------------------------------------------

    def devices_online(self) -> int:
        return sum(1 for v in self.devices.values() if v.liveness == "online" and not v.left)

    def _apply_device(self, device_id: str, seq: int, event: Event) -> bool:
        """Fold one device event; False if it was folded before (a replay or redelivery)."""
        view = self.devices.get(device_id, DeviceView())
        if seq <= view.version:
            return False
        self.devices[device_id] = evolve_device(view, seq, event)
        return True

    async def load(self) -> None:
        """Every device's state, from the log."""
        async for chunk in self.bus.replay(1, f"{self.bus.prefix}.device.>"):
            for raw in chunk:
                try:
                    env = decode(raw.data, raw.subject)
                    event = typed(env)
                except MalformedEvent:
                    continue
                if event is not None:
                    self._apply_device(env.aggregate_id, raw.seq, event)

    # --- running ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`; a failure (NATS or the database away) starts it again from the log."""
        while not stop.is_set():
            try:
                await self._run(stop)
            except Exception as error:
                log.error("fleet_lifecycle_failed", error=repr(error)[:300])
                try:
                    await asyncio.wait_for(stop.wait(), 1.0)
                except TimeoutError:
                    pass

    async def _run(self, stop: asyncio.Event) -> None:
        self.devices.clear()
        await self.load()
        self.kv = await liveness_bucket(self.bus.js, self.settings)
        self.watch = BeatWatch(self.kv)
        prefix = self.bus.prefix
        jobs = [
            self.watch.run(stop),
            self.bus.consume(
                "coordinator-fleet-runs",
                self.on_run_failed,
                stop,
                filter_subject=f"{prefix}.task.*.{TaskRunFailed.name}",
            ),
            self.bus.consume(
                "coordinator-fleet-devices",
                self.on_device_event,
                stop,
                filter_subject=f"{prefix}.device.>",
            ),
            self._loop(stop),
        ]
        async with asyncio.TaskGroup() as group:  # one failing cancels the others
            for job in jobs:
                group.create_task(job)

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.tick()
            except Exception as error:  # the database or NATS away: try again next tick
                log.warning("fleet_tick_failed", error=repr(error)[:300])
            try:
                await asyncio.wait_for(stop.wait(), self.tick_s)
            except TimeoutError:
                pass

    # --- handlers -----------------------------------------------------------------------

    async def on_run_failed(self, env: Envelope, seq: int) -> None:
        event = typed(env)
        if isinstance(event, TaskRunFailed):
            await self.settle(event.task_id, event.attempt, None)

    async def on_device_event(self, env: Envelope, seq: int) -> None:
        event = typed(env)
        if event is None or not self._apply_device(env.aggregate_id, seq, event):
            return
        if isinstance(event, DeviceLeft):
            rows, _ = await asyncio.to_thread(_active_tasks, self.ctx.engine)
            reason = f"{event.device_id} left: {event.reason}"
            for row in rows:
                if row.device_id == event.device_id:
                    await self.settle(row.task_id, row.attempt, reason)

    # --- decisions ----------------------------------------------------------------------

    async def _task(self, task_id: str) -> TaskState:
        events: list[tuple[int, Event]] = []
        for seq, env in await self.bus.history("task", task_id):
            try:
                event = typed(env)
            except MalformedEvent:
                continue
            if event is not None:
                events.append((seq, event))
        return fold(events)

    def _wrap(self, event: Event, event_id: str, task_id: str) -> Envelope:
        env = envelope(
            event,
            actor=SOURCE,
            source=SOURCE,
            prefix=self.settings.subject_prefix,
            correlation_id=task_id,
        )
        return env.model_copy(update={"id": event_id})

    async def settle(self, task_id: str, attempt: int, reason: str | None) -> str | None:
        """Abandon `attempt` of the task if it is still the one out on a device: requeue it
        (with its run failure, or else `reason`), or fail the task once it has failed on
        max_task_attempts devices. Returns what was appended (requeued / failed), or None
        when the task had moved on (or nothing is to be done: no failure and no reason)."""
        for _ in range(CONFLICT_RETRIES):
            state = await self._task(task_id)
            if state.status not in ACTIVE or state.attempt != attempt or state.device_id is None:
                return None
            event: Event
            if state.current_failed:
                if len(set(state.failed_on)) >= self.settings.max_task_attempts:
                    event = TaskFailed(task_id=task_id, reasons=list(state.failures))
                    env = self._wrap(event, f"failed-{task_id}", task_id)
                else:
                    why = state.failures[-1]
                    event = TaskRequeued(
                        task_id=task_id, attempt=attempt, device_id=state.device_id, reason=why
                    )
                    env = self._wrap(event, f"requeued-{task_id}-{attempt}", task_id)
            elif reason is not None:
                event = TaskRequeued(
                    task_id=task_id, attempt=attempt, device_id=state.device_id, reason=reason
                )
                env = self._wrap(event, f"requeued-{task_id}-{attempt}", task_id)
            else:
                return None
            try:
                await self.bus.publish(env, expected_version=state.version)
            except ConcurrencyConflict:
                continue  # the task moved on meanwhile: look again
            if isinstance(event, TaskFailed):
                self.failed += 1
                log.info("task_failed", task_id=task_id, reasons=len(event.reasons))
                return "failed"
            self.requeued += 1
            log.info("task_requeued", task_id=task_id, attempt=attempt, reason=event.reason)
            return "requeued"
        log.warning("task_settle_gave_up", task_id=task_id, attempt=attempt)
        return None

    async def announce(self, device_id: str, status: str, reason: str) -> bool:
        """Append a liveness crossing once: expected version = the device's last event as
        folded, so a stale view (or a second coordinator) appends nothing."""
        view = self.devices[device_id]
        event = DeviceStatusChanged(device_id=device_id, status=status, reason=reason)  # type: ignore[arg-type]
        env = envelope(event, actor=SOURCE, source=SOURCE, prefix=self.settings.subject_prefix)
        env = env.model_copy(update={"id": f"{status}-{device_id}-{view.version}"})
        try:
            seq = await self.bus.publish(env, expected_version=view.version)
        except ConcurrencyConflict:
            return False  # a device event not folded yet: the consumer brings it, then retry
        self._apply_device(device_id, seq, event)
        self.status_changes += 1
        log.info("device_status_changed", device_id=device_id, status=status, reason=reason)
        return True

    async def tick(self, now: float | None = None) -> None:
        """One pass: liveness crossings, then every task out on a device that cannot run it."""
        assert self.kv is not None, "run() opens the liveness bucket"
        now = self.clock() if now is None else now
        watch = self.watch
        if watch is not None and watch.synced.is_set():
            beats = dict(watch.beats)
        else:  # before the watch has the bucket's entries (or without one): read them
            beats = await all_beats(self.kv, also=self.devices)
        for device_id, beat in beats.items():
            if beat.running:
                self.busy_at[device_id] = now
        rows, started = await asyncio.to_thread(_active_tasks, self.ctx.engine)
        holding = {r.device_id for r in rows}
        for device_id, view in list(self.devices.items()):
            if not view.registered or view.left is not None:
                continue
            online = is_online(beats.get(device_id), self.settings, now)
            if online and view.liveness != "online":
                await self.announce(device_id, "online", "")
            elif not online and (
                view.liveness == "online" or (view.liveness is None and device_id in holding)
            ):
                await self.announce(device_id, "offline", offline_reason(self.settings))
        for row in rows:
            reason = self.abandon_reason(row, beats, started, now)
            if reason is not None:
                await self.settle(row.task_id, row.attempt, reason)
        self.ticks += 1

    def abandon_reason(
        self, row: ActiveTask, beats: dict[str, Heartbeat], started: dict[str, float], now: float
    ) -> str | None:
        device_id = row.device_id
        view = self.devices.get(device_id)
        if view is not None and view.left is not None:
            return f"{device_id} left: {view.left}"
        if not is_online(beats.get(device_id), self.settings, now):
            return f"{device_id} went offline: {offline_reason(self.settings)}"
        if row.status == "placed" and row.placed_at is not None:
            timeout = pickup_timeout_s(self.settings)
            since = max(
                row.placed_at.timestamp(),
                self.busy_at.get(device_id, 0.0),
                started.get(device_id, 0.0),
            )
            if now - since > timeout:
                return f"not picked up by {device_id} in {_seconds(timeout)} s"
        return None


def facts(fleet: FleetLifecycle) -> dict[str, Any]:
    return {
        "devices_online": fleet.devices_online,
        "tasks_requeued": lambda: fleet.requeued,
        "tasks_failed": lambda: fleet.failed,
    }
