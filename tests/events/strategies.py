"""Hypothesis strategies for the events' fuzz tests: subjects, JSON values with the edges that
have bitten, and envelope-shaped messages. Shared by tests/events/test_decode_fuzz.py and
tests/events/test_envelope_fast_path.py."""

from __future__ import annotations

import json

from hypothesis import strategies as st

from hpc_ds1.events import EVENT_TYPES

SUBJECTS = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"\Ahpcds1\.[a-z]{1,10}\.[A-Za-z0-9_:\-]{1,12}\.[a-z_]{1,12}\Z"),
)
# JSON values with the edges that have bitten: integers past 64 bits, NUL, lone surrogates.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from(["\x00", "a\x00b", "\ud800", "é", "💥", "1e400"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def envelopes(draw: st.DrawFn) -> tuple[bytes, str]:
    """Envelope-shaped JSON: a known or unknown type, fields that fit or do not."""
    kind = draw(st.sampled_from([*EVENT_TYPES, "device.teleported", ""]))
    subject = draw(SUBJECTS)
    cls = EVENT_TYPES.get(kind)
    fields = list(cls.model_fields) if cls else []
    data = (
        {name: draw(VALUES) for name in draw(st.lists(st.sampled_from(fields), unique=True))}
        if fields
        else draw(VALUES)
    )
    body: dict[str, object] = {
        "id": draw(st.text(max_size=12)),
        "type": kind,
        "version": draw(st.integers(min_value=-2, max_value=2**70)),
        "subject": subject if draw(st.booleans()) else draw(SUBJECTS),
        "time": draw(st.sampled_from(["2026-01-01T00:00:00Z", "0001-01-01T00:00:00", "x", 12])),
        "actor": draw(st.text(max_size=8)),
        "source": "fuzz",
        "data": data,
    }
    for extra in draw(st.lists(st.sampled_from(["seq", "prev", "hash", "correlation_id"]))):
        body[extra] = draw(VALUES)
    return json.dumps(body).encode(), subject
