"""Request bodies shared by the gateway, the CLI and the services, validated field by field."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

_WORKLOAD = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def _workload_name(value: str) -> str:
    if not _WORKLOAD.match(value):
        raise ValueError("use 1-64 letters, digits, '_', '-' or '.'")
    return value


WorkloadName = Annotated[str, AfterValidator(_workload_name)]


class ConfigIn(BaseModel):
    """A configuration as a user writes it; `tile` defaults to the workload's default tile."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    ranks: int = Field(ge=1, le=4096)
    threads: int = Field(ge=1, le=4096)
    tile: int | None = Field(default=None, ge=1)
    gpu: bool = False


class Telemetry(BaseModel):
    """What was observed of the job in its current configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime_s: float = Field(gt=0, description="Measured runtime in seconds.")
    throughput: float | None = Field(default=None, ge=0, description="GFLOP/s or GB/s.")

    @field_validator("runtime_s", "throughput")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class DecideRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadName = Field(description="A workload name, e.g. gemm.")
    size: int = Field(gt=0, strict=True)
    config: ConfigIn
    telemetry: Telemetry | None = Field(
        default=None, description="Without it the job is first run for real on the device."
    )
    device_id: str | None = Field(default=None, description="Default: the coordinator's machine.")
    source: str = Field(default="api", pattern=r"^[a-z_]{1,32}$")
    session_id: str | None = None


class RunRequest(BaseModel):
    """Ask a device's agent to run one job for real."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: str
    size: int = Field(gt=0)
    config: dict[str, Any]
    repeats: int = Field(default=3, ge=1, le=50)
    purpose: str = "run"
    actor: str = "agent"


class StartSessionRequest(BaseModel):
    """Start a tuning session; `start` defaults to the space's default configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadName
    size: int = Field(gt=0, strict=True)
    start: ConfigIn | None = None
    device_id: str | None = None
    session_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_\-]{8,64}$")
    wait_for_engineer: bool = True
