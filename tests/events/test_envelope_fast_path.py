"""The projector builds an envelope from its one orjson parse (`envelope_of`) when the message has
the shape the services write; whatever it builds is exactly what `decode` gives, and anything
else is left to `decode`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpc_ds1.eventlog.audit import parse_exact
from hpc_ds1.events import DeviceRegistered, MalformedEvent, decode, envelope
from hpc_ds1.events.codec import envelope_of

from .strategies import VALUES, envelopes

ZONES = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5)), None])
TIMES = st.builds(
    lambda moment, zone, z: moment.replace(tzinfo=zone).isoformat().replace("+00:00", z),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    ZONES,
    st.sampled_from(["Z", "+00:00"]),
)


def same_as_decode(raw: bytes, subject: str) -> None:
    fast = envelope_of(parse_exact(raw), subject)
    if fast is None:
        return
    slow = decode(raw, subject)
    assert fast == slow  # decode accepts it too, and reads the same fields
    assert fast.model_dump() == slow.model_dump()


def test_what_the_services_write_takes_the_fast_path() -> None:
    env = envelope(DeviceRegistered(device_id="d1", hostname="h"), actor="a", source="s")
    fast = envelope_of(parse_exact(env.to_json()), env.subject)
    assert fast == env
    assert fast is not None and fast.to_json() == env.to_json()
    assert envelope_of(parse_exact(env.to_json()), "hpcds1.device.other.registered") is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=envelopes())
def test_any_envelope_shape_is_built_as_decode_builds_it(message: tuple[bytes, str]) -> None:
    same_as_decode(*message)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    time=st.one_of(TIMES, st.text(max_size=30), st.integers()),
    version=st.one_of(st.integers(min_value=-1, max_value=3), st.text(max_size=2)),
    ids=st.lists(st.one_of(st.none(), st.text(max_size=6), VALUES), min_size=2, max_size=2),
    data=st.one_of(st.dictionaries(st.text(max_size=6), VALUES, max_size=3), VALUES),
    missing=st.sets(st.sampled_from(["id", "time", "actor", "correlation_id", "data"])),
)
def test_times_types_and_missing_fields_agree_with_decode(
    time: object, version: object, ids: list[object], data: object, missing: set[str]
) -> None:
    subject = "hpcds1.device.d1.registered"
    body = {
        "id": "e1",
        "type": "device.registered",
        "version": version,
        "subject": subject,
        "time": time,
        "actor": "a",
        "source": "s",
        "correlation_id": ids[0],
        "causation_id": ids[1],
        "data": data,
    }
    raw = json.dumps({k: v for k, v in body.items() if k not in missing}).encode()
    try:
        decode(raw, subject)
    except MalformedEvent:
        assert envelope_of(parse_exact(raw), subject) is None
        return
    same_as_decode(raw, subject)
