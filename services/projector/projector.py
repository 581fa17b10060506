"""The projector loop: read the log in order from the checkpoint, fold, write, commit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlalchemy import Engine

from hpc_ds1.audit import AuditFile
from hpc_ds1.bus import EventBus, RawEvent
from hpc_ds1.log import get_logger

from .domain import Folded, find_gaps, fold
from .store import apply_batch, read_checkpoint, record_gaps, truncate_read_models

log = get_logger("projector")


def project(engine: Engine, events: Sequence[RawEvent], audit: AuditFile | None) -> int:
    """Fold and apply one batch in one transaction; returns how many were new."""
    folded = [fold(e.seq, e.subject, e.data) for e in events]
    with engine.begin() as conn:
        checkpoint = read_checkpoint(conn, lock=True)
        missing = find_gaps(checkpoint, [f.seq for f in folded if f.seq > checkpoint])
        if missing:
            log.warning("sequence_gap", missing=[f"{a}-{b}" for a, b in missing])
            record_gaps(conn, missing)
        fresh, _ = apply_batch(conn, folded, checkpoint)
        _report_problems(fresh)
        if audit is not None:
            # Written before the commit: a crash in between leaves the file ahead of the
            # checkpoint, and AuditFile skips the replayed sequences instead of duplicating them.
            audit.append(f.audit for f in fresh)
    return len(fresh)


def _report_problems(folded: Sequence[Folded]) -> None:
    for item in folded:
        if item.problem:
            log.warning("event_set_aside", seq=item.seq, problem=item.problem)


class Projector:
    def __init__(self, engine: Engine, bus: EventBus, audit: AuditFile, batch: int = 500) -> None:
        self.engine = engine
        self.bus = bus
        self.audit = audit
        self.batch = batch
        self.applied = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._follow(stop)
            except Exception as error:  # the projector never stops; it resumes from Postgres
                log.error("projector_error", error=repr(error))
                await asyncio.sleep(1.0)

    async def _follow(self, stop: asyncio.Event) -> None:
        # The checkpoint lives in Postgres, committed with the rows, so the stream position is
        # taken from there: an ordered, ack-less consumer starting right after it.
        checkpoint = await asyncio.to_thread(self._checkpoint)
        sub = await self.bus.js.pull_subscribe(
            f"{self.bus.prefix}.>",
            durable=None,
            stream=self.bus.stream,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=checkpoint + 1,
                ack_policy=AckPolicy.NONE,
                inactive_threshold=60.0,
                mem_storage=True,
            ),
        )
        # The next fetch runs while this batch is written, so NATS and Postgres overlap.
        fetching = asyncio.create_task(self._fetch(sub))
        try:
            while not stop.is_set():
                events = await fetching
                fetching = asyncio.create_task(self._fetch(sub))
                if not events:
                    continue
                started = time.perf_counter()
                fresh = await asyncio.to_thread(project, self.engine, events, self.audit)
                self.applied += fresh
                log.debug(
                    "batch",
                    events=len(events),
                    applied=fresh,
                    ms=round((time.perf_counter() - started) * 1000, 2),
                )
        finally:
            fetching.cancel()
            await asyncio.gather(fetching, return_exceptions=True)
            await sub.unsubscribe()

    async def _fetch(self, sub: JetStreamContext.PullSubscription) -> list[RawEvent]:
        try:
            msgs = await sub.fetch(self.batch, timeout=0.25)
        except (NatsTimeout, TimeoutError):
            return []
        return [RawEvent(m.metadata.sequence.stream, m.subject, m.data) for m in msgs]

    def _checkpoint(self) -> int:
        with self.engine.begin() as conn:
            return read_checkpoint(conn)


async def rebuild(engine: Engine, bus: EventBus, batch: int = 2000) -> int:
    """Empty the read models and fold the whole log again, in one transaction; the live
    projector waits on the checkpoint lock and then finds nothing left to do."""
    end = await bus.last_sequence()
    chunks: list[list[Folded]] = []
    async for chunk in bus.replay(1, stop_at=end, batch=batch):
        chunks.append([fold(e.seq, e.subject, e.data) for e in chunk])

    def write() -> int:
        with engine.begin() as conn:
            read_checkpoint(conn, lock=True)
            truncate_read_models(conn)
            checkpoint = 0
            for folded in chunks:
                missing = find_gaps(checkpoint, [f.seq for f in folded])
                record_gaps(conn, missing)
                _, checkpoint = apply_batch(conn, folded, checkpoint)
            return checkpoint

    return await asyncio.to_thread(write)
