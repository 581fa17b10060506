"""Cancelling a tuning session: the one rule every surface (HTTP, the console, the CLI) goes
through (issue 44, item 4). The cancel is an event, `cancel.requested`, naming who asked; the
coordinator that drives the session reads it, has the device's agent kill the run in flight
(its whole process group) and finishes the session `interrupted`."""

from __future__ import annotations

import orjson

from ..eventlog.bus import ConcurrencyConflict, EventBus
from ..events import SessionCancelRequested, envelope
from ..requests import SAFE_ID, SAFE_ID_RULE

CANCEL_AGGREGATE = SessionCancelRequested.aggregate


class CancelError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def cancel_of(bus: EventBus, session_id: str) -> SessionCancelRequested | None:
    """The session's cancel, when someone asked for one; None otherwise."""
    msg = await bus.stored(subject=cancel_subject(bus.prefix, session_id))
    if msg is None:
        return None
    data = orjson.loads(msg.data or b"{}").get("data", {})
    return SessionCancelRequested.model_validate(data)


def cancel_subject(prefix: str, session_id: str) -> str:
    return f"{prefix}.{CANCEL_AGGREGATE}.{session_id}.{SessionCancelRequested.name}"


async def cancel_session(
    bus: EventBus,
    session_id: str,
    by: str,
    role: str,
    reason: str = "",
    identity: str | None = None,
) -> SessionCancelRequested:
    """Record that `by` (with `role`) cancels the session, exactly once. 422: not a session id;
    404: no such session; 409: it has finished already, or someone cancelled it before (both
    say how, and who). `identity`: the person at the site's OpenID provider (None: a token's
    holder)."""
    if not SAFE_ID.match(session_id):
        raise CancelError(422, f"a session id is {SAFE_ID_RULE}")
    prefix = bus.prefix
    if await bus.stored(subject=f"{prefix}.session.{session_id}.started") is None:
        raise CancelError(404, f"no session {session_id}")
    finished = await bus.stored(subject=f"{prefix}.session.{session_id}.finished")
    if finished is not None:
        data = orjson.loads(finished.data or b"{}").get("data", {})
        raise CancelError(
            409, f"session {session_id} has already finished ({data.get('reason', '?')})"
        )
    before = await cancel_of(bus, session_id)
    if before is not None:
        raise CancelError(409, f"session {session_id} was already cancelled by {before.by}")
    event = SessionCancelRequested(
        session_id=session_id, by=by, role=role, identity=identity, reason=reason
    )
    try:
        await bus.publish(
            envelope(event, actor=by, source="cancels", prefix=prefix, correlation_id=session_id),
            expected_version=0,
        )
    except ConcurrencyConflict:
        raise CancelError(409, f"session {session_id} was cancelled by someone else") from None
    return event
