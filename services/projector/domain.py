"""What each event does to the read models, as pure functions from events to row writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from sqlalchemy import Table

from hpc_ds1.db import tables
from hpc_ds1.events import (
    DecisionMade,
    DeviceLeft,
    DeviceRegistered,
    Envelope,
    Event,
    MalformedEvent,
    MeasurementRecorded,
    ModelPublished,
    decode,
    typed,
)


@dataclass(frozen=True)
class Write:
    """One row change: insert (ignore if present), upsert, or update by key."""

    table: Table
    kind: Literal["insert", "upsert", "update"]
    row: dict[str, Any]
    keep_on_update: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Folded:
    """One stored message turned into its raw row, its typed writes and its audit record."""

    seq: int
    raw_row: dict[str, Any]
    writes: list[Write]
    audit: dict[str, Any]
    problem: str | None = None


def _device_registered(seq: int, env: Envelope, e: DeviceRegistered) -> list[Write]:
    row = {
        "device_id": e.device_id,
        "hostname": e.hostname,
        "fingerprint": e.fingerprint,
        "local": e.local,
        "status": "online",
        "registered_at": env.time,
        "updated_at": env.time,
        "seq": seq,
    }
    return [Write(tables.devices, "upsert", row, keep_on_update=("registered_at",))]


def _device_left(seq: int, env: Envelope, e: DeviceLeft) -> list[Write]:
    row = {"device_id": e.device_id, "status": "left", "updated_at": env.time, "seq": seq}
    return [Write(tables.devices, "update", row)]


def _measurement(seq: int, env: Envelope, e: MeasurementRecorded) -> list[Write]:
    return [Write(tables.measurements, "insert", {**dict(e), "time": env.time, "seq": seq})]


def _model(seq: int, env: Envelope, e: ModelPublished) -> list[Write]:
    return [Write(tables.models, "insert", {**dict(e), "published_at": env.time, "seq": seq})]


def _decision(seq: int, env: Envelope, e: DecisionMade) -> list[Write]:
    row = {**dict(e), "actor": env.actor, "time": env.time, "seq": seq}
    return [Write(tables.decisions, "insert", row)]


PROJECTIONS: dict[type[Event], Callable[[int, Envelope, Any], list[Write]]] = {
    DeviceRegistered: _device_registered,
    DeviceLeft: _device_left,
    MeasurementRecorded: _measurement,
    ModelPublished: _model,
    DecisionMade: _decision,
}


def fold(seq: int, subject: str, data: bytes) -> Folded:
    """Never raises: a malformed or unknown event still yields its raw row and audit record."""
    try:
        env = decode(data, subject)
    except MalformedEvent as error:
        text = data.decode("utf-8", errors="replace")
        raw = {
            "seq": seq,
            "type": "malformed",
            "subject": subject,
            "valid": False,
            "error": str(error),
            "raw": text,
        }
        audit = {"seq": seq, "subject": subject, "malformed": str(error), "raw": text}
        return Folded(seq, raw, [], audit, problem=str(error))
    raw = {
        "seq": seq,
        "event_id": env.id,
        "type": env.type,
        "version": env.version,
        "subject": env.subject,
        "time": env.time,
        "actor": env.actor,
        "source": env.source,
        "correlation_id": env.correlation_id,
        "causation_id": env.causation_id,
        "data": env.data,
        "valid": True,
    }
    # The stored JSON is already the envelope's canonical form; no need to re-serialize it.
    audit = {"seq": seq, **orjson.loads(data)}
    try:
        event = typed(env)
    except MalformedEvent as error:
        return Folded(seq, {**raw, "valid": False, "error": str(error)}, [], audit, str(error))
    if event is None:
        problem = f"unknown event type {env.type!r}"
        return Folded(seq, {**raw, "error": problem}, [], audit, problem)
    return Folded(seq, raw, PROJECTIONS[type(event)](seq, env, event), audit)


def find_gaps(checkpoint: int, seqs: list[int]) -> list[tuple[int, int]]:
    """Missing stream sequences between the checkpoint and each next delivered sequence."""
    missing = []
    previous = checkpoint
    for seq in seqs:
        if seq > previous + 1:
            missing.append((previous + 1, seq - 1))
        previous = max(previous, seq)
    return missing
