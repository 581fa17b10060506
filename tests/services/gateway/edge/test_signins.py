"""Sessions that end (issue 45): the console's cookie is a session of its own, kept in Postgres
and shared by every gateway replica; it ends at sign-out, when idle, at its longest life, and
with the token it was opened with. Tokens expire (in the gateway's cache too), their last use
is recorded, admin actions are listed with their actor, and every response carries the CSP and
frame headers. Real Postgres, NATS and projector folding; expiries are configured short."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import TokenCreated, TokenRevoked
from hpc_ds1.security.tokens import new_token, parse_expiry, token_hash
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.gateway.edge.auth import SESSION_COOKIE
from hpc_ds1.settings import Settings
from tests.support.gateway import ROLE_TOKENS, as_role, fold, role_token_events

ORIGIN = {"Origin": "http://gw"}


@pytest.fixture
async def folded(settings: Settings, bus: EventBus, engine: Engine) -> None:
    await fold(settings, bus, engine, *role_token_events())


async def _app(settings: Settings, bus: EventBus, engine: Engine, **changes: object) -> FastAPI:
    return create_app(settings.model_copy(update=changes), bus, engine)


async def _client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        yield http


async def _sign_in(http: httpx.AsyncClient, role: str) -> str:
    reply = await http.post("/", data={"token": ROLE_TOKENS[role]}, headers=ORIGIN)
    assert reply.status_code == 303, reply.text
    cookie = reply.headers["set-cookie"].lower()
    for attribute in ("httponly", "samesite=strict", "path=/", "max-age="):
        assert attribute in cookie, cookie
    assert "secure" not in cookie  # plain HTTP here; under TLS it is Secure (below)
    value = reply.cookies[SESSION_COOKIE]
    assert ROLE_TOKENS[role] not in reply.headers["set-cookie"]
    http.cookies.clear()
    return value


def _as(value: str) -> dict[str, str]:
    return {"Cookie": f"{SESSION_COOKIE}={value}"}


async def test_the_cookie_is_a_session_shared_by_replicas_and_sign_out_ends_it(
    settings: Settings, bus: EventBus, engine: Engine, folded: None
) -> None:
    one, two = await _app(settings, bus, engine), await _app(settings, bus, engine)
    async for a in _client(one):
        async for b in _client(two):
            session = await _sign_in(a, "engineer")
            # The other replica knows it: the session is in Postgres, not in a gateway.
            me = (await b.get("/v1/whoami", headers=_as(session))).json()
            assert me["role"] == "engineer" and me["via"] == "cookie"
            assert me["session_id"].startswith("ses_") and me["name"] == "engineer"
            with engine.connect() as conn:
                stored = conn.execute(select(tables.console_sessions.c.sha256)).scalars().all()
            assert session not in stored and ROLE_TOKENS["engineer"] not in stored

            # Sign-out needs this origin (a cross-site form cannot sign anyone out)...
            cross = await b.post("/signout", headers={**_as(session), "Origin": "http://evil"})
            assert cross.status_code == 403
            assert (await a.get("/v1/whoami", headers=_as(session))).status_code == 200
            # ...then it ends the session on the server: the same cookie, replayed to either
            # replica, is refused, and the page says why.
            out = await b.post("/signout", headers={**_as(session), **ORIGIN})
            assert out.status_code == 303 and out.headers["location"] == "/?signed_out=1"
            assert f'{SESSION_COOKIE}=""' in out.headers["set-cookie"]
            for http in (a, b):
                refused = await http.get("/v1/whoami", headers=_as(session))
                assert refused.status_code == 401 and "signed out" in refused.json()["error"]
            page = await a.get("/", headers=_as(session))
            assert page.status_code == 401 and "signed out" in page.text
            assert "Signed out." in (await a.get("/?signed_out=1")).text

            # A session opened with a token ends with the token.
            other = await _sign_in(a, "viewer")
            assert (await b.get("/v1/whoami", headers=_as(other))).status_code == 200
            await fold(settings, bus, engine, TokenRevoked(token_id="tok_viewer"))
            refused = await b.get("/v1/whoami", headers=_as(other))
            assert refused.status_code == 401 and "revoked" in refused.json()["error"]


async def test_a_session_ends_when_idle_and_at_its_longest_life_and_is_not_extended(
    settings: Settings, bus: EventBus, engine: Engine, folded: None
) -> None:
    app = await _app(settings, bus, engine, console_idle_s=1.0, console_max_s=3.0)
    async for http in _client(app):
        idle = await _sign_in(http, "viewer")
        await asyncio.sleep(1.3)
        refused = await http.get("/v1/whoami", headers=_as(idle))
        assert refused.status_code == 401 and "unused too long" in refused.json()["error"]
        # Refused for good: the first refusal ended it, so it never comes back.
        again = await http.get("/v1/whoami", headers=_as(idle))
        assert again.status_code == 401

        busy = await _sign_in(http, "viewer")
        loop = asyncio.get_running_loop()
        opened = loop.time()
        while loop.time() - opened < 2.6:  # used every 0.4 s: never idle
            assert (await http.get("/v1/whoami", headers=_as(busy))).status_code == 200
            await asyncio.sleep(0.4)
        await asyncio.sleep(max(0.0, 3.2 - (loop.time() - opened)))
        over = await http.get("/v1/whoami", headers=_as(busy))
        assert over.status_code == 401 and "longest life" in over.json()["error"]


async def test_the_cookie_is_secure_under_tls(
    settings: Settings, bus: EventBus, engine: Engine, folded: None
) -> None:
    app = await _app(settings, bus, engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://gw") as http:
        reply = await http.post(
            "/", data={"token": ROLE_TOKENS["admin"]}, headers={"Origin": "https://gw"}
        )
        assert reply.status_code == 303
        assert "secure" in reply.headers["set-cookie"].lower()


async def test_every_response_carries_the_csp_and_frame_headers(
    settings: Settings, bus: EventBus, engine: Engine, folded: None
) -> None:
    app = await _app(settings, bus, engine)
    async for http in _client(app):
        replies = {
            "/healthz": await http.get("/healthz"),
            "/docs": await http.get("/docs"),
            "/openapi.json": await http.get("/openapi.json"),
            "/static/console.css": await http.get("/static/console.css"),
            "401": await http.get("/v1/whoami"),
            "404": await http.get("/nowhere"),
            "422": await http.get("/v1/events?limit=0", headers=as_role("viewer")),
            "/": await http.get("/"),
        }
        for what, reply in replies.items():
            headers = reply.headers
            csp = headers.get("content-security-policy", "")
            assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, what
            assert "unsafe-eval" not in csp and "script-src 'self' 'unsafe-inline'" not in csp
            assert headers.get("x-frame-options") == "DENY", what
            assert headers.get("x-content-type-options") == "nosniff", what
            assert headers.get("referrer-policy") == "same-origin", what
            assert len(headers.get_list("content-security-policy")) == 1, what
        # /docs starts Swagger UI from a file, not an inline script the CSP would refuse.
        docs = replies["/docs"].text
        assert "<script>" not in docs and '<script src="/static/docs.js"></script>' in docs
        assert (await http.get("/static/docs.js")).status_code == 200


async def test_a_token_with_an_expiry_stops_at_it_in_the_cache_too(
    settings: Settings, bus: EventBus, engine: Engine, folded: None
) -> None:
    # A cache that would keep a token 30 s: the expiry still wins.
    app = await _app(settings, bus, engine, token_cache_s=30.0)
    token = new_token()
    expires = datetime.now(UTC) + timedelta(seconds=2)
    await fold(
        settings,
        bus,
        engine,
        TokenCreated(
            token_id="tok_brief",
            holder="brief",
            role="engineer",
            sha256=token_hash(token),
            expires_at=expires,
        ),
    )
    async for http in _client(app):
        me = await http.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})
        assert me.status_code == 200 and me.json()["expires_at"] is not None
        await asyncio.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.2)
        gone = await http.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})
        assert gone.status_code == 401 and "expired" in gone.json()["error"]
        # The last use was recorded (for `hpc-ds1 token list`).
        for _ in range(50):
            with engine.connect() as conn:
                used = conn.execute(
                    select(tables.token_activity.c.last_used_at).where(
                        tables.token_activity.c.token_id == "tok_brief"
                    )
                ).scalar()
            if used is not None:
                break
            await asyncio.sleep(0.05)
        assert used is not None


def test_an_expiry_is_parsed_or_refused_with_what_is_accepted() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert parse_expiry("30d", now) == now + timedelta(days=30)
    assert parse_expiry("1d12h", now) == now + timedelta(hours=36)
    assert parse_expiry("2030-02-01", now) == datetime(2030, 2, 1, tzinfo=UTC)
    assert parse_expiry("2030-02-01T18:00+02:00", now) == datetime(2030, 2, 1, 16, tzinfo=UTC)
    for bad, said in (
        ("soon", "not an expiry"),
        ("10y", "not an expiry"),
        ("30s", "under a minute"),
        ("2029-12-31", "in the past"),
        ("2000w", "more than 5 years"),
    ):
        with pytest.raises(ValueError, match=said) as error:
            parse_expiry(bad, now)
        assert "30d" in str(error.value)  # and says what is accepted


async def test_admin_actions_are_listed_with_their_actor(
    settings: Settings, bus: EventBus, engine: Engine, folded: None
) -> None:
    await fold(settings, bus, engine, TokenRevoked(token_id="tok_agent", reason="device d1 gone"))
    app = await _app(settings, bus, engine)
    async for http in _client(app):
        page = (await http.get("/v1/audit/admin", headers=as_role("viewer"))).json()
        actions = page["actions"]
        assert actions[0]["type"] == "token.revoked" and actions[0]["target"] == "tok_agent"
        assert actions[0]["actor"] == "tester" and "device d1 gone" in actions[0]["summary"]
        created = [a for a in actions if a["type"] == "token.created"]
        assert {a["target"] for a in created} >= {"tok_viewer", "tok_admin"}
        assert all("sha256" not in a["summary"] for a in actions)
