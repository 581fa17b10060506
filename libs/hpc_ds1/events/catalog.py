"""Every event type of HPC-DS1, one frozen model each. Add a type here and regenerate schemas/."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

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
    mode: Literal["auto", "confirm", "escalate"]
    reasons: list[str] = Field(default_factory=list)
    alternatives: dict[str, float] = Field(default_factory=dict)
    model_version: str | None = None
    session_id: str | None = None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.event_type(): cls
    for cls in (DeviceRegistered, DeviceLeft, MeasurementRecorded, ModelPublished, DecisionMade)
}
