"""Request bodies at the edge, by generated input (hypothesis): whatever a model accepts is within
the documented bounds (so nothing downstream overflows a column or widens a NATS subject), and
whatever is outside them is refused with the field named."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from hpc_ds1.requests import (
    MAX_NOTE,
    MAX_RUNTIME_S,
    MAX_SIZE,
    MAX_THROUGHPUT,
    MAX_TILE,
    SAFE_ID,
    ApprovalVerdict,
    DecideBody,
    DecideRequest,
    StartSessionRequest,
)

CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
SUBJECT_WIDENING = re.compile(r"[.*>\s]")

# Values near and beyond every bound, and of the wrong type.
integers = st.one_of(
    st.integers(min_value=-3, max_value=5000),
    st.sampled_from([MAX_TILE, MAX_TILE + 1, MAX_SIZE, MAX_SIZE + 1, 2**63, 10**19, -(2**63)]),
    st.integers(),
)
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-300, MAX_RUNTIME_S, MAX_RUNTIME_S * 1.0001, MAX_THROUGHPUT]),
)
texts = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["gemm", "gemm.*", "a>b", "a b", "x\x00y", "s" * 65, "*", ">", "."]),
)
scalars = st.one_of(st.none(), st.booleans(), integers, floats, texts)
wild_config = st.fixed_dictionaries(
    {"ranks": integers, "threads": integers},
    optional={"tile": st.one_of(st.none(), integers), "gpu": scalars, "nodes": integers},
)
valid_config = st.fixed_dictionaries(
    {"ranks": st.integers(1, 4096), "threads": st.integers(1, 4096)},
    optional={"tile": st.one_of(st.none(), st.integers(1, MAX_TILE)), "gpu": st.booleans()},
)
config = st.one_of(valid_config, wild_config)
wild_telemetry = st.fixed_dictionaries(
    {"runtime_s": floats}, optional={"throughput": st.one_of(st.none(), floats)}
)
valid_telemetry = st.fixed_dictionaries(
    {"runtime_s": st.floats(1e-9, MAX_RUNTIME_S)},
    optional={"throughput": st.one_of(st.none(), st.floats(0, MAX_THROUGHPUT))},
)
telemetry = st.one_of(valid_telemetry, wild_telemetry)
workloads = st.one_of(st.from_regex(r"\A[A-Za-z0-9_.\-]{1,64}\Z"), texts)
sizes = st.one_of(st.integers(1, MAX_SIZE), integers)


def spoiled(valid: Any, keys: list[str]) -> Any:
    """A valid body with one field replaced by anything, or an extra field added."""
    return st.tuples(valid, st.sampled_from(keys), scalars).map(lambda t: {**t[0], t[1]: t[2]})


valid_decide = st.fixed_dictionaries(
    {"workload": workloads, "size": sizes, "config": config},
    optional={"telemetry": st.one_of(st.none(), telemetry)},
)
decide_body = st.one_of(
    valid_decide,
    spoiled(
        valid_decide,
        ["workload", "size", "config", "telemetry", "source", "session_id", "device_id"],
    ),
)
valid_session = st.fixed_dictionaries(
    {"workload": workloads, "size": sizes},
    optional={
        "start": st.one_of(st.none(), config),
        "session_id": st.one_of(st.none(), st.from_regex(r"\A[A-Za-z0-9_\-]{8,64}\Z"), texts),
        "device_id": st.one_of(st.none(), st.from_regex(r"\A[A-Za-z0-9_\-]{1,64}\Z"), texts),
        "wait_for_engineer": st.booleans(),
    },
)
session_body = st.one_of(
    valid_session,
    spoiled(valid_session, ["workload", "size", "start", "session_id", "device_id", "owner"]),
)
verdict_body = st.fixed_dictionaries(
    {"decision": st.one_of(st.sampled_from(["approve", "reject"]), texts)},
    optional={"note": st.one_of(texts, st.text(min_size=MAX_NOTE - 2, max_size=MAX_NOTE + 2))},
)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


def strings(value: Any) -> list[str]:
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    return []


def numbers(value: Any) -> list[float]:
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    return []


def accepted_or_refused(model: type[BaseModel], body: dict[str, Any]) -> BaseModel | None:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        # Refused: each problem names a field of the body (never "unknown").
        assert all(e["loc"] for e in error.errors()), error
        return None


def both_ways(model: type[BaseModel], strategy: Any, check: Any) -> None:
    """Run `check` on every generated body a model accepts; make sure the generated bodies
    included accepted and refused ones (the property is not vacuous)."""
    outcomes: list[bool] = []

    @FAST
    @given(strategy)
    def run(body: dict[str, Any]) -> None:
        accepted = accepted_or_refused(model, body)
        outcomes.append(accepted is not None)
        if accepted is not None:
            check(body, accepted)

    run()
    assert any(outcomes) and not all(outcomes), outcomes.count(True)


def test_a_decide_body_is_within_bounds_or_refused() -> None:
    both_ways(DecideBody, decide_body, check_decide)


def check_decide(body: dict[str, Any], accepted: BaseModel) -> None:
    assert isinstance(accepted, DecideBody)
    assert not {"source", "session_id", "device_id"} & set(body)  # never the caller's to say
    assert 0 < accepted.size <= MAX_SIZE
    assert 1 <= accepted.config.ranks <= 4096 and 1 <= accepted.config.threads <= 4096
    assert accepted.config.tile is None or 1 <= accepted.config.tile <= MAX_TILE
    assert all(math.isfinite(n) and abs(n) < 2**63 for n in numbers(accepted))
    assert not any(CONTROL.search(s) for s in strings(accepted))
    assert not SUBJECT_WIDENING.search(accepted.workload.replace(".", ""))
    if accepted.telemetry is not None:
        assert 0 < accepted.telemetry.runtime_s <= MAX_RUNTIME_S
        throughput = accepted.telemetry.throughput
        assert throughput is None or 0 <= throughput <= MAX_THROUGHPUT
    # What the gateway builds from it is a valid internal request.
    internal = DecideRequest(
        workload=accepted.workload,
        size=accepted.size,
        config=accepted.config,
        telemetry=accepted.telemetry,
    )
    assert DecideRequest.model_validate_json(internal.model_dump_json()) == internal


def test_a_session_body_is_within_bounds_or_refused() -> None:
    both_ways(StartSessionRequest, session_body, check_session)


def check_session(body: dict[str, Any], accepted: BaseModel) -> None:
    assert isinstance(accepted, StartSessionRequest)
    assert 0 < accepted.size <= MAX_SIZE
    for ident in (accepted.session_id, accepted.device_id):
        assert ident is None or SAFE_ID.match(ident)
    assert not any(CONTROL.search(s) for s in strings(accepted))


def test_a_verdict_is_within_bounds_or_refused() -> None:
    both_ways(ApprovalVerdict, verdict_body, check_verdict)


def check_verdict(body: dict[str, Any], accepted: BaseModel) -> None:
    assert isinstance(accepted, ApprovalVerdict)
    assert accepted.decision in ("approve", "reject")
    assert len(accepted.note) <= MAX_NOTE and not CONTROL.search(accepted.note)


@pytest.mark.parametrize(
    ("field", "value"),
    [("session_id", "a.b"), ("session_id", "*"), ("device_id", "a>"), ("device_id", "a b")],
)
def test_internal_ids_never_widen_a_subject(field: str, value: str) -> None:
    body = {"workload": "gemm", "size": 1, "config": {"ranks": 1, "threads": 1}, field: value}
    with pytest.raises(ValidationError, match=field):
        DecideRequest.model_validate(body)
