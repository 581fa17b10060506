"""What a device's agent sends: the bodies of its reports, and the body limits of the two
uploads that may exceed the gateway's general one."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from hpc_ds1.requests import (
    MAX_NOTE,
    MAX_RUNTIME_S,
    MAX_THROUGHPUT,
    SAFE_ID_PATTERN,
    Size,
    Text,
    WorkloadName,
)
from hpc_ds1.settings import Settings
from hpc_ds1.space import without_block_0

MAX_MEASUREMENTS: Final = 5000
# A full upload of MAX_MEASUREMENTS is a few MiB of JSON: past the gateway's general body limit.
MEASUREMENTS_BODY_BYTES: Final = 8 << 20
MEASUREMENTS_PATH: Final = "/v1/agent/measurements"
MODEL_PATH: Final = "/v1/agent/model"
_MEASUREMENT_ID: Final = r"^[A-Za-z0-9_\-:]{1,128}$"


def body_limits(settings: Settings) -> dict[str, int]:
    """Paths whose bodies may exceed settings.max_body_bytes, and their own limits (for
    edge.BodyLimit): a model upload and a full measurements upload."""
    return {
        MODEL_PATH: settings.max_model_bytes,
        MEASUREMENTS_PATH: max(settings.max_body_bytes, MEASUREMENTS_BODY_BYTES),
    }


# --- bodies --------------------------------------------------------------------------------


class RanConfig(BaseModel):
    """The configuration a job ran with (every field: it ran, so its tile is known)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    ranks: int = Field(ge=1, le=4096)
    threads: int = Field(ge=1, le=4096)
    tile: int = Field(ge=1, le=1 << 24)
    block: int = Field(default=0, ge=0, le=1 << 24)
    gpu: bool = False

    @model_serializer(mode="wrap")
    def _without_block_0(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Recorded as space.Config is: block 0 (the kernel's own) left out."""
        return without_block_0(handler(self))


Seconds = Annotated[float, Field(ge=0, le=MAX_RUNTIME_S, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False, ge=-1e300, le=1e300)]
Throughput = Annotated[float, Field(ge=0, le=MAX_THROUGHPUT, allow_inf_nan=False)]
Spread = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]
RunStatus = Literal["ok", "failed", "timed_out", "wrong_answer"]


class HeartbeatBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    running: str | None = Field(
        default=None, pattern=SAFE_ID_PATTERN, description="The task id it is running."
    )
    running_for_s: Seconds | None = None
    queued: int = Field(default=0, ge=0, le=100_000, description="Tasks held, not started.")


class StartedBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    attempt: int = Field(ge=1, le=1_000_000)


class ResultBody(BaseModel):
    """One attempt's outcome, as the device measured it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attempt: int = Field(ge=1, le=1_000_000)
    status: RunStatus
    config: RanConfig
    runtime_s: Seconds | None = None
    spread: Spread | None = None
    repeats: int | None = Field(
        default=None, ge=1, le=1000, description="Runs measured; none: it never started."
    )
    check_ok: bool | None = None
    check_error: Finite | None = None
    throughput: Throughput | None = None
    throughput_unit: Text | None = None
    error: str | None = Field(default=None, max_length=MAX_NOTE)

    @model_validator(mode="after")
    def _ok_has_runtime(self) -> ResultBody:
        if self.status == "ok" and self.runtime_s is None:
            raise ValueError("a result with status ok needs runtime_s")
        return self


class MeasurementIn(BaseModel):
    """A measurement.recorded event's fields without device_id: the credential names it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    measurement_id: str = Field(pattern=_MEASUREMENT_ID)
    workload: WorkloadName
    size: Size
    config: RanConfig
    status: RunStatus
    runtime_s: Seconds | None = None
    throughput: Throughput | None = None
    throughput_unit: Text | None = None
    repeats: int = Field(default=1, ge=1, le=1000)
    spread: Spread | None = None
    check_ok: bool | None = None
    check_error: Finite | None = None
    held_out: bool = False
    purpose: str = Field(default="run", pattern=r"^[a-z_]{1,32}$")


class MeasurementsBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    measurements: list[MeasurementIn] = Field(max_length=MAX_MEASUREMENTS)
