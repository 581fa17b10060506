"""Every event type of HPC-DS1, one frozen model each. Add a type here and regenerate schemas/."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from .base import Event


class DeviceRegistered(Event):
    """A device joined (or re-joined) with its hardware fingerprint."""

    aggregate = "device"
    name = "registered"
    id_field = "device_id"

    device_id: str
    hostname: str
    fingerprint: dict[str, Any] = Field(default_factory=dict)
    local: bool = Field(default=False, description="The coordinator's own machine.")


class DeviceLeft(Event):
    aggregate = "device"
    name = "left"
    id_field = "device_id"

    device_id: str
    reason: str


class MeasurementRecorded(Event):
    """One real run of a job on a device: the raw material the model learns from."""

    aggregate = "measurement"
    name = "recorded"
    id_field = "measurement_id"

    measurement_id: str
    device_id: str
    workload: str
    size: int = Field(gt=0)
    config: dict[str, Any]
    status: Literal["ok", "failed", "timed_out", "wrong_answer"]
    runtime_s: float | None = Field(default=None, ge=0)
    throughput: float | None = None
    throughput_unit: str | None = None
    repeats: int = Field(default=1, ge=1)
    spread: float | None = Field(default=None, ge=0, description="Relative run-to-run spread.")
    check_ok: bool | None = None
    check_error: float | None = None
    held_out: bool = Field(default=False, description="Evaluation only: never used in training.")
    purpose: str = Field(default="run", description="setup, tune, task, evaluate or run.")


class ModelPublished(Event):
    """A trained model artifact for a device, versioned by content hash."""

    aggregate = "model"
    name = "published"
    id_field = "model_version"

    model_version: str
    device_id: str
    artifact: str = Field(description="Object Store key of the ONNX file.")
    sha256: str
    metrics: dict[str, Any] = Field(default_factory=dict)
    trained_on: int = Field(ge=0, description="Number of measurements used.")


class EvaluationPublished(Event):
    """The measured quality of one model on held-out sizes (hpc-ds1 evaluate)."""

    aggregate = "evaluation"
    name = "published"
    id_field = "evaluation_id"

    evaluation_id: str
    device_id: str
    model_version: str
    profile: str = Field(description="quick or full")
    seed: int
    landscape_runs: int = Field(ge=0, description="Held-out measurements the results come from.")
    results: dict[str, Any] = Field(default_factory=dict)
    plots: list[str] = Field(
        default_factory=list, description="PNG files under $HPC_DS1_HOME/evaluation/."
    )


Mode = Literal["auto", "confirm", "escalate"]


class DecisionMade(Event):
    """One decision of the decision service, from any surface."""

    aggregate = "decision"
    name = "made"
    id_field = "decision_id"

    decision_id: str
    device_id: str
    source: str = Field(description="api, cli, python, session or task.")
    workload: str
    size: int = Field(gt=0)
    config: dict[str, Any]
    choice: str
    confidence: float = Field(ge=0, le=1)
    mode: Mode
    reasons: list[str] = Field(default_factory=list)
    alternatives: dict[str, float] = Field(default_factory=dict)
    model_version: str | None = None
    session_id: str | None = None


class WarmSibling(BaseModel):
    """One sibling a warm session starts from: a device's measurements of a workload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device_id: str
    workload: str
    size: int = Field(gt=0, description="The size its runs are of (the nearest measured).")
    runs: int = Field(ge=0, description="Its runs of this space that the start read.")


class WarmStart(BaseModel):
    """Where a warm session's start and first moves come from (`tune --warm`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    siblings: list[WarmSibling] = Field(
        description="The devices' (and workloads') measurements the consensus is made of."
    )
    plan: list[dict[str, Any]] = Field(
        description="The top of the siblings' consensus, spread apart: the first is its best "
        "(the start, unless one was given), the others are run as WARM moves, in order."
    )
    reason: Literal["asked", "unmeasured"] = Field(
        description="asked: --warm always; unmeasured: this device had not measured the job."
    )


class SessionStarted(Event):
    """A tuning session of one job on one device, from a start configuration."""

    aggregate = "session"
    name = "started"
    id_field = "session_id"

    session_id: str
    device_id: str
    workload: str
    size: int = Field(gt=0)
    start: dict[str, Any]
    wait_for_engineer: bool = Field(default=True, description="False: approvals via API only.")
    warm: WarmStart | None = Field(
        default=None,
        description="Started warm from the fleet's other devices: which measurements, and the "
        "configurations they rate highest. None: a cold start (every session before it).",
    )


class SessionStepRun(Event):
    """One real run of the session's job: the baseline (step 0, no move) or a tried move."""

    aggregate = "session"
    name = "step_run"
    id_field = "session_id"

    session_id: str
    step: int = Field(ge=0)
    move: str | None = None
    config: dict[str, Any]
    status: str
    runtime_s: float | None = None
    spread: float | None = None
    measurement_id: str | None = None
    race: Literal["incumbent", "candidate"] | None = Field(
        default=None,
        description="A re-run while the keep rule races an ambiguous move: of the incumbent "
        "(the best so far) or of the move's candidate configuration.",
    )


class SessionMoveDecided(Event):
    """The model's move for the session's current best configuration."""

    aggregate = "session"
    name = "move_decided"
    id_field = "session_id"

    session_id: str
    step: int = Field(ge=1)
    decision_id: str
    move: str
    confidence: float = Field(ge=0, le=1)
    mode: Mode
    reasons: list[str] = Field(default_factory=list)
    config: dict[str, Any] = Field(description="The configuration the move starts from.")
    target: dict[str, Any] | None = Field(
        default=None,
        description="The configuration a PICK runs (System 1's for the job) or a WARM runs (the "
        "next of a warm start's plan); None: the move applied to `config`.",
    )


class SessionMoveResolved(Event):
    """A tried move kept (P(faster) at least the keep rule's confidence) or reverted."""

    aggregate = "session"
    name = "move_resolved"
    id_field = "session_id"

    session_id: str
    step: int = Field(ge=1)
    move: str
    kept: bool
    config: dict[str, Any] = Field(description="The configuration the move led to.")
    runtime_s: float | None = None
    best_runtime_s: float | None = Field(default=None, description="Best before this step.")
    misses_in_a_row: int = Field(ge=0)
    p_faster: float | None = Field(
        default=None, ge=0, le=1, description="P(the candidate is faster), by the keep rule."
    )
    within_noise: bool = Field(
        default=False, description="Reverted, but not slower beyond the noise: not a miss."
    )


class SessionPaused(Event):
    """A move needs an engineer: the session waits on an approval."""

    aggregate = "session"
    name = "paused"
    id_field = "session_id"

    session_id: str
    step: int = Field(ge=1)
    approval_id: str


class SessionResumed(Event):
    aggregate = "session"
    name = "resumed"
    id_field = "session_id"

    session_id: str
    approval_id: str
    approved: bool


class SessionFinished(Event):
    aggregate = "session"
    name = "finished"
    id_field = "session_id"

    session_id: str
    reason: Literal["stop", "two_misses", "rejected", "no_moves", "failed", "interrupted"]
    detail: str = ""
    best_config: dict[str, Any] | None = None
    best_runtime_s: float | None = None
    start_runtime_s: float | None = None
    speedup: float | None = None
    real_runs: int = Field(ge=0)


class SessionCancelRequested(Event):
    """Someone asked to cancel a tuning session that had not finished (issue 44, item 4): the
    coordinator driving it kills its run in flight (the agent kills the run's whole process
    group) and finishes it `interrupted`. Who asked is `by` (also the envelope's actor), with
    their role; a session is cancelled once (the event is appended only to an empty aggregate)."""

    aggregate = "cancel"
    name = "requested"
    id_field = "session_id"

    session_id: str
    by: str = Field(description="Who cancelled: the token's holder or the signed-in person.")
    role: str = Field(description="Their role when they cancelled (engineer or admin).")
    identity: str | None = Field(
        default=None, description="The person at the site's OpenID provider: issuer#sub."
    )
    reason: str = Field(default="", description="Why, in their words (may be empty).")


class ApprovalRequested(Event):
    """A move waiting for an engineer, with why it is here."""

    aggregate = "approval"
    name = "requested"
    id_field = "approval_id"

    approval_id: str
    session_id: str
    decision_id: str
    device_id: str
    workload: str
    size: int
    config: dict[str, Any]
    move: str
    confidence: float = Field(ge=0, le=1)
    mode: Mode
    reasons: list[str] = Field(default_factory=list)


class ApprovalDecided(Event):
    """An engineer approved or rejected a waiting move; who, when (the envelope) and the note."""

    aggregate = "approval"
    name = "decided"
    id_field = "approval_id"

    approval_id: str
    session_id: str
    decision_id: str
    approved: bool
    by: str
    role: str
    note: str = ""
    # Issue 45: who `by` is at the site's OpenID provider, '<issuer>#<sub>' (the provider's
    # stable id of the person; a name can change hands). None: signed in with a token.
    identity: str | None = Field(
        default=None, description="The approver at the site's OpenID provider: issuer#sub."
    )


class ApprovalWithdrawn(Event):
    """A waiting move that no engineer can decide any more: its session ended first (it was
    cancelled while paused on it). The coordinator appends it on the approval's own subject,
    expecting the approval's version, so an engineer's verdict and the withdrawal never both
    stand."""

    aggregate = "approval"
    name = "withdrawn"
    id_field = "approval_id"

    approval_id: str
    session_id: str
    decision_id: str
    reason: str


class TokenCreated(Event):
    """A bearer token for a person or an agent; only its SHA-256 is ever stored. Role `nats`: a
    read-only NATS subscriber credential (`hpc-ds1 token nats`), the SHA-256 of its password;
    it is no bearer token of the API."""

    aggregate = "token"
    name = "created"
    id_field = "token_id"

    token_id: str
    holder: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$", description="A person or agent.")
    role: Literal["viewer", "engineer", "admin", "agent", "join", "nats"]
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    # A token's expiry (issue 45: any bearer token; before, join tokens only) and a join
    # token's cap on uses, as kubeadm's bootstrap tokens have (None: none; every token made
    # before they existed has none). The gateway refuses a token from its expiry on, and a
    # join past its cap (token.used).
    expires_at: AwareDatetime | None = Field(
        default=None, description="Refused from this time on (UTC); None: no expiry."
    )
    max_uses: int | None = Field(
        default=None, ge=1, description="Join tokens: how many devices may join with it."
    )
    reason: str | None = Field(
        default=None,
        max_length=200,
        description="Why it was made, for the audit trail (e.g. 'join token rotated').",
    )

    @model_validator(mode="after")
    def _limits_kept(self) -> TokenCreated:
        # Only what someone enforces: the join route keeps max_uses, the gateway an expiry of a
        # bearer token; NATS checks no expiry of a subscriber's password.
        if self.role != "join" and self.max_uses is not None:
            raise ValueError("max_uses is for join tokens only")
        if self.role == "nats" and self.expires_at is not None:
            raise ValueError("a NATS subscriber credential has no expiry (NATS would not keep it)")
        return self


class TokenRevoked(Event):
    """A token stops working; the envelope's actor says who revoked it."""

    aggregate = "token"
    name = "revoked"
    id_field = "token_id"

    token_id: str
    reason: str | None = Field(
        default=None,
        max_length=200,
        description="Why, for the audit trail (e.g. 'device d1 revoked', 'join token rotated').",
    )


class TokenUsed(Event):
    """A join token was traded for device `device_id`'s credential: appended before the device
    is registered, only while the token's history shows it unexpired with a use left, and with
    the token's last sequence expected, so joins on any number of gateways never pass its cap."""

    aggregate = "token"
    name = "used"
    id_field = "token_id"

    token_id: str
    device_id: str = Field(description="The device the join registers.")


class AuditCheckpoint(Event):
    """The projector's anchor of the audit file in the log: the file held every projected event
    up to `seq`, and its line there has hash `hash` (`hpc-ds1 audit verify` checks the file
    against it, so a file cut short or rewritten is found)."""

    aggregate = "audit"
    name = "checkpoint"
    id_field = "projection"

    projection: str = Field(default="main", pattern=r"^[A-Za-z0-9_\-:]{1,64}$")
    seq: int = Field(ge=0, description="The last stream sequence the audit file held.")
    hash: str = Field(pattern=r"^[0-9a-f]{64}$", description="The file's line hash at `seq`.")
    lines: int = Field(ge=0, description="How many lines the file held.")


class DeviceDraining(Event):
    """A device stops (draining=True) or resumes taking new tasks; what it runs finishes."""

    aggregate = "device"
    name = "draining"
    id_field = "device_id"

    device_id: str
    draining: bool
    by: str = Field(description="Who asked for it.")


class DeviceStatusChanged(Event):
    """Liveness crossed a line: heartbeats stopped (offline) or came back (online). The
    heartbeats themselves stay in the liveness KV bucket, out of the log."""

    aggregate = "device"
    name = "status_changed"
    id_field = "device_id"

    device_id: str
    status: Literal["online", "offline"]
    reason: str = ""


class TaskSubmitted(Event):
    """A job to run once somewhere in the fleet, wherever it is expected to finish first."""

    aggregate = "task"
    name = "submitted"
    id_field = "task_id"

    task_id: str
    workload: str
    size: int = Field(gt=0)
    submitted_by: str


class PlacementCandidate(BaseModel):
    """One device's expected finish for a task, as placement computed it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device_id: str
    finish_s: float | None = Field(
        description="queue_s + runtime_s (counted_s when set); None: no estimate."
    )
    queue_s: float = Field(ge=0)
    runtime_s: float | None = Field(default=None, description="The device's own estimate.")
    basis: Literal["measured", "predicted", "none"]
    config: dict[str, Any] | None = None
    accepted: bool = Field(description="False: its familiarity guard rejects the job.")
    note: str = ""
    verified: bool | None = Field(
        default=None,
        description="Whether the device had run the job for the fleet (a task); None: no "
        "estimate, or placed before this was recorded.",
    )
    counted_s: float | None = Field(
        default=None,
        ge=0,
        description="The runtime counted instead of runtime_s: a claim no faster than the "
        "verified best (or its own last run) less the fleet's spread.",
    )


class TaskPlaced(Event):
    """Placement's choice for one attempt of a task: the device, the configuration to run,
    the expected finish and why, with the runner-up."""

    aggregate = "task"
    name = "placed"
    id_field = "task_id"

    task_id: str
    attempt: int = Field(ge=1)
    device_id: str
    config: dict[str, Any]
    expected_s: float = Field(ge=0, description="Expected runtime of the task itself.")
    queue_s: float = Field(ge=0, description="Expected wait behind the device's work.")
    basis: Literal["measured", "predicted", "none"]
    reason: str
    runner_up: str | None = None
    guard_rejected: bool = False
    candidates: list[PlacementCandidate] = Field(default_factory=list)
    verified: bool | None = Field(
        default=None,
        description="Whether the device had run the job for the fleet (a task); None: no "
        "estimate, or placed before this was recorded.",
    )
    claimed_s: float | None = Field(
        default=None,
        ge=0,
        description="The device's own estimate, when expected_s counts it higher (unverified, "
        "or faster than its own last run of the job).",
    )


class TaskWaiting(Event):
    """No device can take the task now; it waits, and this says for what."""

    aggregate = "task"
    name = "waiting"
    id_field = "task_id"

    task_id: str
    reason: str


class TaskStarted(Event):
    aggregate = "task"
    name = "started"
    id_field = "task_id"

    task_id: str
    attempt: int = Field(ge=1)
    device_id: str


class TaskFinished(Event):
    """The task ran to the end on its device: the result, measured against what was expected."""

    aggregate = "task"
    name = "finished"
    id_field = "task_id"

    task_id: str
    attempt: int = Field(ge=1)
    device_id: str
    config: dict[str, Any]
    runtime_s: float = Field(ge=0)
    expected_s: float | None = Field(
        default=None, ge=0, description="The device's own estimate of the runtime when placed."
    )
    measurement_id: str | None = None
    check_ok: bool | None = None


class TaskRunFailed(Event):
    """One attempt failed on its device (the run failed, timed out or gave a wrong answer)."""

    aggregate = "task"
    name = "run_failed"
    id_field = "task_id"

    task_id: str
    attempt: int = Field(ge=1)
    device_id: str
    error: str


class TaskRequeued(Event):
    """An attempt is abandoned (its device went offline, failed it, or never picked it up)
    and the task goes back to placement."""

    aggregate = "task"
    name = "requeued"
    id_field = "task_id"

    task_id: str
    attempt: int = Field(ge=1, description="The attempt abandoned.")
    device_id: str
    reason: str


class TaskFailed(Event):
    """The task gave up: it failed on too many devices, or cannot run anywhere."""

    aggregate = "task"
    name = "failed"
    id_field = "task_id"

    task_id: str
    reasons: list[str]


class RunHeartbeat(Event):
    """A real run is still in flight: sent every HPC_DS1_RUN_HEARTBEAT_S while one run of a
    setup, an evaluation or a device's agent (a session's step, a decision's run) takes longer
    than that, so whoever watches the log sees a run of minutes alive, what it runs and for how
    long. Nothing is projected from it but its raw row: the run's result is its measurement
    event, as before."""

    aggregate = "run"
    name = "heartbeat"
    id_field = "run_id"

    run_id: str = Field(
        description="The campaign's id, a session's (its step's run), or the run's own."
    )
    device_id: str
    purpose: str = Field(description="setup, evaluate, truth, tune, task or run.")
    workload: str
    size: int = Field(gt=0)
    config: dict[str, Any] = Field(description="The configuration running now.")
    elapsed_s: float = Field(ge=0, description="Since this configuration's run started.")
    timeout_s: float | None = Field(
        default=None, gt=0, description="When the run is killed (its workload's or caller's)."
    )
    beat: int = Field(ge=1, description="1 for the first heartbeat of this run, then 2, ...")
    done: int = Field(default=0, ge=0, description="Runs the campaign has finished so far.")
    total: int = Field(default=0, ge=0, description="Runs the campaign plans; 0: one run.")
    session_id: str | None = None
    task_id: str | None = None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.event_type(): cls
    for cls in (
        DeviceRegistered,
        DeviceLeft,
        MeasurementRecorded,
        ModelPublished,
        EvaluationPublished,
        DecisionMade,
        SessionStarted,
        SessionStepRun,
        SessionMoveDecided,
        SessionMoveResolved,
        SessionPaused,
        SessionResumed,
        SessionFinished,
        SessionCancelRequested,
        ApprovalRequested,
        ApprovalDecided,
        ApprovalWithdrawn,
        TokenCreated,
        TokenRevoked,
        TokenUsed,
        AuditCheckpoint,
        DeviceDraining,
        DeviceStatusChanged,
        TaskSubmitted,
        TaskPlaced,
        TaskWaiting,
        TaskStarted,
        TaskFinished,
        TaskRunFailed,
        TaskRequeued,
        TaskFailed,
        RunHeartbeat,
    )
}
