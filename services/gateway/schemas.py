"""Response shapes the gateway declares in its OpenAPI spec, errors included, so a client (or
schemathesis) can check every answer against the spec."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Issue(BaseModel):
    """One field that was not accepted: where, why and the kind of error."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    """Every error: a sentence saying what was wrong and what is accepted; for invalid input
    also one entry per field (the input itself is never echoed)."""

    model_config = ConfigDict(extra="forbid")

    error: str
    detail: list[Issue] | None = None
    request_id: str | None = Field(default=None, description="Set on internal errors.")


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


Responses = dict[int | str, dict[str, Any]]

E400: Responses = {400: _error("The body could not be read as the declared media type.")}
E401: Responses = {401: _error("No token, or an unknown or revoked one.")}
E403: Responses = {
    403: _error("The token's role may not do this (or a cross-origin cookie request).")
}
E404: Responses = {404: _error("Not found.")}
E409: Responses = {409: _error("Conflicts with the current state.")}
E413: Responses = {413: _error("The body is larger than the gateway accepts.")}
E422: Responses = {422: _error("Invalid input: which field and what is accepted.")}
E503: Responses = {503: _error("A service it needs did not answer in time.")}
E429: Responses = {
    429: _error(
        "Too many failed authentications (or joins) from this address: retry after the "
        "Retry-After header's seconds."
    )
}
# Every call with a credential may meet the limit on failed authentications: 429 goes with 401.
ERRORS_401_403: Responses = {**E401, **E403, **E429}
READ_ERRORS: Responses = {**E401, **E403, **E422, **E429}
WRITE_ERRORS: Responses = {**E400, **E401, **E403, **E413, **E422, **E429}


class AuditRow(BaseModel):
    seq: int
    time: str | None
    source: str
    device_id: str
    workload: str
    size: int
    config: dict[str, Any]
    choice: str
    confidence: float
    mode: str
    actor: str
    approved: str | None = Field(description="Who approved it, 'auto', or the approval status.")
    approval: str | None
    decision_id: str
    session_id: str | None
    model_version: str | None
    reasons: list[Any]


class AuditPage(BaseModel):
    decisions: list[AuditRow]
    next_after: int | None
    next_before: int | None


class Stats(BaseModel):
    devices_online: int
    sessions_running: int
    tasks_running: int | None
    moves_waiting: int
    decisions_total: int
    decisions_auto: int
    auto_share: float | None


class Decision(BaseModel):
    """The model's next move; extra fields (alternatives, ...) may follow."""

    model_config = ConfigDict(extra="allow")

    decision_id: str
    device_id: str
    source: str
    workload: str
    size: int
    config: dict[str, Any]
    choice: str
    confidence: float
    mode: str
    reasons: list[str]
    model_version: str | None = None
    session_id: str | None = None
    telemetry: dict[str, Any] | None = None
    ran: bool
    actor: str
    alternatives: dict[str, float] = Field(
        default_factory=dict, description="Every feasible move (and STOP) -> probability."
    )
    predicted_runtime_s: float | None = Field(
        default=None, description="Expected runtime after the chosen move."
    )
    predicted_runtimes_s: dict[str, float] = Field(
        default_factory=dict, description="Expected runtime after each move (STOP: as it is)."
    )
    familiarity: dict[str, Any] | None = Field(
        default=None,
        description="The guard's distance from the training data, its threshold, familiar.",
    )
    system1: dict[str, Any] | None = Field(
        default=None,
        description="System 1: the whole configuration before anything runs (config, label, "
        "predicted_runtime_s, confidence, mode, reasons); null for an unregistered workload.",
    )


class Approvals(BaseModel):
    approvals: list[dict[str, Any]]


class Sessions(BaseModel):
    sessions: list[dict[str, Any]]


class SessionStartedOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    session_id: str
    device_id: str
    start: dict[str, Any]
    warm: dict[str, Any] | None = Field(
        default=None, description="The fleet's measurements it started from (tune --warm)."
    )


class TaskPlacementOut(BaseModel):
    """Where the current attempt was placed and why (placement's task.placed event)."""

    device_id: str
    config: dict[str, Any]
    expected_s: float | None
    queue_s: float | None
    basis: str | None
    reason: str | None
    runner_up: str | None
    guard_rejected: bool
    candidates: list[dict[str, Any]]
    attempt: int | None
    verified: bool | None = Field(
        default=None,
        description="Whether the device had run the job for the fleet; false: its estimate "
        "was its own claim, counted no faster than the verified best less the fleet's spread.",
    )
    claimed_s: float | None = Field(
        default=None, description="The device's own estimate, when expected_s counts it higher."
    )


class TaskResultOut(BaseModel):
    device_id: str | None
    config: dict[str, Any] | None
    runtime_s: float | None
    expected_s: float | None
    measurement_id: str | None
    off_estimate: str | None = Field(
        default=None,
        description="Set when the runtime was far from the device's own estimate: how far.",
    )


class TaskOut(BaseModel):
    """A task: submitted, waiting (waiting_for says for what), placed, running, finished
    (result) or failed (failures: every abandoned attempt's reason)."""

    task_id: str
    workload: str
    size: int
    status: str = Field(description="submitted, waiting, placed, running, finished or failed")
    submitted_by: str
    submitted_at: str
    attempt: int
    placement: TaskPlacementOut | None = None
    waiting_for: str | None = None
    result: TaskResultOut | None = None
    failures: list[str] = Field(default_factory=list)
    updated_at: str
    placed_at: str | None = Field(default=None, description="When the current attempt was placed.")
    started_at: str | None = Field(default=None, description="When it started on its device.")
    finished_at: str | None = Field(default=None, description="When it finished (status finished).")


class WorkloadOut(BaseModel):
    name: str
    min_size: int = Field(description="The smallest size a task of it may have.")
    max_size: int = Field(description="The largest size a task of it may have.")


class Workloads(BaseModel):
    workloads: list[WorkloadOut]


class TasksPage(BaseModel):
    tasks: list[TaskOut]
    next_before: str | None = Field(description="Pass as `before` for the next (older) page.")


class AgentResultOut(BaseModel):
    """Whether a task result was recorded; `why` says why not (it was already)."""

    recorded: bool
    measurement_id: str | None = None
    why: str | None = None


class RefusedMeasurement(BaseModel):
    measurement_id: str = Field(description="The id as the device sent it.")
    why: str = Field(description="Why its runtime cannot be true.")


class MeasurementsUploaded(BaseModel):
    accepted: int = Field(description="New measurements appended to the log.")
    known: int = Field(description="Already recorded (by measurement_id): not appended again.")
    refused: list[RefusedMeasurement] = Field(
        default_factory=list,
        description="Not recorded: a runtime faster than the device's claimed hardware could "
        "run the job, or far ahead of the fleet's verified runtimes of it.",
    )


class ModelUploaded(BaseModel):
    model_version: str
