"""A task's lifecycle as a pure fold over its events, with the same rules as the projector's
`tasks` rows: each event names the attempt it is about and changes the task only while that
attempt is current and the task is where the event can come from, so a repeated, late or stale
event (a result of an attempt already requeued) changes nothing. `failures` holds one reason
per abandoned attempt, in order."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from ..events import (
    Event,
    TaskFailed,
    TaskFinished,
    TaskPlaced,
    TaskRequeued,
    TaskRunFailed,
    TaskStarted,
    TaskSubmitted,
    TaskWaiting,
)

Status = Literal["unknown", "submitted", "waiting", "placed", "running", "finished", "failed"]
ACTIVE = ("placed", "running")  # an attempt is out on a device
DONE = ("finished", "failed")


def failure_reason(device_id: str, error: str) -> str:
    """How a failed run reads in the task's failures and in its requeue."""
    return f"failed on {device_id}: {error}"


@dataclass(frozen=True)
class TaskState:
    task_id: str = ""
    workload: str = ""
    size: int = 0
    status: Status = "unknown"
    attempt: int = 0
    device_id: str | None = None
    failures: tuple[str, ...] = ()
    failed_on: tuple[str, ...] = ()  # the device of each failed run, in order
    version: int = 0  # the stream sequence of the task's last event

    @property
    def current_failed(self) -> bool:
        """The current attempt's run failed and nobody has requeued or failed the task yet."""
        return self.status in ACTIVE and len(self.failures) >= self.attempt

    def _current(self, attempt: int) -> bool:
        return self.status in ACTIVE and self.attempt == attempt


def evolve(state: TaskState, seq: int, event: Event) -> TaskState:
    """The task after one of its events (any other event only moves the version)."""
    s = replace(state, version=max(state.version, seq))
    match event:
        case TaskSubmitted() if s.status == "unknown":
            return replace(
                s,
                task_id=event.task_id,
                workload=event.workload,
                size=event.size,
                status="submitted",
            )
        case TaskPlaced() if s.status not in ("unknown", *DONE) and s.attempt < event.attempt:
            return replace(s, status="placed", attempt=event.attempt, device_id=event.device_id)
        case TaskWaiting() if s.status in ("submitted", "waiting"):
            return replace(s, status="waiting")
        case TaskStarted() if s.status == "placed" and s.attempt == event.attempt:
            return replace(s, status="running") if s.device_id == event.device_id else s
        case TaskFinished() if s._current(event.attempt) and s.device_id == event.device_id:
            return replace(s, status="finished")
        case TaskRunFailed() if s._current(event.attempt) and len(s.failures) < event.attempt:
            reason = failure_reason(event.device_id, event.error)
            return replace(
                s, failures=(*s.failures, reason), failed_on=(*s.failed_on, event.device_id)
            )
        case TaskRequeued() if s._current(event.attempt):
            failures = s.failures if s.current_failed else (*s.failures, event.reason)
            return replace(s, status="submitted", failures=failures)
        case TaskFailed() if s.status not in DONE:
            return replace(s, status="failed", failures=tuple(event.reasons) or s.failures)
    return s


def fold(events: Iterable[tuple[int, Event]]) -> TaskState:
    state = TaskState()
    for seq, event in events:
        state = evolve(state, seq, event)
    return state
