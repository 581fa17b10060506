"""A rebuild reads and folds the log while a thread writes what it folded before; when reading
fails part way, nothing of it is committed: the projection stays as it was."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus, RawEvent
from hpc_ds1.projection import rebuild as rebuilding
from hpc_ds1.services.projector import project

from ..services.projector.events import measurement
from ..services.projector.projection import snapshot


async def test_a_rebuild_whose_reading_fails_commits_nothing(
    engine: Engine, bus: EventBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    await bus.publish_many([measurement(bus, i) for i in range(9)])
    project(engine, [e async for chunk in bus.replay() for e in chunk], None)
    before = snapshot(engine)
    real = rebuilding.merged

    async def failing(*args: Any, **kwargs: Any) -> AsyncIterator[list[RawEvent]]:
        async for chunk in real(*args, **kwargs):
            yield chunk
            raise ConnectionError("the stream went away")

    monkeypatch.setattr(rebuilding, "merged", failing)
    with pytest.raises(ConnectionError):
        await rebuilding.rebuild(engine, bus, batch=2)
    assert snapshot(engine) == before
    monkeypatch.undo()
    assert await rebuilding.rebuild(engine, bus, batch=2) == await bus.last_sequence()
    assert snapshot(engine) == before
