"""Old events read by new code: a version bump with its upcasters, a gap in the chain, and an
event from a newer release (hpc_ds1.events.upcast, codec.typed)."""

from __future__ import annotations

from typing import Any

import pytest

from hpc_ds1.events import DecisionMade, envelope
from hpc_ds1.events import upcast as upcasting
from hpc_ds1.events.codec import MalformedEvent, typed

CONFIG = {"ranks": 1, "threads": 2, "tile": 64}


def made(**changes: Any) -> Any:
    event = DecisionMade(
        decision_id="d1",
        device_id="dev-1",
        source="api",
        workload="gemm",
        size=512,
        config=CONFIG,
        choice="THREADS_UP",
        confidence=0.9,
        mode="auto",
        reasons=["telemetry"],
        model_version="v1",
    )
    env = envelope(event, actor="test", source="test")
    return env.model_copy(update=changes)


def test_the_chain_runs_each_step_in_order_up_to_the_target() -> None:
    steps = {
        ("x.y", 1): lambda d: {k: v for k, v in d.items() if k != "a"} | {"b": d["a"]},
        ("x.y", 2): lambda d: {**d, "c": d["b"] * 2},
    }
    assert upcasting.upcast("x.y", 1, {"a": 3}, 3, steps) == (3, {"b": 3, "c": 6})
    assert upcasting.upcast("x.y", 2, {"b": 1}, 3, steps) == (3, {"b": 1, "c": 2})
    assert upcasting.upcast("x.y", 1, {"a": 1}, 2, steps) == (2, {"b": 1})
    assert upcasting.upcast("x.z", 1, {"a": 1}, 3, steps) == (1, {"a": 1})  # none: stays


def test_typed_reads_an_old_version_through_its_upcaster(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if DecisionMade had gone to version 2, renaming `reasons` to `why`: the v1 data in
    # the log is carried to v2 by the upcaster before the (here unchanged) model reads it.
    monkeypatch.setattr(DecisionMade, "version", 2)
    seen: list[dict[str, Any]] = []

    def v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
        seen.append(dict(data))
        return {**data, "reasons": [*data["reasons"], "upcast"]}

    monkeypatch.setattr(upcasting, "UPCASTERS", {("decision.made", 1): v1_to_v2})
    event = typed(made(version=1))
    assert isinstance(event, DecisionMade)
    assert event.reasons == ["telemetry", "upcast"] and len(seen) == 1

    monkeypatch.setattr(upcasting, "UPCASTERS", {})
    with pytest.raises(MalformedEvent, match="no upcaster from version 1 to 2"):
        typed(made(version=1))


def test_an_event_of_a_newer_release_is_refused_as_such() -> None:
    with pytest.raises(MalformedEvent, match="written by a newer release"):
        typed(made(version=DecisionMade.version + 1))
    assert isinstance(typed(made()), DecisionMade)
