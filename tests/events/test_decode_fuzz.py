"""Decoding any bytes on any subject gives an envelope or MalformedEvent, never anything else;
so does asking an envelope for its typed event."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpc_ds1.events import Envelope, Event, MalformedEvent, decode, typed

from .strategies import SUBJECTS, envelopes


def check(raw: bytes, subject: str | None) -> None:
    try:
        env = decode(raw, subject)
    except MalformedEvent:
        return
    assert isinstance(env, Envelope)
    try:
        event = typed(env)
    except MalformedEvent:
        return
    assert event is None or isinstance(event, Event)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=300), subject=st.one_of(st.none(), SUBJECTS))
def test_any_bytes_decode_or_are_malformed(raw: bytes, subject: str | None) -> None:
    check(raw, subject)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=envelopes())
def test_any_envelope_shape_decodes_or_is_malformed(message: tuple[bytes, str]) -> None:
    raw, subject = message
    check(raw, subject)
    check(raw, None)
