"""Who may read and act (tokens and roles: a credential, never an address) and the audit trail /
stats API, on real events folded into the projection."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, Literal

import httpx
import pytest
import structlog
from fastapi import Depends, FastAPI
from sqlalchemy import Engine

from hpc_ds1 import log as hpc_log
from hpc_ds1.eventlog.audit import AuditFile
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import (
    ApprovalDecided,
    ApprovalRequested,
    DecisionMade,
    DeviceLeft,
    DeviceRegistered,
    DeviceStatusChanged,
    SessionFinished,
    SessionPaused,
    SessionStarted,
    TaskPlaced,
    TaskSubmitted,
    TokenCreated,
    TokenRevoked,
    envelope,
)
from hpc_ds1.security.tokens import Principal, new_token, token_hash
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.gateway.edge.auth import authenticated, install_auth, require
from hpc_ds1.services.projector import project
from hpc_ds1.settings import Settings

Engineer = Annotated[Principal, Depends(require("engineer"))]
Anyone = Annotated[Principal, Depends(authenticated)]
TOKENS = {role: new_token() for role in ("viewer", "engineer", "admin", "agent", "gone")}


def build_app(settings: Settings, bus: EventBus, engine: Engine) -> FastAPI:
    app = create_app(settings, bus, engine)
    install_auth(app, settings, engine, bus)

    # A stand-in for an engineer-only action (approvals are the lead's router).
    @app.post("/test/act")
    async def act(who: Engineer) -> dict[str, Any]:
        return {"name": who.name, "role": who.role}

    @app.post("/test/optional")
    async def optional(who: Anyone) -> dict[str, Any]:
        return {"name": who.name, "role": who.role}

    return app


def decision(i: int, **overrides: Any) -> DecisionMade:
    values: dict[str, Any] = {
        "decision_id": f"d{i}",
        "device_id": "dev-1",
        "source": "api",
        "workload": "stencil",
        "size": 160,
        "config": {"ranks": 1, "threads": 1, "tile": 32},
        "choice": "THREADS_UP",
        "confidence": 0.9,
        "mode": "auto",
        "reasons": [],
        "model_version": "m1",
    }
    values.update(overrides)
    return DecisionMade(**values)


def approval(i: int, session: str) -> ApprovalRequested:
    return ApprovalRequested(
        approval_id=f"a{i}",
        session_id=session,
        decision_id=f"d{i}",
        device_id="dev-1",
        workload="stencil",
        size=160,
        config={"ranks": 1, "threads": 1, "tile": 32},
        move="TILE_UP",
        confidence=0.6,
        mode="confirm",
        reasons=["confidence 0.60"],
    )


def story() -> list[Any]:
    """Devices, sessions, decisions of every source and mode, approvals in every state."""
    start = {"ranks": 1, "threads": 1, "tile": 32}
    roles: tuple[Literal["viewer", "engineer", "admin", "agent"], ...] = (
        "viewer",
        "engineer",
        "admin",
        "agent",
    )
    events: list[Any] = [
        TokenCreated(token_id=f"tok_{r}", holder=r, role=r, sha256=token_hash(TOKENS[r]))
        for r in roles
    ]
    events += [
        TokenCreated(
            token_id="tok_gone", holder="mallory", role="admin", sha256=token_hash(TOKENS["gone"])
        ),
        TokenRevoked(token_id="tok_gone"),
        DeviceRegistered(device_id="dev-1", hostname="n1", local=True),
        DeviceRegistered(device_id="dev-2", hostname="n2"),
        DeviceRegistered(device_id="dev-3", hostname="n3"),
        DeviceStatusChanged(device_id="dev-1", status="online"),
        DeviceStatusChanged(device_id="dev-2", status="online"),
        DeviceStatusChanged(device_id="dev-3", status="online"),
        DeviceLeft(device_id="dev-3", reason="gone"),
        TaskSubmitted(task_id="t1", workload="gemm", size=64, submitted_by="engineer"),
        TaskSubmitted(task_id="t2", workload="gemm", size=64, submitted_by="engineer"),
        TaskPlaced(
            task_id="t1",
            attempt=1,
            device_id="dev-2",
            config=start,
            expected_s=1.0,
            queue_s=0.0,
            basis="measured",
            reason="dev-2: the only device",
        ),
    ]
    for s in ("s1", "s2", "s3"):
        events.append(
            SessionStarted(
                session_id=s, device_id="dev-1", workload="stencil", size=160, start=start
            )
        )
    events += [
        # d1..d4: api/cli auto decisions; d5: a confirm answer nobody was asked about.
        decision(1),
        decision(2, source="cli", device_id="dev-2"),
        decision(3, workload="gemm"),
        decision(4, source="python"),
        decision(5, mode="confirm", confidence=0.7),
        # s1: waiting; s2: rejected (finished); s3: approved by alice.
        decision(6, source="session", session_id="s1", mode="confirm", confidence=0.6),
        approval(6, "s1"),
        SessionPaused(session_id="s1", step=1, approval_id="a6"),
        decision(7, source="session", session_id="s2", mode="escalate", confidence=0.3),
        approval(7, "s2"),
        ApprovalDecided(
            approval_id="a7",
            session_id="s2",
            decision_id="d7",
            approved=False,
            by="bob",
            role="engineer",
        ),
        SessionFinished(session_id="s2", reason="rejected", real_runs=2),
        decision(8, source="session", session_id="s3", mode="confirm", confidence=0.7),
        approval(8, "s3"),
        ApprovalDecided(
            approval_id="a8",
            session_id="s3",
            decision_id="d8",
            approved=True,
            by="alice",
            role="engineer",
            note="fine",
        ),
        decision(9, source="session", session_id="s3", confidence=0.95),
    ]
    return events


@pytest.fixture
async def folded(settings: Settings, bus: EventBus, engine: Engine) -> None:
    envs = [envelope(e, actor="tester", source="test", prefix=bus.prefix) for e in story()]
    await bus.publish_many(envs, window=1)
    project(
        engine, [e async for chunk in bus.replay() for e in chunk], AuditFile(settings.audit_path)
    )


async def _client(app: FastAPI, **kwargs: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", **kwargs) as http:
        yield http


@pytest.fixture
async def local(
    settings: Settings, bus: EventBus, engine: Engine, folded: None
) -> AsyncIterator[httpx.AsyncClient]:
    """A viewer's client of a gateway on loopback."""
    async for http in _client(build_app(settings, bus, engine), headers=bearer("viewer")):
        yield http


@pytest.fixture(params=["127.0.0.1", "0.0.0.0"])
async def bare(
    request: pytest.FixtureRequest,
    settings: Settings,
    bus: EventBus,
    engine: Engine,
    folded: None,
) -> AsyncIterator[httpx.AsyncClient]:
    """A client without a credential, of a gateway on loopback and beyond."""
    listening = settings.model_copy(update={"host": request.param})
    async for http in _client(build_app(listening, bus, engine)):
        yield http


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


# --- the audit trail ------------------------------------------------------------------------


async def test_audit_is_newest_first_and_pages_both_ways(local: httpx.AsyncClient) -> None:
    everything = (await local.get("/v1/audit")).json()
    ids = [d["decision_id"] for d in everything["decisions"]]
    assert ids == [f"d{i}" for i in range(9, 0, -1)]
    seqs = [d["seq"] for d in everything["decisions"]]
    assert seqs == sorted(seqs, reverse=True) and everything["next_before"] is None

    first = (await local.get("/v1/audit", params={"limit": 4})).json()
    assert [d["decision_id"] for d in first["decisions"]] == ["d9", "d8", "d7", "d6"]
    assert first["next_before"] == first["decisions"][-1]["seq"]
    second = (
        await local.get("/v1/audit", params={"limit": 4, "before": first["next_before"]})
    ).json()
    assert [d["decision_id"] for d in second["decisions"]] == ["d5", "d4", "d3", "d2"]
    last = (
        await local.get("/v1/audit", params={"limit": 4, "before": second["next_before"]})
    ).json()
    assert [d["decision_id"] for d in last["decisions"]] == ["d1"] and last["next_before"] is None

    forward = (await local.get("/v1/audit", params={"after": 0, "limit": 5})).json()
    assert [d["decision_id"] for d in forward["decisions"]] == ["d1", "d2", "d3", "d4", "d5"]
    assert forward["next_after"] == forward["decisions"][-1]["seq"]
    rest = (await local.get("/v1/audit", params={"after": forward["next_after"]})).json()
    assert [d["decision_id"] for d in rest["decisions"]] == ["d6", "d7", "d8", "d9"]
    assert rest["next_after"] is None

    assert (await local.get("/v1/audit", params={"limit": 1001})).status_code == 422
    assert (await local.get("/v1/audit", params={"limit": 0})).status_code == 422


async def test_audit_rows_say_who_approved(local: httpx.AsyncClient) -> None:
    rows = {d["decision_id"]: d for d in (await local.get("/v1/audit")).json()["decisions"]}
    approved = {k: v["approved"] for k, v in rows.items()}
    assert approved == {
        "d1": "auto",
        "d2": "auto",
        "d3": "auto",
        "d4": "auto",
        "d5": None,
        "d6": "waiting",
        "d7": "rejected",
        "d8": "alice",
        "d9": "auto",
    }
    d8 = rows["d8"]
    assert d8["source"] == "session" and d8["session_id"] == "s3" and d8["mode"] == "confirm"
    assert d8["config"] == {"ranks": 1, "threads": 1, "tile": 32} and d8["choice"] == "THREADS_UP"
    assert d8["actor"] == "tester" and d8["model_version"] == "m1" and d8["size"] == 160
    assert d8["confidence"] == pytest.approx(0.7) and d8["time"]
    assert isinstance(d8["reasons"], list)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"source": "cli"}, ["d2"]),
        ({"mode": "escalate"}, ["d7"]),
        ({"mode": "confirm", "source": "session"}, ["d8", "d6"]),
        ({"workload": "gemm"}, ["d3"]),
        ({"device_id": "dev-2"}, ["d2"]),
        ({"session_id": "s3"}, ["d9", "d8"]),
        ({"session_id": "nope"}, []),
    ],
)
async def test_audit_filters(
    local: httpx.AsyncClient, params: dict[str, str], expected: list[str]
) -> None:
    reply = (await local.get("/v1/audit", params=params)).json()
    assert [d["decision_id"] for d in reply["decisions"]] == expected


async def test_stats_are_the_facility_figures(local: httpx.AsyncClient) -> None:
    stats = (await local.get("/v1/stats")).json()
    assert stats == {
        "devices_online": 2,
        "sessions_running": 2,  # s1 paused, s3 running; s2 finished
        "tasks_running": 1,  # t1 placed; t2 not placed yet
        "moves_waiting": 1,
        "decisions_total": 9,
        "decisions_auto": 5,
        "auto_share": pytest.approx(5 / 9),
    }


async def test_stats_on_an_empty_log(settings: Settings, bus: EventBus, engine: Engine) -> None:
    # Nothing but the viewer's token in the log.
    viewer = TokenCreated(
        token_id="tok_viewer", holder="viewer", role="viewer", sha256=token_hash(TOKENS["viewer"])
    )
    await bus.publish(envelope(viewer, actor="tester", source="test", prefix=bus.prefix))
    project(engine, [e async for chunk in bus.replay() for e in chunk], None)
    async for http in _client(build_app(settings, bus, engine), headers=bearer("viewer")):
        stats = (await http.get("/v1/stats")).json()
    assert stats["decisions_total"] == 0 and stats["auto_share"] is None
    assert stats["devices_online"] == 0 and stats["moves_waiting"] == 0


# --- who ------------------------------------------------------------------------------------


async def test_every_call_needs_a_credential_wherever_the_gateway_listens(
    bare: httpx.AsyncClient,
) -> None:
    # On loopback as beyond it: a reverse proxy or an SSH tunnel hands out nothing.
    for method, path in (
        ("GET", "/v1/audit"),
        ("GET", "/v1/stats"),
        ("GET", "/v1/whoami"),
        ("GET", "/v1/events"),
        ("POST", "/test/act"),
        ("POST", "/test/optional"),
    ):
        reply = await bare.request(method, path)
        assert reply.status_code == 401, path
        assert "Bearer" in reply.json()["error"] and reply.headers["www-authenticate"] == "Bearer"
    assert (await bare.get("/healthz")).status_code == 200


async def test_roles_order_what_a_token_may_do(bare: httpx.AsyncClient) -> None:
    http = bare
    for role in ("viewer", "engineer", "admin"):
        assert (await http.get("/v1/audit", headers=bearer(role))).status_code == 200
        assert (await http.get("/v1/stats", headers=bearer(role))).status_code == 200
    # An agent token is not a person's viewer token.
    assert (await http.get("/v1/audit", headers=bearer("agent"))).status_code == 403
    viewer = await http.post("/test/act", headers=bearer("viewer"))
    assert viewer.status_code == 403
    assert "viewer" in viewer.json()["error"] and "engineer or admin" in viewer.json()["error"]
    assert (await http.post("/test/act", headers=bearer("agent"))).status_code == 403
    for role in ("engineer", "admin"):
        ok = await http.post("/test/act", headers=bearer(role))
        assert ok.status_code == 200 and ok.json() == {"name": role, "role": role}
    who = await http.post("/test/optional", headers=bearer("agent"))
    assert who.json() == {"name": "agent", "role": "agent"}
    me = (await http.get("/v1/whoami", headers=bearer("engineer"))).json()
    assert me == {
        "name": "engineer",
        "role": "engineer",
        "token_id": "tok_engineer",
        "via": "bearer",
    }


async def test_revoked_unknown_or_malformed_tokens_are_401(bare: httpx.AsyncClient) -> None:
    http = bare
    for headers in (
        bearer("gone"),
        {"Authorization": "Bearer hds1_not-a-real-token"},
        {"Authorization": f"Basic {TOKENS['viewer']}"},
        {"Authorization": "Bearer "},
    ):
        for method, path in (("GET", "/v1/audit"), ("GET", "/v1/whoami"), ("POST", "/test/act")):
            reply = await http.request(method, path, headers=headers)
            assert reply.status_code == 401, (headers, path)
            assert TOKENS["viewer"] not in reply.text and TOKENS["gone"] not in reply.text
    revoked = await http.get("/v1/audit", headers=bearer("gone"))
    assert "revoked" in revoked.json()["error"]


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """Everything the gateway logs during the test, as the JSON lines it writes."""
    saved = structlog.get_config()
    sink = io.StringIO()
    hpc_log.configure("debug", json=True)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sink))
    try:
        yield sink
    finally:
        structlog.configure(**saved)


async def test_tokens_are_never_logged_or_echoed(
    local: httpx.AsyncClient, log_lines: io.StringIO
) -> None:
    replies = [
        await local.get("/v1/audit", headers=bearer("engineer")),
        await local.post("/test/act", headers=bearer("viewer")),
        await local.get("/v1/audit", headers=bearer("gone")),
        await local.get("/v1/whoami", headers={"Authorization": f"Basic {TOKENS['admin']}"}),
    ]
    assert [r.status_code for r in replies] == [200, 403, 401, 401]
    text = log_lines.getvalue()
    records = [json.loads(line) for line in text.splitlines()]
    assert sum(r.get("event") == "request" for r in records) == 4
    assert any(r.get("event") == "authorized" and r["token_id"] == "tok_engineer" for r in records)
    for secret in TOKENS.values():
        assert secret not in text
        assert token_hash(secret) not in text
        assert all(secret not in r.text for r in replies)
