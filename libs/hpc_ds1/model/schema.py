"""The model's vocabulary: measurements it learns from, states it decides about, its answers."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hpc_ds1.space import Config, is_move_name

Mode = Literal["auto", "confirm", "escalate"]
CONFIG_KEYS = frozenset(Config.model_fields)


def _config_dict(value: Any) -> Any:
    """Reject unknown config keys (Config itself ignores them)."""
    if isinstance(value, dict):
        unknown = sorted(set(value) - CONFIG_KEYS)
        if unknown:
            raise ValueError(
                f"unknown config key(s) {unknown}; accepted keys are {sorted(CONFIG_KEYS)}"
            )
    return value


class Measurement(BaseModel):
    """One real run, as carried by a MeasurementRecorded event (extra event fields are ignored)."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    workload: str = Field(min_length=1)
    size: int = Field(gt=0)
    config: dict[str, Any]
    status: str
    runtime_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    spread: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    throughput: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    held_out: bool = False

    _check_config = field_validator("config", mode="before")(_config_dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.runtime_s is not None and self.runtime_s > 0

    def as_config(self) -> Config:
        return Config.model_validate(self.config)

    @classmethod
    def from_result(cls, result: Any, *, held_out: bool = False) -> Measurement:
        """From a runner RunResult."""
        return cls(
            workload=result.workload,
            size=result.size,
            config=result.config.model_dump(),
            status=str(result.status.value if hasattr(result.status, "value") else result.status),
            runtime_s=result.runtime_s,
            spread=result.spread,
            throughput=result.throughput,
            held_out=held_out,
        )


class State(BaseModel):
    """What a decision is about: a job in a configuration, with telemetry when observed."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    workload: str = Field(min_length=1)
    size: int = Field(gt=0)
    config: Config
    runtime_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    throughput: float | None = Field(default=None, ge=0, allow_inf_nan=False)

    _check_config = field_validator("config", mode="before")(_config_dict)


class Thresholds(BaseModel):
    """auto when confidence >= auto and the guard passes; else escalate below `escalate`;
    else confirm. (auto is checked first, so auto=0 makes every familiar state auto.)"""

    model_config = ConfigDict(frozen=True, extra="forbid")
    auto: float = Field(default=0.85, ge=0, allow_inf_nan=False)
    escalate: float = Field(default=0.5, ge=0, allow_inf_nan=False)
    # the least out-of-fold AUROC (ending within 5 % of the best) at which a decision may run
    # alone: below it the confidence cannot tell the moves an engineer must see (issue 43)
    min_auroc: float = Field(default=0.6, ge=0, le=1, allow_inf_nan=False)

    def mode(self, confidence: float, guard_reasons: list[str]) -> tuple[Mode, list[str]]:
        """The mode for `confidence` and the reasons it is not auto, in words."""
        reasons = list(guard_reasons)
        if reasons:
            return "escalate", reasons
        if confidence >= self.auto:
            return "auto", []
        if confidence < self.escalate:
            return "escalate", [
                f"confidence {confidence:.2f} is below the escalate threshold {self.escalate:.2f}"
            ]
        return "confirm", [
            f"confidence {confidence:.2f} is below the auto threshold {self.auto:.2f}"
        ]


# The reason a decision of a model whose confidence does not discriminate carries: no move
# of it runs alone, its first choice or another (model.inference.MIN_AUROC)
NO_DISCRIMINATION = "confidence does not tell good moves from bad"


def waits_for_engineer(reasons: list[str]) -> bool:
    """Whether a decision's reasons keep every move of it from running alone."""
    return any(r.startswith(NO_DISCRIMINATION) for r in reasons)


class Decision(BaseModel):
    """System 2's answer for a job's state: the next move (`choice`, STOP when none helps), its
    `confidence`, the `mode` it maps to (auto, confirm, escalate) with the guard's `reasons`, the
    probability of every feasible move and the predicted runtime after each."""

    model_config = ConfigDict(frozen=True)
    choice: str
    confidence: float = Field(ge=0, le=1)
    mode: Mode
    reasons: list[str]
    alternatives: dict[str, float]  # every feasible move (and STOP) -> probability
    model_version: str
    predicted_runtime_s: float | None = None  # of the configuration after `choice`
    predicted_runtimes_s: dict[str, float] = Field(default_factory=dict)  # per feasible move
    distance: float | None = None  # from the training data, standardized feature space
    distance_threshold: float | None = None
    # Its id in the home's log, when it was appended there (hpc_ds1.load() with a server).
    decision_id: str | None = None

    @field_validator("choice")
    @classmethod
    def _known(cls, value: str) -> str:
        if not is_move_name(value):
            raise ValueError(f"unknown move {value!r}")
        return value


class Recommendation(BaseModel):
    """System 1: the whole configuration before anything runs."""

    model_config = ConfigDict(frozen=True)
    workload: str
    size: int
    config: Config
    predicted_runtime_s: float
    confidence: float = Field(ge=0, le=1)  # estimated probability that `config` is the best
    mode: Mode
    reasons: list[str]
    alternatives: dict[str, float]  # config label -> predicted runtime (s), fastest first
    model_version: str


def finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
