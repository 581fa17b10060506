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


def takes(state: TaskState, event: Event) -> bool:
    """Whether `event` changes the task beyond its version: the guard of each transition of
    `evolve`. The projector's `tasks` rows apply the same guards (hpc_ds1.projection.fold)."""
    s = state
    match event:
        case TaskSubmitted():
            return s.status == "unknown"
        case TaskPlaced():
            return s.status not in ("unknown", *DONE) and s.attempt < event.attempt
        case TaskWaiting():
            return s.status in ("submitted", "waiting")
        case TaskStarted():
            return (
                s.status == "placed"
                and s.attempt == event.attempt
                and (s.device_id == event.device_id)
            )
        case TaskFinished():
            return s._current(event.attempt) and s.device_id == event.device_id
        case TaskRunFailed():
            return s._current(event.attempt) and len(s.failures) < event.attempt
        case TaskRequeued():
            return s._current(event.attempt)
        case TaskFailed():
            return s.status not in DONE
    return False


def evolve(state: TaskState, seq: int, event: Event) -> TaskState:
    """The task after one of its events (any other event only moves the version)."""
    s = replace(state, version=max(state.version, seq))
    if not takes(state, event):
        return s
    match event:
        case TaskSubmitted():
            return replace(
                s,
                task_id=event.task_id,
                workload=event.workload,
                size=event.size,
                status="submitted",
            )
        case TaskPlaced():
            return replace(s, status="placed", attempt=event.attempt, device_id=event.device_id)
        case TaskWaiting():
            return replace(s, status="waiting")
        case TaskStarted():
            return replace(s, status="running")
        case TaskFinished():
            return replace(s, status="finished")
        case TaskRunFailed():
            reason = failure_reason(event.device_id, event.error)
            return replace(
                s, failures=(*s.failures, reason), failed_on=(*s.failed_on, event.device_id)
            )
        case TaskRequeued():
            failures = s.failures if s.current_failed else (*s.failures, event.reason)
            return replace(s, status="submitted", failures=failures)
        case TaskFailed():
            return replace(s, status="failed", failures=tuple(event.reasons) or s.failures)
    return s


def fold(events: Iterable[tuple[int, Event]]) -> TaskState:
    state = TaskState()
    for seq, event in events:
        state = evolve(state, seq, event)
    return state
