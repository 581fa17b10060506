"""The long-poll bridge: each device's `GET /v1/agent/work` waits on that device's durable
pull consumer of the work stream (fleet/work.py), one subscription per device and gateway
process, and the heartbeats of polling devices are kept fresh meanwhile."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import FetchTimeoutError
from nats.js.kv import KeyValue
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.fleet.liveness import Heartbeat, beat, last_beat, liveness_bucket
from hpc_ds1.fleet.work import WorkItem, device_queue
from hpc_ds1.log import get_logger
from hpc_ds1.settings import Settings

from ..api.tasks import task_state
from .bodies import HeartbeatBody

log = get_logger("gateway.agent")

LAG_WAIT_S: Final = 1.0  # how long a report waits for the projector to write its task's row
BEAT_TICK_S: Final = 0.25  # how often the heartbeats of polling devices are looked over
SUBSCRIBING: Final = 8
VET_THREADS: Final = 6  # device queue subscriptions made at once (JetStream API calls)


# --- the work queues -----------------------------------------------------------------------


@dataclass
class _DeviceQueue:
    sub: Any  # the durable pull subscription on the device's queue
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    fetching: asyncio.Future[Any] | None = None  # the waiting fetch of the poll holding `lock`
    # Each poll's number: a poll that is not the newest gives up before it fetches. A newer
    # poll that comes while an older one is still on its way to its fetch (no `fetching` to
    # cancel yet) would otherwise wait behind the older one's whole `wait`.
    newest: int = 0


@dataclass
class _Reported:
    """What the device last said in a heartbeat, to repeat when a poll refreshes it."""

    running: str | None = None
    running_for_s: float | None = None
    queued: int = 0
    at: float = field(default_factory=time.monotonic)
    beaten: float = 0.0  # monotonic time of the last put to the bucket


class AgentBridge:
    """The gateway process's side of the devices' queues and heartbeats."""

    def __init__(self, settings: Settings, bus: EventBus, engine: Engine) -> None:
        self.settings = settings
        self.bus = bus
        self.engine = engine
        self.queues: dict[str, _DeviceQueue] = {}
        self._making: dict[str, asyncio.Future[_DeviceQueue]] = {}
        self._kv: KeyValue | None = None
        self._reported: dict[str, _Reported] = {}
        self._polling: dict[str, int] = {}
        self._beater: asyncio.Task[None] | None = None
        self.closed = False
        self._subscribing = asyncio.Semaphore(SUBSCRIBING)
        # Work items are checked against the tasks table on threads of their own: the default
        # pool also serves every request's token lookup, and a wave of polls coming back
        # (their waits ending together) would queue the dispatch behind it.
        self._db = ThreadPoolExecutor(max_workers=VET_THREADS, thread_name_prefix="agent-work")

    async def close(self) -> None:
        """End the open polls (204 at once: the server waits for every request in flight
        before it stops) and the device subscriptions (unsubscribed rather than left to the
        connection's drain, which waits on them for its timeout). Polls after it get nothing."""
        self.closed = True
        if self._beater is not None:
            self._beater.cancel()
        self._db.shutdown(wait=False)
        queues, self.queues = list(self.queues.values()), {}
        for queue in queues:
            if queue.fetching is not None:
                queue.fetching.cancel()
            try:
                await queue.sub.unsubscribe()
            except Exception as error:
                log.warning("unsubscribe_failed", error=repr(error)[:200])

    # heartbeats ------------------------------------------------------------------------

    async def kv(self) -> KeyValue:
        if self._kv is None:
            self._kv = await liveness_bucket(self.bus.js, self.settings)
        return self._kv

    async def report(self, device: str, body: HeartbeatBody) -> None:
        """An explicit heartbeat: remember what it says and put it now."""
        self._reported[device] = _Reported(body.running, body.running_for_s, body.queued)
        await self._beat(device, force=True)

    async def running(self, device: str, task_id: str | None, finished: str | None = None) -> None:
        """What a started (`task_id`) or a result (`finished`) says the device runs now: put
        in its heartbeat at once and in those put on its behalf until its own next one
        (placement reads them)."""
        known = self._reported.get(device)
        if known is None:
            known = self._reported[device] = _Reported()
        if finished is not None and known.running != finished:
            return
        known.running, known.running_for_s, known.at = task_id, 0.0, time.monotonic()
        if task_id is not None:
            known.queued = max(0, known.queued - 1)
        try:
            await self._beat(device, force=True)
        except Exception as error:
            log.warning("heartbeat_failed", device_id=device, error=repr(error)[:200])

    async def _beat(self, device: str, force: bool = False) -> None:
        """Put the device's heartbeat (server time). Unless `force`, only when the last one is
        half an interval old: a busy device polling again after each item costs no put each."""
        now = time.monotonic()
        known = self._reported.get(device)
        if known is None:
            known = await self._from_bucket(device)
        if not force and now - known.beaten < self.settings.heartbeat_interval_s / 2:
            return
        running_for = None
        if known.running is not None and known.running_for_s is not None:
            running_for = known.running_for_s + (now - known.at)
        heartbeat = Heartbeat(
            device_id=device,
            time=time.time(),
            running=known.running,
            running_for_s=running_for,
            queued=known.queued,
        )
        known.beaten = now
        await beat(await self.kv(), heartbeat)

    async def _from_bucket(self, device: str) -> _Reported:
        """What another gateway process (or this one before a restart) last put."""
        found = None
        try:
            found = await last_beat(await self.kv(), device)
        except Exception as error:
            log.warning("heartbeat_read_failed", device_id=device, error=repr(error)[:200])
        known = _Reported()
        if found is not None:
            known = _Reported(found.running, found.running_for_s, found.queued)
            known.at -= max(0.0, time.time() - found.time)
        self._reported[device] = known
        return known

    async def _keep_beating(self) -> None:
        """While devices hold polls open, keep their heartbeats fresh (a poll lasts longer than
        a device may stay silent): each device whose last heartbeat, its own or one put here,
        is heartbeat_interval_s old is put again. Spread over small ticks, the most overdue
        first, a bounded number a tick: a thousand devices polling make a steady trickle of
        puts, not a burst every interval that stalls the queues."""
        interval = self.settings.heartbeat_interval_s
        tick = min(BEAT_TICK_S, interval / 4)
        while self._polling and not self.closed:
            await asyncio.sleep(tick)
            now = time.monotonic()
            due = [
                (known.beaten if (known := self._reported.get(d)) else 0.0, d)
                for d in self._polling
            ]
            due = sorted(x for x in due if now - x[0] >= interval)
            budget = max(8, math.ceil(2 * len(self._polling) * tick / interval))
            results = await asyncio.gather(
                *(self._beat(d, force=True) for _, d in due[:budget]), return_exceptions=True
            )
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                log.warning("heartbeats_failed", count=len(failed), error=repr(failed[0])[:200])

    def _polls(self, device: str, delta: int) -> None:
        count = self._polling.get(device, 0) + delta
        if count > 0:
            self._polling[device] = count
        else:
            self._polling.pop(device, None)
        if self._polling and (self._beater is None or self._beater.done()):
            self._beater = asyncio.create_task(self._keep_beating(), name="agent-heartbeats")

    # the queue -------------------------------------------------------------------------

    async def queue(self, device: str) -> _DeviceQueue:
        """The device's subscription, made on its first poll (one at a time per device)."""
        found = self.queues.get(device)
        if found is not None:
            return found
        making = self._making.get(device)
        if making is None:
            making = asyncio.ensure_future(self._subscribe(device))
            self._making[device] = making
            making.add_done_callback(lambda _: self._making.pop(device, None))
        return await asyncio.shield(making)

    async def _subscribe(self, device: str) -> _DeviceQueue:
        async with self._subscribing:  # a thousand first polls at once: a few API calls each
            sub = await device_queue(self.bus.js, self.settings, device)
        made = _DeviceQueue(sub)
        self.queues[device] = made
        return made

    async def poll(self, device: str, wait_s: float, hung_up: Awaitable[None]) -> WorkItem | None:
        """The device's next current WorkItem within `wait_s`, acked; None when none came. It
        also ends, with None, when the caller hangs up (`hung_up` completes: an item fetched
        meanwhile goes back on the queue), when a newer poll of the same device comes (its
        agent came back on a new connection) and when the gateway stops."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        watcher = asyncio.ensure_future(hung_up)
        if self.closed:
            watcher.cancel()
            return None
        self._polls(device, +1)
        try:
            try:
                await self._beat(device)
            except Exception as error:
                log.warning("heartbeat_failed", device_id=device, error=repr(error)[:200])
            queue = await self.queue(device)
            queue.newest += 1
            mine = queue.newest
            if queue.fetching is not None:
                queue.fetching.cancel()
            try:
                async with asyncio.timeout(max(0.0, deadline - loop.time())):
                    await queue.lock.acquire()
            except TimeoutError:
                return None
            try:
                return await self._take(queue, device, deadline, watcher, mine)
            finally:
                queue.lock.release()
        finally:
            self._polls(device, -1)
            watcher.cancel()

    async def _take(
        self,
        queue: _DeviceQueue,
        device: str,
        deadline: float,
        watcher: asyncio.Future[None],
        mine: int,
    ) -> WorkItem | None:
        loop = asyncio.get_running_loop()
        while not self.closed and (remaining := deadline - loop.time()) > 0.01:
            if queue.newest != mine:
                return None  # superseded by a newer poll of the same device
            fetching = asyncio.ensure_future(queue.sub.fetch(1, timeout=remaining))
            queue.fetching = fetching
            try:
                await asyncio.wait({fetching, watcher}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if queue.fetching is fetching:
                    queue.fetching = None
            if watcher.done() and not fetching.done():
                # Hung up. The pull request stays open on the server until it expires: an item
                # it brings in meanwhile is put back at once for the device's next poll (a
                # newer poll here cancels this and takes such an item itself).
                queue.fetching = asyncio.ensure_future(self._put_back(fetching, device))
                return None
            if fetching.cancelled():
                return None  # hung up, superseded by a newer poll, or the gateway stops
            error = fetching.exception()
            if isinstance(error, NatsTimeout | FetchTimeoutError | TimeoutError):
                return None
            if error is not None:
                raise error
            msg = fetching.result()[0]
            if self.closed:
                await msg.nak()
                return None
            verdict, item = await self._vet(msg.data, device)
            if verdict == "current" and item is not None:
                if watcher.done() or self.closed:
                    await msg.nak()
                    log.info("work_put_back", device_id=device, task_id=item.task_id)
                    return None
                await msg.ack()
                log.info("work_handed_out", device_id=device, task_id=item.task_id)
                return item
            if verdict == "lagging":
                await msg.nak(delay=LAG_WAIT_S)
            else:
                await msg.ack()
        return None

    @staticmethod
    async def _put_back(fetching: asyncio.Future[Any], device: str) -> None:
        try:
            msgs = await fetching
        except (NatsTimeout, FetchTimeoutError, TimeoutError):
            return
        except asyncio.CancelledError:
            fetching.cancel()
            raise
        for msg in msgs:
            await msg.nak()
            log.info("work_put_back", device_id=device, reason="its poll hung up")

    async def _vet(self, data: bytes, device: str) -> tuple[str, WorkItem | None]:
        """current: the task is placed at this attempt on this device; stale: it is not (any
        more); lagging: its row does not show the attempt yet (the projector is behind)."""
        try:
            item = WorkItem.model_validate_json(data)
        except ValueError as error:
            log.error("work_item_unreadable", device_id=device, error=str(error)[:300])
            return "stale", None
        if item.device_id != device:
            log.error("work_item_misrouted", device_id=device, item_device=item.device_id)
            return "stale", None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LAG_WAIT_S
        while True:
            row = await loop.run_in_executor(self._db, task_state, self.engine, item.task_id)
            if (
                row is not None
                and row["attempt"] == item.attempt
                and row["device_id"] == device
                and row["status"] == "placed"
            ):
                return "current", item
            lagging = row is None or row["attempt"] < item.attempt
            if not lagging:
                log.info(
                    "work_item_stale",
                    device_id=device,
                    task_id=item.task_id,
                    attempt=item.attempt,
                    task_attempt=row["attempt"] if row else None,
                    task_status=row["status"] if row else None,
                )
                return "stale", item
            if loop.time() >= deadline:
                log.warning("work_item_lagging", task_id=item.task_id, attempt=item.attempt)
                return "lagging", item
            await asyncio.sleep(0.05)
