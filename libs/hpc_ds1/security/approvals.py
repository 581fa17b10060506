"""Deciding a waiting move: the one rule every surface (HTTP, terminal) goes through."""

from __future__ import annotations

from ..eventlog.bus import ConcurrencyConflict, EventBus
from ..events import (
    SUBJECT_TOKEN,
    ApprovalDecided,
    ApprovalRequested,
    ApprovalWithdrawn,
    Event,
    MalformedEvent,
    decode,
    envelope,
    typed,
)


class ApprovalError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def decide_approval(
    bus: EventBus,
    approval_id: str,
    approved: bool,
    by: str,
    role: str,
    note: str = "",
    identity: str | None = None,
) -> ApprovalDecided:
    """Record an engineer's verdict on a waiting move, exactly once (404: no such approval;
    409: already decided, also when two engineers answer at the same time). `by` names who
    (the token's holder, or the person signed in at the site's OpenID provider); `identity` is
    that person at the provider, '<issuer>#<sub>' (None: a token's holder)."""
    if not SUBJECT_TOKEN.match(approval_id) or len(approval_id) > 128:
        raise ApprovalError(422, "an approval id is 1 to 128 letters, digits, '_', '-' or ':'")
    version = await bus.aggregate_version("approval", approval_id)
    events = await _events(bus, approval_id, version)
    decided = [e for e in events if isinstance(e, ApprovalDecided)]
    if decided:
        verdict = "approved" if decided[0].approved else "rejected"
        raise ApprovalError(409, f"approval {approval_id} was already {verdict} by {decided[0].by}")
    withdrawn = next((e for e in events if isinstance(e, ApprovalWithdrawn)), None)
    if withdrawn is not None:
        raise ApprovalError(409, f"approval {approval_id} was withdrawn: {withdrawn.reason}")
    requested = next((e for e in events if isinstance(e, ApprovalRequested)), None)
    if requested is None:
        raise ApprovalError(404, f"no approval {approval_id}")
    event = ApprovalDecided(
        approval_id=approval_id,
        session_id=requested.session_id,
        decision_id=requested.decision_id,
        approved=approved,
        by=by,
        role=role,
        note=note,
        identity=identity,
    )
    try:
        await bus.publish(
            envelope(event, actor=by, source="approvals", prefix=bus.prefix),
            expected_version=version,
        )
    except ConcurrencyConflict:
        raise ApprovalError(409, f"approval {approval_id} was decided by someone else") from None
    return event


async def withdraw_approval(
    bus: EventBus, approval_id: str, reason: str, actor: str
) -> ApprovalWithdrawn | None:
    """Withdraw a waiting move whose session ended (cancelled while paused on it). None when
    there is nothing to withdraw: no request, a verdict already given (also one given at the
    same moment: the append expects the approval's version), or withdrawn before (its fixed
    envelope id makes a coordinator's retry a duplicate)."""
    version = await bus.aggregate_version("approval", approval_id)
    events = await _events(bus, approval_id, version)
    if any(isinstance(e, ApprovalDecided | ApprovalWithdrawn) for e in events):
        return None
    requested = next((e for e in events if isinstance(e, ApprovalRequested)), None)
    if requested is None:
        return None
    event = ApprovalWithdrawn(
        approval_id=approval_id,
        session_id=requested.session_id,
        decision_id=requested.decision_id,
        reason=reason,
    )
    withdrawal = envelope(event, actor=actor, source="coordinator", prefix=bus.prefix)
    withdrawal = withdrawal.model_copy(update={"id": f"{approval_id}-withdrawn"})
    try:
        await bus.publish(withdrawal, expected_version=version)
    except ConcurrencyConflict:
        return None  # an engineer's verdict came first: it stands
    return event


async def _events(bus: EventBus, approval_id: str, version: int) -> list[Event]:
    """The approval's typed events; a message on its subjects that is no event is skipped."""
    found: list[Event] = []
    if version == 0:
        return found
    subjects = bus.aggregate_subjects("approval", approval_id)
    async for chunk in bus.replay(1, subjects, stop_at=version):
        for raw in chunk:
            try:
                event = typed(decode(raw.data, raw.subject))
            except MalformedEvent:
                continue
            if event is not None:
                found.append(event)
    return found
