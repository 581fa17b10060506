from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_ds1.events import (
    EVENT_TYPES,
    DeviceRegistered,
    MalformedEvent,
    MeasurementRecorded,
    decode,
    envelope,
    typed,
)
from hpc_ds1.events.schemas import drift, render

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_schemas_directory_matches_the_models() -> None:
    assert drift(SCHEMAS) == [], "run `make schemas` and commit schemas/"


def test_drift_is_detected(tmp_path: Path) -> None:
    for name, text in render().items():
        (tmp_path / name).write_text(text)
    path = tmp_path / "device.registered.v1.json"
    schema = json.loads(path.read_text())
    schema["properties"].pop("hostname")
    path.write_text(json.dumps(schema))
    (tmp_path / "envelope.json").unlink()
    assert drift(tmp_path) == ["device.registered.v1.json: stale", "envelope.json: missing"]


def test_every_event_is_frozen_and_versioned() -> None:
    for event_type, cls in EVENT_TYPES.items():
        assert cls.model_config.get("frozen") is True, event_type
        assert cls.version >= 1
        assert event_type == f"{cls.aggregate}.{cls.name}"


def test_envelope_round_trip_and_subject() -> None:
    event = DeviceRegistered(device_id="dev-1", hostname="h")
    env = envelope(event, actor="alice", source="agent", prefix="hpcds1")
    assert env.subject == "hpcds1.device.dev-1.registered"
    again = decode(env.to_json(), env.subject)
    assert again == env
    assert typed(again) == event
    assert env.correlation_id == env.id


def test_events_are_immutable() -> None:
    event = DeviceRegistered(device_id="dev-1", hostname="h")
    with pytest.raises(Exception):
        event.hostname = "other"  # type: ignore[misc]


def test_an_id_that_cannot_be_a_subject_token_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be a subject token"):
        envelope(DeviceRegistered(device_id="a.b", hostname="h"), actor="x", source="y")


def test_malformed_bytes_and_bad_data_say_what_is_wrong() -> None:
    with pytest.raises(MalformedEvent, match="not an event envelope"):
        decode(b"{not json")
    env = envelope(
        MeasurementRecorded(
            measurement_id="m1", device_id="d", workload="gemm", size=8, config={}, status="ok"
        ),
        actor="a",
        source="s",
    )
    broken = env.model_copy(update={"data": {**env.data, "size": -3}})
    with pytest.raises(MalformedEvent, match="size"):
        typed(broken)
    assert typed(env.model_copy(update={"type": "device.exploded"})) is None
