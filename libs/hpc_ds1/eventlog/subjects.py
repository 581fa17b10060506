"""Request/reply subjects between services (core NATS, outside the event stream)."""

from __future__ import annotations

from ..settings import Settings


def _svc(settings: Settings) -> str:
    return f"{settings.subject_prefix}-svc"


def status_subject(settings: Settings, service: str) -> str:
    return f"{_svc(settings)}.{service}.status"


def agent_run_subject(settings: Settings, device_id: str) -> str:
    return f"{_svc(settings)}.agent.{device_id}.run"


def agent_cancel_subject(settings: Settings, device_id: str) -> str:
    """Ask the device's agent to kill the run of a cancelled session (its whole process group),
    running or still queued (issue 44, item 4)."""
    return f"{_svc(settings)}.agent.{device_id}.cancel"


def train_subject(settings: Settings) -> str:
    return f"{_svc(settings)}.trainer.train"


def decide_subject(settings: Settings) -> str:
    return f"{_svc(settings)}.decision.decide"


def start_session_subject(settings: Settings) -> str:
    return f"{_svc(settings)}.coordinator.start_session"


def work_subject(settings: Settings, device_id: str) -> str:
    """The device's task queue in the work stream (settings.work_stream)."""
    return f"{settings.work_prefix}.{device_id}"


def placement_subject(settings: Settings) -> str:
    """Ask placement for every device's expected finish of a job (request/reply, no event)."""
    return f"{_svc(settings)}.placement.estimate"
