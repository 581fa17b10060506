"""The gateway's edge: request ids and log lines, readiness, the event log, bounds on every
input, the body limit, no 500 with internals, and how service replies map to HTTP."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
import structlog
from fastapi import FastAPI
from sqlalchemy import Engine

from hpc_ds1 import log as hpc_log
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import decide_subject, start_session_subject, status_subject
from hpc_ds1.events import DeviceRegistered, MeasurementRecorded, TokenCreated
from hpc_ds1.process.runtime import SERVICES
from hpc_ds1.requests import MAX_SEQ, MAX_SIZE
from hpc_ds1.security.tokens import new_token, token_hash
from hpc_ds1.services.gateway import create_app
from hpc_ds1.settings import Settings
from tests.support.gateway import ROLE_TOKENS, as_role, asgi_client, fold

GEMM = {"workload": "gemm", "size": 288, "config": {"ranks": 1, "threads": 1}}
TELEMETRY = {"runtime_s": 0.01}


@pytest.fixture
def app(settings: Settings, bus: EventBus, engine: Engine, role_tokens: None) -> FastAPI:
    return create_app(settings, bus, engine)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A viewer's client."""
    async for http in asgi_client(app, headers=as_role("viewer")):
        yield http


@pytest.fixture
async def bare(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client without a credential."""
    async for http in asgi_client(app):
        yield http


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    saved = structlog.get_config()
    sink = io.StringIO()
    hpc_log.configure("info", json=True)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sink))
    try:
        yield sink
    finally:
        structlog.configure(**saved)


def requests_logged(sink: io.StringIO) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in sink.getvalue().splitlines()]
    return [x for x in lines if x.get("event") == "request"]


async def test_health_and_request_id(bare: httpx.AsyncClient) -> None:
    reply = await bare.get("/healthz", headers={"x-request-id": "abc123"})
    assert reply.json() == {"status": "ok"}
    assert reply.headers["x-request-id"] == "abc123"
    assert len((await bare.get("/healthz")).headers["x-request-id"]) == 16
    # A request id that is not a plain token is replaced, never echoed.
    odd = await bare.get("/healthz", headers={"x-request-id": "a b;<script>"})
    assert odd.headers["x-request-id"] != "a b;<script>" and len(odd.headers["x-request-id"]) == 16


async def test_readyz_names_what_is_missing(bare: httpx.AsyncClient) -> None:
    reply = await bare.get("/readyz")
    body = reply.json()
    assert reply.status_code == 503
    assert body["checks"]["nats"]["ok"] and body["checks"]["postgres"]["ok"]
    assert body["checks"]["services"]["missing"] == list(SERVICES)


async def test_readyz_reports_an_unhealthy_service_and_the_projector_lag(
    bare: httpx.AsyncClient, settings: Settings, bus: EventBus
) -> None:
    """A service that answers but says it is unhealthy makes the gateway not ready, by name."""

    def responder(name: str) -> Any:
        async def reply(msg: Any) -> None:
            body: dict[str, Any] = {"service": name, "uptime_s": 1.0}
            if name == "projector":
                body |= {"healthy": False, "problem": "stuck at seq 41 for 30 s", "lag": 17}
            await msg.respond(orjson.dumps(body))

        return reply

    subs = [await bus.nc.subscribe(status_subject(settings, n), cb=responder(n)) for n in SERVICES]
    try:
        reply = await bare.get("/readyz")
    finally:
        for sub in subs:
            await sub.unsubscribe()
    body = reply.json()
    assert reply.status_code == 503 and body["ready"] is False
    services = body["checks"]["services"]
    assert services["missing"] == [] and services["ok"] is False
    assert services["unhealthy"] == {"projector": "stuck at seq 41 for 30 s"}
    assert body["checks"]["projector_lag"] == 17


async def test_readyz_says_which_check_failed_not_the_exception(
    settings: Settings, bus: EventBus, engine: Engine
) -> None:
    dead = settings.model_copy(update={})
    from hpc_ds1.db import make_engine
    from hpc_ds1.infra.ports import free_port

    nowhere = make_engine(f"postgresql+psycopg://hpc:secret-pw@127.0.0.1:{free_port()}/x", 1)
    try:
        async for http in asgi_client(create_app(dead, bus, nowhere)):
            reply = await http.get("/readyz")
    finally:
        nowhere.dispose()
    assert reply.status_code == 503
    postgres = reply.json()["checks"]["postgres"]
    assert postgres == {"ok": False, "problem": "the database is not reachable"}
    for internal in ("secret-pw", "psycopg", "OperationalError", "127.0.0.1"):
        assert internal not in reply.text


async def test_openapi_declares_the_errors_of_every_operation(bare: httpx.AsyncClient) -> None:
    spec = (await bare.get("/openapi.json")).json()
    assert "/v1/events" in spec["paths"] and "/readyz" in spec["paths"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "500" in responses, (method, path)
            if path.startswith("/v1/"):
                assert {"401", "403"} <= set(responses), (method, path)
                schema = responses["401"]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}
            if "422" in responses:
                schema = responses["422"]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path)
            if "requestBody" in operation:
                assert "413" in responses, (method, path)


async def test_every_api_call_needs_a_credential(bare: httpx.AsyncClient) -> None:
    spec = (await bare.get("/openapi.json")).json()
    called = 0
    for path, operations in spec["paths"].items():
        if not path.startswith("/v1/"):
            continue
        url = path.replace("{approval_id}", "a1").replace("{session_id}", "s1")
        url = url.replace("{name}", "x.png")
        for method in operations:
            reply = await bare.request(method, url, json={})
            assert reply.status_code == 401, (method, path)
            called += 1
    assert called >= 10


async def test_events_are_paged_and_filtered_and_token_hashes_never_served(
    client: httpx.AsyncClient, bus: EventBus, engine: Engine, settings: Settings
) -> None:
    tokens = len(ROLE_TOKENS)  # the role tokens' events come first
    devices = [DeviceRegistered(device_id=f"d{i}", hostname="h") for i in range(3)]
    measured = [
        MeasurementRecorded(
            measurement_id=f"m{i}",
            device_id="d0",
            workload="gemm",
            size=64,
            config={},
            status="ok",
        )
        for i in range(4)
    ]
    await fold(settings, bus, engine, *devices, *measured)

    first = (await client.get("/v1/events", params={"limit": 4, "after": tokens})).json()
    seqs = [tokens + i for i in (1, 2, 3, 4)]
    assert [e["seq"] for e in first["events"]] == seqs and first["next_after"] == seqs[-1]
    rest = (await client.get("/v1/events", params={"limit": 4, "after": seqs[-1]})).json()
    assert [e["seq"] for e in rest["events"]] == [tokens + i for i in (5, 6, 7)]
    assert rest["next_after"] is None

    only = (await client.get("/v1/events", params={"type": "measurement.recorded"})).json()
    assert [e["data"]["measurement_id"] for e in only["events"]] == ["m0", "m1", "m2", "m3"]
    prefix = f"{bus.prefix}.device.d1."
    by_subject = (await client.get("/v1/events", params={"subject": prefix})).json()
    assert [e["subject"] for e in by_subject["events"]] == [f"{prefix}registered"]

    assert (await client.get("/v1/events", params={"limit": 0})).status_code == 422

    # Defect: token hashes were readable through the event log.
    token_events = await client.get("/v1/events", params={"type": "token.created"})
    assert len(token_events.json()["events"]) == tokens
    for admin in (client, None):
        headers = as_role("admin") if admin is None else None
        reply = await client.get("/v1/events", headers=headers)
        for token in ROLE_TOKENS.values():
            assert token_hash(token) not in reply.text
    assert all("sha256" not in e["data"] for e in token_events.json()["events"])
    assert {e["data"]["holder"] for e in token_events.json()["events"]} == set(ROLE_TOKENS)


BAD_QUERIES: list[tuple[str, dict[str, str]]] = [
    ("/v1/events", {"type": "device.registered\x00"}),
    ("/v1/events", {"subject": "hpcds1.\x00"}),
    ("/v1/audit", {"workload": "gemm\x00"}),
    ("/v1/audit", {"session_id": "\x00"}),
    ("/v1/audit", {"device_id": "d\x01"}),
    ("/v1/evaluation", {"device_id": "\x00"}),
    ("/v1/events", {"after": str(2**64)}),
    ("/v1/events", {"after": str(MAX_SEQ + 1)}),
    ("/v1/audit", {"after": str(2**63)}),
    ("/v1/audit", {"before": str(2**80)}),
    ("/v1/audit", {"mode": "sometimes"}),
    ("/v1/sessions", {"status": "running\x00"}),
    ("/v1/sessions", {"limit": "1001"}),
]


async def test_bad_query_parameters_are_422_not_500(
    client: httpx.AsyncClient, log_lines: io.StringIO
) -> None:
    # Defect: a NUL or an integer past 2**63 was a 500 with a traceback and no log line.
    for path, params in BAD_QUERIES:
        reply = await client.get(path, params=params)
        assert reply.status_code == 422, (path, params, reply.text)
        assert reply.json()["error"] and "Traceback" not in reply.text
        assert reply.headers["x-request-id"]
    assert [r["status"] for r in requests_logged(log_lines)] == [422] * len(BAD_QUERIES)


async def test_paging_accepts_the_largest_sequence(client: httpx.AsyncClient) -> None:
    for path, name in (("/v1/events", "after"), ("/v1/audit", "after"), ("/v1/audit", "before")):
        reply = await client.get(path, params={name: str(MAX_SEQ)})
        assert reply.status_code == 200, (path, name, reply.text)


async def test_ids_that_could_widen_a_subject_never_reach_one(app: FastAPI) -> None:
    # Defect: POST /v1/approvals/%2A scanned every approval.
    async for http in asgi_client(app, headers=as_role("engineer")):
        for odd in ("%2A", "%3E", "a.b", "a%20b", "x" * 65, "a%00", "%2A.%3E"):
            reply = await http.post(f"/v1/approvals/{odd}", json={"decision": "approve"})
            session = await http.get(f"/v1/sessions/{odd}")
            assert reply.status_code == 422, (odd, reply.text)
            assert session.status_code == 422, (odd, session.text)


async def test_notes_and_verdicts_are_bounded(app: FastAPI) -> None:
    async for http in asgi_client(app, headers=as_role("engineer")):
        nul = await http.post("/v1/approvals/a1", json={"decision": "approve", "note": "a\x00b"})
        long = await http.post("/v1/approvals/a1", json={"decision": "approve", "note": "n" * 2001})
        other = await http.post("/v1/approvals/a1", json={"decision": "maybe"})
        fine = await http.post("/v1/approvals/a1", json={"decision": "reject", "note": "a\nb"})
    assert [r.status_code for r in (nul, long, other)] == [422, 422, 422]
    assert "note" in nul.json()["error"] and "note" in long.json()["error"]
    assert fine.status_code == 404  # valid, but there is no such approval


async def test_a_body_over_the_limit_is_refused_before_it_is_parsed(
    settings: Settings, bus: EventBus, engine: Engine, role_tokens: None, log_lines: io.StringIO
) -> None:
    small = settings.model_copy(update={"max_body_bytes": 4096})
    big = b'{"workload": "gemm", "pad": "' + b"x" * 10_000 + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    async for http in asgi_client(create_app(small, bus, engine), headers=as_role("engineer")):
        declared = await http.post(
            "/v1/decide", content=big, headers={"Content-Type": "application/json"}
        )
        chunked = await http.post(
            "/v1/decide", content=chunks(), headers={"Content-Type": "application/json"}
        )
        within = await http.post("/v1/decide", json={**GEMM, "extra": "x" * 100})
    assert declared.status_code == 413 and chunked.status_code == 413, chunked.text
    assert "4096 bytes" in declared.json()["error"] and "4096 bytes" in chunked.json()["error"]
    assert declared.headers["x-request-id"] and chunked.headers["x-request-id"]
    assert within.status_code == 422  # read and validated
    assert [r["status"] for r in requests_logged(log_lines)] == [413, 413, 422]


async def test_an_unexpected_error_is_a_json_500_without_internals_and_is_logged(
    app: FastAPI, log_lines: io.StringIO
) -> None:
    @app.get("/test/boom")
    async def boom() -> None:
        raise RuntimeError("secret internal detail at /srv/db password=hunter2")

    async for http in asgi_client(app, headers={"x-request-id": "req-500"}):
        reply = await http.get("/test/boom")
    assert reply.status_code == 500
    assert reply.json() == {
        "error": "internal error: the gateway's log names it by request id req-500",
        "request_id": "req-500",
    }
    assert reply.headers["x-request-id"] == "req-500"
    assert "hunter2" not in reply.text and "Traceback" not in reply.text
    [line] = requests_logged(log_lines)
    assert line["status"] == 500 and line["request_id"] == "req-500"
    assert "RuntimeError" in line["error"]


# --- decide: the caller says what job, the credential says who --------------------------------


async def test_decide_bodies_cannot_say_who_or_where(app: FastAPI) -> None:
    # Defect 8: these were copied into the decision event.
    async for http in asgi_client(app, headers=as_role("engineer")):
        for field, value in (
            ("source", "session"),
            ("session_id", "someone-elses-session"),
            ("device_id", "dev-1"),
        ):
            body = {**GEMM, "telemetry": TELEMETRY, field: value}
            reply = await http.post("/v1/decide", json=body)
            assert reply.status_code == 422
            assert field in reply.json()["error"]
            assert reply.json()["detail"][0]["type"] == "extra_forbidden"


OUT_OF_BOUNDS: list[dict[str, Any]] = [
    {**GEMM, "size": MAX_SIZE + 1},
    {**GEMM, "size": 10**19},
    {**GEMM, "size": 0},
    {**GEMM, "size": "288"},
    {**GEMM, "workload": "gemm\x00"},
    {**GEMM, "workload": "a" * 65},
    {**GEMM, "workload": "gemm.*"},
    {**GEMM, "config": {"ranks": 1, "threads": 1, "tile": 2**40}},
    {**GEMM, "config": {"ranks": 5000, "threads": 1}},
    {**GEMM, "telemetry": {"runtime_s": 1e300}},
    {**GEMM, "telemetry": {"runtime_s": 0}},
    {**GEMM, "telemetry": {"runtime_s": 1.0, "throughput": -1}},
]


async def test_decide_bounds(app: FastAPI) -> None:
    async for http in asgi_client(app, headers=as_role("engineer")):
        for body in OUT_OF_BOUNDS:
            reply = await http.post("/v1/decide", json=body)
            assert reply.status_code == 422, (body, reply.text)
        nan = await http.post(
            "/v1/decide",
            content=b'{"workload": "gemm", "size": 288, "config": {"ranks": 1, "threads": 1}, '
            b'"telemetry": {"runtime_s": NaN}}',
            headers={"Content-Type": "application/json"},
        )
        assert nan.status_code == 422


async def test_running_a_job_needs_an_engineer(app: FastAPI) -> None:
    # Defect 2: without telemetry the job runs for real; a viewer may not ask for that.
    for role in ("viewer", "agent"):
        async for http in asgi_client(app, headers=as_role(role)):
            reply = await http.post("/v1/decide", json=GEMM)
        assert reply.status_code == 403, role
        assert "engineer" in reply.json()["error"]
    async for http in asgi_client(app):
        assert (await http.post("/v1/decide", json=GEMM)).status_code == 401


async def test_the_gateway_sets_source_and_actor_from_the_credential(
    app: FastAPI, settings: Settings, bus: EventBus
) -> None:
    """What reaches the decision service: source api, no session or device, the token's holder
    as the actor; its refusal keeps its own status."""
    seen: list[tuple[dict[str, Any], str | None]] = []

    async def decision_service(msg: Any) -> None:
        seen.append((orjson.loads(msg.data), (msg.headers or {}).get("Hpc-Actor")))
        reply = {"ok": False, "status": 409, "error": "no model for device d1 yet"}
        await msg.respond(orjson.dumps(reply))

    sub = await bus.nc.subscribe(decide_subject(settings), cb=decision_service)
    try:
        async for http in asgi_client(app, headers=as_role("viewer")):
            viewer = await http.post("/v1/decide", json={**GEMM, "telemetry": TELEMETRY})
        async for http in asgi_client(app, headers=as_role("engineer")):
            engineer = await http.post("/v1/decide", json=GEMM)
    finally:
        await sub.unsubscribe()
    assert viewer.status_code == engineer.status_code == 409
    assert viewer.json() == {"error": "no model for device d1 yet"}
    (first, first_actor), (second, second_actor) = seen
    assert (first_actor, second_actor) == ("viewer", "engineer")
    for sent in (first, second):
        assert sent["source"] == "api" and sent["session_id"] is None
        assert sent["device_id"] is None
    assert first["telemetry"] == {"runtime_s": 0.01, "throughput": None}
    assert second["telemetry"] is None


async def test_a_missing_decision_service_is_503_without_internals(app: FastAPI) -> None:
    async for http in asgi_client(app, headers=as_role("viewer")):
        reply = await http.post("/v1/decide", json={**GEMM, "telemetry": TELEMETRY})
    assert reply.status_code == 503
    assert reply.json() == {"error": "the decision service is not running"}


# --- sessions: the coordinator's refusals keep their status ---------------------------------


async def test_a_session_id_in_use_is_409_at_once(
    app: FastAPI, settings: Settings, bus: EventBus
) -> None:
    # Defect 9 (gateway part): the conflict used to hang 30 s and end as a 503.
    started: set[str] = set()

    async def coordinator(msg: Any) -> None:
        body = orjson.loads(msg.data)
        if body["session_id"] in started:
            answer = {"ok": False, "status": 409, "error": f"session {body['session_id']} exists"}
        else:
            started.add(body["session_id"])
            answer = {
                "ok": True,
                "session_id": body["session_id"],
                "device_id": "d1",
                "start": {"ranks": 1, "threads": 1, "tile": 32, "gpu": False},
            }
        await msg.respond(orjson.dumps(answer))

    sub = await bus.nc.subscribe(start_session_subject(settings), cb=coordinator)
    body = {"workload": "gemm", "size": 288, "session_id": "session-0001"}
    try:
        async for http in asgi_client(app, headers=as_role("engineer")):
            first = await asyncio.wait_for(http.post("/v1/sessions", json=body), 5)
            second = await asyncio.wait_for(http.post("/v1/sessions", json=body), 5)
            odd = await http.post("/v1/sessions", json={**body, "device_id": "a.>"})
    finally:
        await sub.unsubscribe()
    assert first.status_code == 201 and first.json()["session_id"] == "session-0001"
    assert second.status_code == 409 and "exists" in second.json()["error"]
    assert odd.status_code == 422


async def test_a_missing_coordinator_is_503_without_internals(app: FastAPI) -> None:
    async for http in asgi_client(app, headers=as_role("engineer")):
        reply = await http.post("/v1/sessions", json={"workload": "gemm", "size": 288})
    assert reply.status_code == 503
    assert reply.json() == {"error": "the coordinator is not running"}


async def test_new_tokens_work_once_folded(
    bare: httpx.AsyncClient, settings: Settings, bus: EventBus, engine: Engine
) -> None:
    token = new_token()
    event = TokenCreated(token_id="tok_new", holder="nia", role="viewer", sha256=token_hash(token))
    assert (
        await bare.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    ).status_code == 401
    await fold(settings, bus, engine, event)
    me = await bare.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert me.json() == {"name": "nia", "role": "viewer", "token_id": "tok_new", "via": "bearer"}
