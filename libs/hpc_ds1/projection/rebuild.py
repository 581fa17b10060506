"""Rebuild the projection: empty the read models and fold the whole log again (the stream and
the archive's segments), in one transaction. `hpc-ds1 projection rebuild` runs it; the live
projector (services/projector) folds the same way, event by event."""

from __future__ import annotations

import asyncio
import queue
from pathlib import Path

from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.log import get_logger
from hpc_ds1.operations.archive import merged

from .fold import Folded, find_gaps, fold
from .store import Applied, apply, read_checkpoint, record_gaps, truncate_read_models

log = get_logger("projector")


def report_problems(result: Applied) -> None:
    for item in result.applied:
        if item.problem:
            log.warning("event_kept_invalid", seq=item.seq, problem=item.problem)
    for aside in result.set_aside:
        log.error("event_set_aside", seq=aside.seq, reason=aside.row["reason"])


async def rebuild(
    engine: Engine, bus: EventBus, batch: int = 2000, archive: Path | None = None
) -> int:
    """Empty the read models and fold the whole log again, in one transaction; the live
    projector waits on the checkpoint lock and then finds nothing left to do. An event
    Postgres refuses is set aside, as the live projector does. `archive`: the home's archive
    folder, whose segments are folded in sequence order with the stream.

    The log is read and folded here while a thread writes the chunks folded before: Postgres
    works in its own process meanwhile, so the fold no longer waits for the writes, nor they
    for the fold (docs/performance.md)."""
    end = await bus.last_sequence()
    # Folded chunks in order; then None (the log is read whole: commit) or `_ABANDON`.
    chunks: queue.SimpleQueue[list[Folded] | str | None] = queue.SimpleQueue()

    def write() -> int:
        with engine.begin() as conn:
            read_checkpoint(conn, lock=True)
            truncate_read_models(conn)
            checkpoint = 0
            aside = 0
            while (folded := chunks.get()) is not None:
                if folded == _ABANDON:  # reading failed: a log cut short is never committed
                    raise RebuildAbandoned(f"reading the log failed after seq {checkpoint}")
                assert isinstance(folded, list)
                missing = find_gaps(checkpoint, [f.seq for f in folded])
                record_gaps(conn, missing)
                result = apply(conn, folded, checkpoint)
                report_problems(result)
                checkpoint = result.checkpoint
                aside += len(result.set_aside)
            if aside:
                log.warning("rebuild_set_aside", events=aside)
            return checkpoint

    writing = asyncio.ensure_future(asyncio.to_thread(write))
    try:
        async for chunk in merged(bus, archive, 1, stop_at=end, batch=batch):
            if writing.done():  # it failed: raised below, nothing more is worth reading
                break
            chunks.put([fold(e.seq, e.subject, e.data) for e in chunk])
    except BaseException:
        chunks.put(_ABANDON)
        await asyncio.wait([writing])  # rolled back before the error goes up
        raise
    chunks.put(None)
    return await writing


_ABANDON = "abandon"


class RebuildAbandoned(Exception):
    """The rebuild stopped before the end of the log; nothing of it was committed."""
