"""Idempotent decisions (`Idempotency-Key`) through a real gateway and decision service over
real NATS and Postgres: a retry is answered with the first decision and the log holds one
event; the same key from another token is another decision; the same key for a different job
is refused; a malformed key is a 422 naming the accepted form. And the bus's two ways of
catching a second copy (JetStream's duplicate window; past it, the subject's sequence check)."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.claims import CLAIM_TTL_S, claim, claims_bucket, held, holding
from hpc_ds1.eventlog.idempotency import KeyReused, append_once, derived_id, find, parse_key
from hpc_ds1.events import DecisionMade, ModelPublished, envelope
from hpc_ds1.model import TrainedModel
from hpc_ds1.models_store import save_local
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.requests import DecideRequest
from hpc_ds1.services.decision import DecisionService
from hpc_ds1.services.gateway import create_app
from hpc_ds1.settings import Settings
from hpc_ds1.stack import Stack, open_stack
from tests.support.gateway import ROLE_TOKENS, as_role, asgi_client, role_token_events

JOB = {"workload": "gemm", "size": 288, "config": {"ranks": 1, "threads": 1}}
TELEMETRY = {"runtime_s": 0.01}
KEY = "9b2f4c1e-retry-1"


@pytest.fixture
async def gateway(
    settings: Settings, engine: Engine, trained: TrainedModel
) -> AsyncIterator[tuple[Stack, FastAPI]]:
    """Projector, agent and decision with a model on the local device; a gateway app over them
    and a token per role."""
    async with open_stack(settings, ("projector", "agent", "decision"), "test-idem") as stack:
        device_id = await stack.local_device()
        data = trained.to_onnx()
        await asyncio.to_thread(save_local, settings.models_dir, trained.version, device_id, data)
        published = ModelPublished(
            model_version=trained.version,
            device_id=device_id,
            artifact=f"{device_id}/{trained.version}.onnx",
            sha256=hashlib.sha256(data).hexdigest(),
            trained_on=1,
        )
        for event in [published, *role_token_events()]:
            await stack.bus.publish(
                envelope(event, actor="test", source="test", prefix=settings.subject_prefix)
            )
        await stack.caught_up()
        yield stack, create_app(settings, stack.bus, engine)


async def decisions_in_log(bus: EventBus) -> list[str]:
    """The subject of every decision.made event in the stream (the log, not the projection)."""
    return [
        raw.subject
        async for chunk in bus.replay(1, f"{bus.prefix}.decision.*.made")
        for raw in chunk
    ]


async def post(
    app: FastAPI, role: str, body: dict[str, Any], key: str | bytes | None
) -> httpx.Response:
    raw = key.encode() if isinstance(key, str) else key  # bytes: a non-ASCII header as sent
    headers = {b"Idempotency-Key": raw} if raw is not None else {}
    async for http in asgi_client(app, headers=as_role(role)):
        return await http.post("/v1/decide", json=body, headers=headers, timeout=90)
    raise AssertionError("no client")


async def test_a_retry_with_the_same_key_gets_the_first_decision_and_one_event(
    gateway: tuple[Stack, FastAPI],
) -> None:
    stack, app = gateway
    body = {**JOB, "telemetry": TELEMETRY}
    first = await post(app, "viewer", body, KEY)
    again = await post(app, "viewer", body, f'"{KEY}"')  # the draft's quoted form: the same key
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert first.headers["Idempotent-Replayed"] == "false"
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()  # the whole reply, not only decision_id and choice
    decision_id = first.json()["decision_id"]
    assert decision_id == derived_id("tok_viewer", "POST /v1/decide", KEY)
    assert await decisions_in_log(stack.bus) == [
        f"{stack.settings.subject_prefix}.decision.{decision_id}.made"
    ]

    # Two copies at once (a client that gave up on the first while it was being answered).
    racing = await asyncio.gather(*(post(app, "viewer", body, "race-1") for _ in range(3)))
    assert {r.status_code for r in racing} == {200}
    assert len({r.json()["decision_id"] for r in racing}) == 1
    assert len(await decisions_in_log(stack.bus)) == 2

    # Without a key nothing changes: every request is a new decision.
    plain = [await post(app, "viewer", body, None) for _ in range(2)]
    assert plain[0].json()["decision_id"] != plain[1].json()["decision_id"]
    assert "Idempotent-Replayed" not in plain[0].headers
    assert len(await decisions_in_log(stack.bus)) == 4


async def test_a_key_is_scoped_by_token_and_bound_to_its_request(
    gateway: tuple[Stack, FastAPI],
) -> None:
    stack, app = gateway
    body = {**JOB, "telemetry": TELEMETRY}
    viewer = await post(app, "viewer", body, KEY)
    engineer = await post(app, "engineer", body, KEY)
    assert viewer.status_code == engineer.status_code == 200
    assert viewer.json()["decision_id"] != engineer.json()["decision_id"]
    assert engineer.headers["Idempotent-Replayed"] == "false"
    assert engineer.json()["actor"] == "engineer"

    other = await post(app, "viewer", {**body, "size": 289}, KEY)
    assert other.status_code == 422
    assert "Idempotency-Key was used for a different request" in other.json()["error"]
    assert len(await decisions_in_log(stack.bus)) == 2

    for bad in ("", "a b", "x" * 256, "ключ".encode(), "k\tey"):
        reply = await post(app, "viewer", body, bad)
        assert reply.status_code == 422, bad
        error = reply.json()["error"]
        assert error.startswith("invalid Idempotency-Key header") and "1 to 255" in error
    assert len(await decisions_in_log(stack.bus)) == 2
    assert ROLE_TOKENS  # the tokens the fixture registered


def test_parse_key_accepts_the_documented_alphabet() -> None:
    assert parse_key(" 3f2b-x_y.z:1~a+b/c= ") == "3f2b-x_y.z:1~a+b/c="
    assert parse_key('"quoted"') == "quoted"
    assert parse_key("k" * 255) == "k" * 255


def decision(decision_id: str, choice: str) -> DecisionMade:
    return DecisionMade(
        decision_id=decision_id,
        device_id="d1",
        source="api",
        workload="gemm",
        size=64,
        config={"ranks": 1},
        choice=choice,
        confidence=0.9,
        mode="auto",
    )


async def test_append_once_answers_the_original_within_and_past_the_duplicate_window(
    bus: EventBus,
) -> None:
    key_id = derived_id("tok_a", "POST /v1/decide", "k1")
    first = envelope(
        decision(key_id, "STOP"), actor="a", source="t", prefix=bus.prefix, event_id=key_id
    )
    assert await append_once(bus, first, "h1", {"ran": True}) is None

    # The same event id again: JetStream's duplicate window drops it (PubAck.duplicate).
    second = envelope(
        decision(key_id, "ranks+1"), actor="a", source="t", prefix=bus.prefix, event_id=key_id
    )
    original = await append_once(bus, second, "h1", {"ran": False})
    assert original is not None and original.extras == {"ran": True}
    assert original.envelope["data"]["choice"] == "STOP"

    # Another event id on the same subject (as a copy past the window would be): the subject's
    # sequence check refuses it and the original is answered.
    third = envelope(decision(key_id, "ranks+1"), actor="a", source="t", prefix=bus.prefix)
    past = await append_once(bus, third, "h1", None)
    assert past is not None and past.seq == original.seq
    assert past.envelope["data"]["choice"] == "STOP"

    with pytest.raises(KeyReused):
        await append_once(bus, second, "h2", None)
    with pytest.raises(KeyReused):
        await find(bus, first.subject, "h2")
    assert await bus.last_sequence() == 1


async def test_a_retry_of_a_real_run_runs_nothing_again(gateway: tuple[Stack, FastAPI]) -> None:
    """Without telemetry the job runs for real: a copy arriving while it runs joins it, a retry
    after it is answered from the log; one run, one decision, the first run's telemetry."""
    stack, app = gateway
    first, joined = await asyncio.gather(
        post(app, "engineer", JOB, "run-once"), post(app, "engineer", JOB, "run-once")
    )
    assert first.status_code == joined.status_code == 200, (first.text, joined.text)
    later = await post(app, "engineer", JOB, "run-once")
    replies = [first.json(), joined.json(), later.json()]
    assert all(r == replies[0] for r in replies)
    assert replies[0]["ran"] is True and replies[0]["telemetry"]["runtime_s"] > 0
    flags = sorted(r.headers["Idempotent-Replayed"] for r in (first, joined, later))
    assert flags == ["false", "true", "true"]
    runs = [
        raw
        async for chunk in stack.bus.replay(1, f"{stack.bus.prefix}.measurement.*.recorded")
        for raw in chunk
    ]
    assert len(runs) == 1
    assert len(await decisions_in_log(stack.bus)) == 1


def replica(stack: Stack, name: str) -> DecisionService:
    """A decision replica of its own (its own single-flight), on the stack's bus and database."""
    ctx = ServiceContext(
        "decision",
        stack.settings,
        stack.settings.nats_url,
        stack.settings.database_url,
        stack.bus,
        stack.engine,
        asyncio.Event(),
    )
    service = DecisionService(ctx)
    service.holder = name
    return service


async def measurements_in_log(bus: EventBus) -> int:
    pattern = f"{bus.prefix}.measurement.*.recorded"
    return len([raw async for chunk in bus.replay(1, pattern) for raw in chunk])


async def test_two_replicas_with_one_key_run_the_job_once(gateway: tuple[Stack, FastAPI]) -> None:
    """Copies of one keyed request on two replicas at once: one claims the key and runs the
    job, the other waits for its decision; one run, one decision, the same answer."""
    stack, _ = gateway
    request, key_id = DecideRequest.model_validate(JOB), uuid.uuid4().hex
    a, b = replica(stack, "replica-a"), replica(stack, "replica-b")
    (first, first_replayed), (second, second_replayed) = await asyncio.gather(
        a.decide_once(request, "engineer", key_id), b.decide_once(request, "engineer", key_id)
    )
    assert first == second and first["ran"] is True
    assert sorted([first_replayed, second_replayed]) == [False, True]
    assert await measurements_in_log(stack.bus) == 1
    assert len(await decisions_in_log(stack.bus)) == 1
    claims = await claims_bucket(stack.bus.js, stack.settings)
    assert not await held(claims, key_id)  # released once decided


async def test_the_claim_of_a_dead_replica_expires_and_a_waiting_one_decides(
    gateway: tuple[Stack, FastAPI],
) -> None:
    """A holder killed mid-run leaves its claim unrenewed and no decision: within CLAIM_TTL_S
    the waiting replica claims the key and decides itself."""
    stack, _ = gateway
    request, key_id = DecideRequest.model_validate(JOB), uuid.uuid4().hex
    claims = await claims_bucket(stack.bus.js, stack.settings)
    assert await claim(claims, key_id, "a-replica-killed-mid-run") is not None
    assert await claim(claims, key_id, "another") is None
    waiting = asyncio.create_task(replica(stack, "replica-b").decide_once(request, "op", key_id))
    await asyncio.sleep(1.0)
    assert not waiting.done() and await measurements_in_log(stack.bus) == 0
    body, replayed = await asyncio.wait_for(waiting, CLAIM_TTL_S + 120)
    assert replayed is False and body["ran"] is True
    assert await measurements_in_log(stack.bus) == 1
    assert len(await decisions_in_log(stack.bus)) == 1


async def test_a_held_claim_is_renewed_past_its_ttl_and_released_after(bus: EventBus) -> None:
    claims = await claims_bucket(bus.js, bus.settings)
    key = uuid.uuid4().hex
    revision = await claim(claims, key, "holder")
    assert revision is not None
    with pytest.raises(RuntimeError, match="failed"):
        async with holding(claims, key, "holder", revision):
            await asyncio.sleep(CLAIM_TTL_S * 1.5)
            assert await held(claims, key) and await claim(claims, key, "other") is None
            raise RuntimeError("the decision failed")
    assert not await held(claims, key)  # released: a retry may claim it
    assert await claim(claims, key, "other") is not None


class _SlowThenWell:
    """The real claims bucket, whose first `failures` renewals time out (a slow connection)."""

    def __init__(self, kv: Any, failures: int) -> None:
        self.kv, self.failures, self.timed_out = kv, failures, 0

    async def update(self, key: str, value: bytes, last: int) -> int:
        if self.timed_out < self.failures:
            self.timed_out += 1
            raise TimeoutError("nats: timeout")
        return await self.kv.update(key, value, last=last)

    async def delete(self, key: str) -> bool:
        return await self.kv.delete(key)


async def test_a_renewal_that_times_out_is_retried_and_the_claim_is_kept(bus: EventBus) -> None:
    claims = await claims_bucket(bus.js, bus.settings)
    key = uuid.uuid4().hex
    revision = await claim(claims, key, "holder")
    assert revision is not None
    slow = _SlowThenWell(claims, failures=2)  # the third renewal lands inside the TTL
    async with holding(slow, key, "holder", revision):  # type: ignore[arg-type]
        await asyncio.sleep(CLAIM_TTL_S * 1.2)
        assert slow.timed_out == 2
        assert await held(claims, key) and await claim(claims, key, "other") is None
    assert not await held(claims, key)
