"""The coordinator's own machine as a device of the fleet: the local agent takes its tasks off
its queue in the work stream (over NATS, no HTTP), runs each one in its turn in the agent's
job queue (so it shares the device with decide and tune runs, under the device lock), and
records what happened as events; it says it is alive in the liveness bucket every
heartbeat_interval_s. Running a WorkItem and the events of its result are the same code a
remote agent uses (hpc_ds1.fleet.execute)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from typing import Any

from pydantic import ValidationError

from hpc_ds1.events import Envelope
from hpc_ds1.fleet.execute import (
    TaskResult,
    attempt_state,
    describe,
    refused,
    run_work_item,
    started_envelope,
    stopped,
    task_events,
)
from hpc_ds1.fleet.liveness import Heartbeat, beat, liveness_bucket
from hpc_ds1.fleet.work import WorkItem, device_queue
from hpc_ds1.log import get_logger
from hpc_ds1.machine.devicelock import Cancelled
from hpc_ds1.measure import PUBLISH_RETRY_DELAYS_S, publish_retrying
from hpc_ds1.process.runtime import ServiceContext

from .jobs import JobRunner

log = get_logger("agent-fleet")

FETCH_WAIT_S = 5.0  # one pull of the queue waits this long (a stop interrupts it)
PROJECTION_WAIT_S = 10.0  # how long a fresh item waits for its placement to be projected
RECORD_RETRY_MAX_S = 30.0


class LocalFleet:
    """The fleet loop of the local agent (started by services/agent run())."""

    def __init__(self, ctx: ServiceContext, jobs: JobRunner, device_id: str) -> None:
        self.ctx = ctx
        self.jobs = jobs
        self.device_id = device_id
        self.running: tuple[str, float] | None = None  # (task id, monotonic start)
        self.waiting: set[str] = set()  # tasks taken off the queue, not started yet
        self.completed = 0
        self._sub: Any = None

    # --- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        """Until ctx.stop: heartbeats, and the device's tasks one after another."""
        js, settings = self.ctx.bus.js, self.ctx.settings
        kv = await liveness_bucket(js, settings)
        self._sub = await device_queue(js, settings, self.device_id)
        beats = asyncio.create_task(self._heartbeats(kv), name="agent-heartbeats")
        try:
            while not self.ctx.stop.is_set():
                msg = await self._next()
                if msg is None:
                    continue
                if self.ctx.stop.is_set():  # leave it on the queue for the next start
                    with contextlib.suppress(Exception):
                        await msg.nak()
                    break
                await msg.ack()
                try:
                    item = WorkItem.model_validate_json(msg.data)
                except ValidationError as error:
                    log.error("work_item_invalid", error=str(error)[:500])
                    continue
                await self.handle(item)
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _next(self) -> Any:
        """The next message of the queue, or None after FETCH_WAIT_S or on stop."""
        fetch = asyncio.ensure_future(self._sub.fetch(1, timeout=FETCH_WAIT_S))
        stop = asyncio.ensure_future(self.ctx.stop.wait())
        try:
            await asyncio.wait({fetch, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not fetch.done():
            fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await fetch
            return None
        try:
            msgs = fetch.result()
        except TimeoutError:
            return None
        except Exception as error:  # the connection is reconnecting: try again shortly
            log.warning("work_fetch_failed", error=repr(error))
            await asyncio.sleep(1.0)
            return None
        return msgs[0] if msgs else None

    async def _heartbeats(self, kv: Any) -> None:
        interval = self.ctx.settings.heartbeat_interval_s
        while True:
            try:
                await beat(kv, self.heartbeat(await self._pending()))
            except Exception as error:
                log.warning("heartbeat_failed", error=repr(error))
            await asyncio.sleep(interval)

    async def _pending(self) -> int:
        try:
            info = await self._sub.consumer_info()
            return int(info.num_pending or 0) + len(self.waiting)
        except Exception:
            return len(self.waiting)

    def heartbeat(self, queued: int) -> Heartbeat:
        running = self.running
        return Heartbeat(
            device_id=self.device_id,
            time=time.time(),
            running=running[0] if running else None,
            running_for_s=round(time.monotonic() - running[1], 3) if running else None,
            queued=max(queued, 0),
        )

    # --- one attempt ------------------------------------------------------------------------
    async def handle(self, item: WorkItem) -> TaskResult | None:
        """Run one attempt in its turn and record its result; None when it was not current."""
        if item.device_id != self.device_id:
            log.error("work_item_for_another_device", task_id=item.task_id, device=item.device_id)
            return None
        if await self._current(item) == "stale":
            log.info("attempt_not_current", task_id=item.task_id, attempt=item.attempt)
            return None
        self.waiting.add(item.task_id)
        try:
            result = await self.jobs.in_turn(functools.partial(self._attempt, item))
        except Cancelled:
            result = stopped(item, self.device_id)
        except Exception as error:
            log.error("task_error", task_id=item.task_id, error=repr(error))
            result = refused(item, f"{type(error).__name__}: {error}")
        finally:
            self.waiting.discard(item.task_id)
            self.running = None
        await self.record(item, result)
        return result

    async def _current(self, item: WorkItem) -> str:
        """attempt_state, waiting a little for a placement the projector has not folded yet;
        still unknown then (the projector is behind or down): run it."""
        deadline = time.monotonic() + PROJECTION_WAIT_S
        while True:
            try:
                state = await asyncio.to_thread(attempt_state, self.ctx.engine, item)
            except Exception as error:
                log.warning("task_state_unknown", task_id=item.task_id, error=repr(error))
                return "unknown"
            if state != "unknown" or time.monotonic() > deadline or self.ctx.stop.is_set():
                return state
            await asyncio.sleep(0.1)

    async def _attempt(self, item: WorkItem) -> TaskResult:
        """Its turn has come: announce it, then run it (in a thread; killed on stop)."""
        await self._publish(self._started(item))
        self.waiting.discard(item.task_id)
        self.running = (item.task_id, time.monotonic())
        log.info("task_started", task_id=item.task_id, attempt=item.attempt)
        settings = self.ctx.settings
        return await asyncio.to_thread(
            run_work_item,
            item,
            home=settings.home,
            max_run_s=settings.max_run_s,
            cancel=self.jobs.cancel,
        )

    def _started(self, item: WorkItem) -> Envelope:
        return started_envelope(
            item.task_id,
            item.attempt,
            self.device_id,
            actor="agent",
            source="agent",
            prefix=self.ctx.settings.subject_prefix,
        )

    async def record(self, item: WorkItem, result: TaskResult) -> None:
        """Publish the result's events (measurement, then finished or run_failed), again with
        back-off until the log takes them (deterministic ids: stored once); one try when the
        agent is stopping."""
        envs = task_events(
            item.task_id,
            self.device_id,
            result,
            workload=item.workload,
            size=item.size,
            expected_s=item.expected_s,
            actor="agent",
            source="agent",
            prefix=self.ctx.settings.subject_prefix,
        )
        for env in envs:
            await self._publish(env)
        self.completed += 1
        log.info(
            "task_recorded", task_id=item.task_id, attempt=item.attempt, result=describe(result)
        )

    async def _publish(self, env: Envelope) -> None:
        delay = 1.0
        while True:
            try:
                await publish_retrying(self.ctx.bus, env, PUBLISH_RETRY_DELAYS_S)
                return
            except Exception as error:
                if self.ctx.stop.is_set() or self.jobs.cancel.is_set():
                    log.error("task_event_not_recorded", event_id=env.id, error=repr(error))
                    return
                log.warning("task_event_retry", event_id=env.id, error=repr(error))
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECORD_RETRY_MAX_S)
