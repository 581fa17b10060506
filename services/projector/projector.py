"""The projector loop: read the log in order from the checkpoint, fold, write, commit.

A poison event (a value Postgres refuses: an integer past bigint, a NUL byte in text, an event
id seen before) is set aside with its reason and the projector goes on; only a failure of
Postgres or NATS themselves holds it, and then its status facts say so (`healthy: false`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlalchemy import Engine, func, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.audit import ANCHOR_TYPE, AuditFile
from hpc_ds1.eventlog.bus import EventBus, RawEvent, stream_sequence, until_answered
from hpc_ds1.events import AuditCheckpoint, envelope
from hpc_ds1.log import get_logger
from hpc_ds1.operations.archive import last_archived, merged
from hpc_ds1.projection.fold import find_gaps, fold
from hpc_ds1.projection.rebuild import report_problems
from hpc_ds1.projection.store import apply, read_checkpoint, record_gaps

log = get_logger("projector")

ANCHOR_EVERY_S = 60.0  # at most one audit anchor a minute, and only after other events
STUCK_AFTER_S = 5.0  # the same position failing this long: unhealthy
STALLED_AFTER_S = 15.0  # events waiting and the checkpoint still this long: unhealthy
# A trickle of events (one per request under a steady API load) would otherwise be one
# transaction each: the commit, checkpoint and audit append cost more than the rows. A batch
# smaller than this waits `linger_s` (HPC_DS1_PROJECTOR_LINGER_MS) for company, as Kafka's
# linger.ms: the projection lags a few ms more and costs less per event (docs/performance.md).
LINGER_BELOW = 32


def quick_next_msg(sub: Subscription) -> bool:
    """Let `sub.next_msg` hand over a message already queued without a task: nats-py's fetch
    takes each message of a batch with `next_msg`, which makes a uuid4, a task and an
    asyncio.wait_for (a second task) per message even when the message is waiting in the
    queue (a fifth of the projector's samples with 2,000-message batches). A queued message
    is taken as nats-py takes it (pending size, task_done); an empty queue, a closed
    connection or a callback subscription go to nats-py's own `next_msg` as before. Returns
    False (and changes nothing) if the subscription lacks what this relies on."""
    queue = getattr(sub, "_pending_queue", None)
    original = sub.next_msg
    if not isinstance(queue, asyncio.Queue) or not hasattr(sub, "_pending_size"):
        return False

    async def next_msg(timeout: float | None = 1.0) -> Msg:  # noqa: ASYNC109 (as nats-py)
        if queue.qsize() and not sub._conn.is_closed and not sub._cb:
            msg: Msg = queue.get_nowait()
            sub._pending_size -= len(msg.data)
            queue.task_done()
            return msg
        return await original(timeout)

    sub.next_msg = next_msg  # type: ignore[method-assign]
    return True


@dataclass(frozen=True)
class BatchResult:
    applied: int
    set_aside: int
    checkpoint: int
    audited: list[dict[str, Any]]  # the audit records written for this batch


def project_batch(
    engine: Engine, events: Sequence[RawEvent], audit: AuditFile | None
) -> BatchResult:
    """Fold and apply one batch in one transaction (a refused event set aside, not the batch)."""
    folded = [fold(e.seq, e.subject, e.data) for e in events]
    with engine.begin() as conn:
        checkpoint = read_checkpoint(conn, lock=True)
        missing = find_gaps(checkpoint, [f.seq for f in folded if f.seq > checkpoint])
        if missing:
            log.warning("sequence_gap", missing=[f"{a}-{b}" for a, b in missing])
            record_gaps(conn, missing)
        result = apply(conn, folded, checkpoint)
        report_problems(result)
        audited: list[dict[str, Any]] = []
        if audit is not None:
            # Written before the commit: a crash in between leaves the file ahead of the
            # checkpoint, and AuditFile skips the replayed sequences instead of duplicating them.
            # Every event beyond the file's end is written, applied now or before (by a
            # rebuild, or before the file lost a torn line), so the file never has a hole.
            audited = [f.audit for f in folded if f.seq > audit.last_seq]
            audit.append(audited)
    return BatchResult(len(result.applied), len(result.set_aside), result.checkpoint, audited)


def project(engine: Engine, events: Sequence[RawEvent], audit: AuditFile | None) -> int:
    """Fold and apply one batch in one transaction; returns how many were new."""
    result = project_batch(engine, events, audit)
    return result.applied + result.set_aside


class Projector:
    def __init__(
        self,
        engine: Engine,
        bus: EventBus,
        audit: AuditFile,
        batch: int = 500,
        anchor_every_s: float = ANCHOR_EVERY_S,
        stuck_after_s: float = STUCK_AFTER_S,
        stalled_after_s: float = STALLED_AFTER_S,
        linger_s: float = 0.0,
        archive: Path | None = None,
    ) -> None:
        self.engine = engine
        self.archive = archive  # the home's archive folder: read before the stream below it
        self.linger_s = linger_s
        self.bus = bus
        self.audit = audit
        self.batch = batch
        self.anchor_every_s = anchor_every_s
        self.stuck_after_s = stuck_after_s
        self.stalled_after_s = stalled_after_s
        self.applied = 0
        self.checkpoint = 0
        self.stream_last = 0
        self.set_aside = 0
        self.anchors = 0
        self._anchoring: asyncio.Task[int | None] | None = None
        self._failing_since: float | None = None
        self._failure = ""
        self._progress_at = time.monotonic()
        self._anchored_at = time.monotonic()
        # Whether the file holds events no anchor covers yet (an anchor itself does not count,
        # so the projector never anchors its own anchors).
        self._unanchored = audit.last_seq > 0 and audit.last_type != ANCHOR_TYPE

    # --- health ------------------------------------------------------------------------

    @property
    def lag(self) -> int:
        return max(0, self.stream_last - self.checkpoint)

    def problem(self) -> str | None:
        now = time.monotonic()
        if self._failing_since is not None and now - self._failing_since > self.stuck_after_s:
            return (
                f"stuck at seq {self.checkpoint + 1} for {now - self._failing_since:.0f} s: "
                f"{self._failure}"
            )
        if self.lag > 0 and now - self._progress_at > self.stalled_after_s:
            return f"no progress for {now - self._progress_at:.0f} s with {self.lag} events waiting"
        return None

    def facts(self) -> dict[str, Any]:
        """What the status reply carries: the gateway turns healthy=False into a 503."""
        problem = self.problem()
        return {
            "lag": self.lag,
            "checkpoint": self.checkpoint,
            "set_aside": self.set_aside,
            "healthy": problem is None,
            "problem": problem,
        }

    def _advanced(self, checkpoint: int) -> None:
        if checkpoint > self.checkpoint or self.lag == 0:
            self._progress_at = time.monotonic()
        self.checkpoint = max(self.checkpoint, checkpoint)

    def _failed(self, error: BaseException) -> None:
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._failure = type(getattr(error, "orig", None) or error).__name__

    # --- running -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        monitor = asyncio.create_task(self._monitor(stop))
        try:
            while not stop.is_set():
                try:
                    await self._follow(stop)
                except Exception as error:  # it never stops; it resumes from Postgres
                    self._failed(error)
                    log.error("projector_error", error=repr(error)[:500])
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 1.0)
        finally:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
            if self._anchoring is not None:
                await asyncio.gather(self._anchoring, return_exceptions=True)

    async def _monitor(self, stop: asyncio.Event) -> None:
        """Refresh what the health facts compare: the log's end, the checkpoint (a rebuild may
        move it) and the count of events set aside."""
        while not stop.is_set():
            with contextlib.suppress(Exception):
                self.stream_last = await self.bus.last_sequence()
            with contextlib.suppress(Exception):
                checkpoint, aside = await asyncio.to_thread(self._read_state)
                self._advanced(checkpoint)
                self.checkpoint, self.set_aside = checkpoint, aside
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    def _read_state(self) -> tuple[int, int]:
        with self.engine.begin() as conn:
            checkpoint = read_checkpoint(conn)
            aside = conn.execute(select(func.count()).select_from(tables.set_aside)).scalar_one()
        return checkpoint, int(aside)

    async def _follow(self, stop: asyncio.Event) -> None:
        # The checkpoint lives in Postgres, committed with the rows, so the stream position is
        # taken from there (or from the audit file's end, when the file is behind it: a torn
        # line cut off, or a rebuild that went past the live projector): an ordered, ack-less
        # consumer starting right after it.
        checkpoint, aside = await asyncio.to_thread(self._read_state)
        self._advanced(checkpoint)
        self.set_aside = aside
        start = min(checkpoint, self.audit.last_seq) + 1
        start = await self._from_archive(start)
        # Asked again while a cluster elects a leader: an answer lost on the way leaves only an
        # ephemeral consumer that expires after inactive_threshold.
        sub = await until_answered(
            lambda: self.bus.js.pull_subscribe(
                f"{self.bus.prefix}.>",
                durable=None,
                stream=self.bus.stream,
                config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=start,
                    ack_policy=AckPolicy.NONE,
                    inactive_threshold=60.0,
                    mem_storage=True,
                ),
            ),
            self.bus.stream,
        )
        quick_next_msg(sub._sub)
        # The next fetch runs while this batch is written, so NATS and Postgres overlap.
        fetching = asyncio.create_task(self._fetch(sub))
        try:
            while not stop.is_set():
                events = await fetching
                if stop.is_set() and not events:
                    break
                if self.linger_s and 0 < len(events) < LINGER_BELOW and not stop.is_set():
                    await asyncio.sleep(self.linger_s)
                    events += await self._fetch(sub, self.linger_s)
                fetching = asyncio.create_task(self._fetch(sub))
                if not events:
                    # Caught up with all the log delivers (a message deleted at its end is
                    # never delivered, so the log's last sequence alone could say "stalled").
                    self._failing_since = None
                    self._progress_at = time.monotonic()
                    await self._maybe_anchor()
                    continue
                started = time.perf_counter()
                result = await asyncio.to_thread(project_batch, self.engine, events, self.audit)
                self._failing_since = None
                self.applied += result.applied
                self.set_aside += result.set_aside
                self._advanced(result.checkpoint)
                if any(r.get("type") != ANCHOR_TYPE for r in result.audited):
                    self._unanchored = True
                log.debug(
                    "batch",
                    events=len(events),
                    applied=result.applied,
                    set_aside=result.set_aside,
                    ms=round((time.perf_counter() - started) * 1000, 2),
                )
                # Anchors come when the projector is idle (caught up); under a load that never
                # lets it idle, once five intervals have gone by.
                await self._maybe_anchor(overdue=5.0)
        finally:
            fetching.cancel()
            await asyncio.gather(fetching, return_exceptions=True)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _from_archive(self, start: int) -> int:
        """Fold what lies at or below the archive's last sequence from `start` (a restored or
        emptied projection), the archive's segments merged with the stream; where to go on."""
        if self.archive is None:
            return start
        top = await asyncio.to_thread(last_archived, self.archive)
        if top < start:
            return start
        async for chunk in merged(self.bus, self.archive, start, stop_at=top, batch=self.batch):
            result = await asyncio.to_thread(project_batch, self.engine, chunk, self.audit)
            self.applied += result.applied
            self.set_aside += result.set_aside
            self._advanced(result.checkpoint)
        return top + 1

    async def _fetch(
        self, sub: JetStreamContext.PullSubscription, wait_s: float = 0.25
    ) -> list[RawEvent]:
        try:
            msgs = await sub.fetch(self.batch, timeout=wait_s)
        except (NatsTimeout, TimeoutError):
            return []
        return [RawEvent(stream_sequence(m), m.subject, m.data) for m in msgs]

    async def _maybe_anchor(self, overdue: float = 1.0) -> None:
        """Anchor in the background (the fold never waits on it), one at a time."""
        due = time.monotonic() - self._anchored_at >= self.anchor_every_s * overdue
        if self._unanchored and due and (self._anchoring is None or self._anchoring.done()):
            self._anchoring = asyncio.create_task(self.anchor())

    async def anchor(self) -> int | None:
        """Append an `audit.checkpoint` event: the audit file's last sequence and hash now.
        A failed append is logged and tried again after the interval."""
        if self.audit.last_seq == 0:
            return None
        event = AuditCheckpoint(
            seq=self.audit.last_seq, hash=self.audit.last_hash, lines=self.audit.lines
        )
        self._anchored_at = time.monotonic()
        self._unanchored = False
        try:
            seq = await self.bus.publish(
                envelope(event, actor="projector", source="projector", prefix=self.bus.prefix)
            )
        except Exception as error:
            self._unanchored = True
            log.warning("audit_anchor_failed", seq=event.seq, error=repr(error)[:300])
            return None
        self.anchors += 1
        log.info("audit_anchored", seq=event.seq, hash=event.hash, event_seq=seq)
        return seq
