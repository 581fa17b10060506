"""Deciding a waiting move: the one rule every surface (HTTP, terminal) goes through."""

from __future__ import annotations

from .bus import ConcurrencyConflict, EventBus
from .events import ApprovalDecided, ApprovalRequested, envelope, typed


class ApprovalError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def decide_approval(
    bus: EventBus, approval_id: str, approved: bool, by: str, role: str, note: str = ""
) -> ApprovalDecided:
    """Record an engineer's verdict on a waiting move, exactly once (404: no such approval;
    409: already decided, also when two engineers answer at the same time)."""
    history = await bus.history("approval", approval_id)
    if not history:
        raise ApprovalError(404, f"no approval {approval_id}")
    events = [typed(env) for _, env in history]
    decided = [e for e in events if isinstance(e, ApprovalDecided)]
    if decided:
        verdict = "approved" if decided[0].approved else "rejected"
        raise ApprovalError(409, f"approval {approval_id} was already {verdict} by {decided[0].by}")
    requested = next(e for e in events if isinstance(e, ApprovalRequested))
    event = ApprovalDecided(
        approval_id=approval_id,
        session_id=requested.session_id,
        decision_id=requested.decision_id,
        approved=approved,
        by=by,
        role=role,
        note=note,
    )
    try:
        await bus.publish(
            envelope(event, actor=by, source="approvals", prefix=bus.prefix),
            expected_version=history[-1][0],
        )
    except ConcurrencyConflict:
        raise ApprovalError(409, f"approval {approval_id} was decided by someone else") from None
    return event
