"""Request bodies shared by the gateway, the CLI and the services, validated field by field.

Bounds at the edge (documented maxima; everything past them is a 422 naming the field):
sizes 1..MAX_SIZE (2**40, well inside the bigint columns downstream), ranks and threads
1..4096, tile 1..MAX_TILE, runtimes in (0, MAX_RUNTIME_S], throughputs in [0, MAX_THROUGHPUT],
floats finite; ids (device, session, approval) match SAFE_ID (no '.', '*', '>' or whitespace:
they become NATS subject tokens); no string carries a NUL or another control character (a note
may hold newlines and tabs) and notes are at most MAX_NOTE characters.

`DecideBody` is what an HTTP caller may send to POST /v1/decide; the gateway turns it into the
internal `DecideRequest` (source "api", the actor from the caller's credential), which the CLI,
the coordinator and the decision service exchange over NATS."""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

MAX_SIZE: Final = 2**40
MAX_TILE: Final = 2**24
MAX_RUNTIME_S: Final = 1e7
MAX_THROUGHPUT: Final = 1e15
MAX_NOTE: Final = 2000
MAX_SEQ: Final = 2**63 - 1  # the largest bigint: paging parameters stop here
SAFE_ID_PATTERN: Final = r"^[A-Za-z0-9_\-]{1,64}$"
WORKLOAD_NAME_PATTERN: Final = r"^[A-Za-z0-9_.\-]{1,64}$"  # a workload file's `name` too
SAFE_ID_RULE: Final = "1 to 64 of letters, digits, '_' or '-'"
SAFE_ID: Final = re.compile(SAFE_ID_PATTERN)
RUN_REPEATS = 3  # timed runs of an agent's run (after the runner's warm-up): a session's step
_WORKLOAD = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _workload_name(value: str) -> str:
    if not _WORKLOAD.match(value):
        raise ValueError("use 1-64 letters, digits, '_', '-' or '.'")
    return value


def _no_control(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("must not contain NUL or other control characters")
    return value


def _note_text(value: str) -> str:
    if _CONTROL_BUT_LINES.search(value):
        raise ValueError("must not contain NUL or control characters (newlines and tabs are fine)")
    return value


WorkloadName = Annotated[
    str, StringConstraints(pattern=WORKLOAD_NAME_PATTERN), AfterValidator(_workload_name)
]
SafeId = Annotated[
    str,
    StringConstraints(pattern=SAFE_ID_PATTERN, min_length=1, max_length=64),
]
Note = Annotated[str, StringConstraints(max_length=MAX_NOTE), AfterValidator(_note_text)]
Text = Annotated[str, StringConstraints(max_length=256), AfterValidator(_no_control)]
Size = Annotated[int, Field(gt=0, le=MAX_SIZE, strict=True)]


KnobName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")]
KnobValue = (
    Annotated[int, Field(ge=-(2**53), le=2**53)]
    | Annotated[float, Field(allow_inf_nan=False)]
    | Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:+\-]{1,64}$")]
    | bool
)


class ConfigIn(BaseModel):
    """A configuration as a user writes it; `tile` and `block` default to the workload's."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    ranks: int = Field(ge=1, le=4096)
    threads: int = Field(ge=1, le=4096)
    tile: int | None = Field(default=None, ge=1, le=MAX_TILE)
    block: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TILE,
        description="The kernel's second block (the stencil's sweeps per pass); 0: the "
        "kernel's own.",
    )
    gpu: bool = False
    knobs: dict[KnobName, KnobValue] | None = Field(
        default=None,
        max_length=64,
        description="The workload's own knobs and their values (a TOML file's or a plug-in's "
        'knobs), e.g. {"nb": 64, "algo": "fast"}; the workload\'s defaults where left out.',
    )


class Telemetry(BaseModel):
    """What was observed of the job in its current configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime_s: float = Field(
        gt=0,
        le=MAX_RUNTIME_S,
        allow_inf_nan=False,
        description=f"Measured runtime in seconds, above 0 and at most {MAX_RUNTIME_S:g}.",
    )
    throughput: Annotated[float, Field(ge=0, le=MAX_THROUGHPUT, allow_inf_nan=False)] | None = (
        Field(default=None, description=f"GFLOP/s or GB/s, 0 to {MAX_THROUGHPUT:g}.")
    )


class DecideBody(BaseModel):
    """POST /v1/decide: the job as it runs now. Who asks, and for which session and device, is
    not the caller's to say: the gateway sets it from the credential."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadName = Field(description="A workload name, e.g. gemm.")
    size: Size = Field(description=f"Problem size, 1 to {MAX_SIZE}.")
    config: ConfigIn
    telemetry: Telemetry | None = Field(
        default=None,
        description="Without it the job is first run for real on the device (engineer role).",
    )


class DecideRequest(BaseModel):
    """What the decision service is asked over NATS (internal: the gateway, the CLI and the
    coordinator build it; HTTP callers send a DecideBody)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadName = Field(description="A workload name, e.g. gemm.")
    size: Size
    config: ConfigIn
    telemetry: Telemetry | None = Field(
        default=None, description="Without it the job is first run for real on the device."
    )
    device_id: SafeId | None = Field(default=None, description="Default: the local device.")
    source: str = Field(default="api", pattern=r"^[a-z_]{1,32}$")
    session_id: SafeId | None = None


class RunRequest(BaseModel):
    """Ask a device's agent to run one job for real."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadName
    size: Size
    config: dict[str, Any]
    repeats: int = Field(default=RUN_REPEATS, ge=1, le=50)
    purpose: str = Field(default="run", pattern=r"^[a-z_]{1,32}$")
    actor: Text = "agent"
    # A session's step: the run's run.heartbeat events name the session (issue 44, item 4).
    session_id: SafeId | None = None


class CancelRunRequest(BaseModel):
    """Ask a device's agent to kill the run of a cancelled session, running or queued (the
    coordinator, on a cancel.requested event). `by`: who cancelled, for the run's answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session_id: SafeId
    by: Text


class CancelSession(BaseModel):
    """POST /v1/sessions/{session_id}/cancel: why (optional); who is the caller's token."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: Note = ""


class StartSessionRequest(BaseModel):
    """Start a tuning session; `start` defaults to the space's default configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadName
    size: Size
    start: ConfigIn | None = None
    device_id: SafeId | None = Field(default=None, description="Default: the local device.")
    session_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_\-]{8,64}$",
        description="8 to 64 of letters, digits, '_' or '-'; default: a new id.",
    )
    wait_for_engineer: bool = True
    warm: Literal["off", "auto", "always"] = Field(
        default="off",
        description="Start warm from the fleet's other devices' measurements of the job (same "
        "workload, nearest measured size): the top of their consensus is the start (unless "
        "`start` is given) and its next configurations, spread apart, the first moves (WARM). "
        "auto: where this device has no ok run of the job at this size; always: even where it "
        "has; off: from this device's model only. Default off, or auto with `warm_from`.",
    )
    warm_from: list[WorkloadName] = Field(
        default_factory=list,
        max_length=16,
        description="Siblings to start from: device ids (that device's runs of this workload; "
        "naming any leaves the other devices out) and workloads (their runs on any device: a "
        "recorded GPU is a workload of its own). A name that is neither a device nor a measured "
        "workload is refused (422). Implies warm auto.",
    )

    @model_validator(mode="after")
    def _warm_from_implies_warm(self) -> StartSessionRequest:
        if self.warm_from and self.warm == "off":
            object.__setattr__(self, "warm", "auto")  # frozen: set once, while validating
        return self


class ApprovalVerdict(BaseModel):
    """POST /v1/approvals/{approval_id}: approve or reject a waiting move."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: Literal["approve", "reject"]
    note: Note = ""
