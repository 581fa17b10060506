"""A token's limits in the projection: token.created's expires_at and max_uses on its row, and
each token.used counted once in `uses` (a batch folded again counts nothing twice). A token
made before the limits existed reads as one without them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.audit import AuditFile
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import TokenCreated, TokenRevoked, TokenUsed, decode, envelope, typed
from hpc_ds1.services.projector import project
from hpc_ds1.settings import Settings

from .events import wrap

SHA = "b" * 64


async def test_uses_are_counted_once_and_the_limits_kept(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    expires = datetime.now(UTC) + timedelta(hours=24)
    events = [
        TokenCreated(
            token_id="tj",
            holder="fleet-join",
            role="join",
            sha256=SHA,
            expires_at=expires,
            max_uses=3,
        ),
        TokenUsed(token_id="tj", device_id="dev-1"),
        TokenUsed(token_id="tj", device_id="dev-2"),
    ]
    await bus.publish_many([wrap(bus, e) for e in events], window=1)
    folded = [e async for chunk in bus.replay() for e in chunk]
    assert project(engine, folded, AuditFile(settings.audit_path)) == 3
    # Folded again (a redelivery): nothing is counted twice.
    assert project(engine, folded, AuditFile(settings.audit_path)) == 0
    await bus.publish(wrap(bus, TokenRevoked(token_id="tj")))
    project(engine, [e async for c in bus.replay() for e in c], AuditFile(settings.audit_path))
    with engine.connect() as conn:
        row = conn.execute(select(tables.tokens)).mappings().one()
    assert (row["max_uses"], row["uses"], row["revoked"]) == (3, 2, True)
    assert row["expires_at"] == expires


def test_a_token_created_before_the_limits_reads_without_them() -> None:
    old = TokenCreated(token_id="t0", holder="bob", role="engineer", sha256=SHA)
    env = envelope(old, actor="bob", source="cli")
    data = {k: v for k, v in env.data.items() if k not in ("expires_at", "max_uses")}
    stored = env.model_copy(update={"data": data}).to_json()
    event = typed(decode(stored))
    assert isinstance(event, TokenCreated) and env.version == 1
    assert (event.expires_at, event.max_uses) == (None, None)


def test_only_a_join_token_has_limits_and_they_are_sane() -> None:
    with pytest.raises(ValidationError, match="join tokens only"):
        TokenCreated(token_id="t1", holder="bob", role="admin", sha256=SHA, max_uses=1)
    with pytest.raises(ValidationError):
        TokenCreated(token_id="t1", holder="j", role="join", sha256=SHA, max_uses=0)
    with pytest.raises(ValidationError):  # a time without its zone is no instant
        TokenCreated(
            token_id="t1", holder="j", role="join", sha256=SHA, expires_at=datetime(2030, 1, 1)
        )
