"""The home's own credentials: the CLI token (a 0600 file, registered as an admin token of the
home's owner) and the one-time login URL traded for a session cookie, with a real projector
folding the token events."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import TokenRevoked, envelope
from hpc_ds1.process.runtime import run_service
from hpc_ds1.security.credentials import (
    CredentialError,
    cli_token_id,
    cli_token_path,
    new_login_token,
    owner_name,
    read_cli_token,
    register_cli_token,
    token_state,
)
from hpc_ds1.security.tokens import TOKEN_PATTERN, Principal, lookup
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.gateway.edge.auth import SESSION_COOKIE
from hpc_ds1.settings import Settings


@pytest.fixture
async def projector(settings: Settings, engine: Engine) -> AsyncIterator[None]:
    assert settings.nats_url and settings.database_url
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_service("projector", settings, settings.nats_url, settings.database_url, stop)
    )
    yield
    stop.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(task, 30)


async def test_the_cli_token_is_private_registered_once_and_replaced_when_revoked(
    settings: Settings, bus: EventBus, engine: Engine, projector: None
) -> None:
    home = settings.home
    assert await register_cli_token(bus, engine, home, wait_s=30)
    path = cli_token_path(home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = read_cli_token(home)
    assert token is not None and TOKEN_PATTERN.match(token)
    holder = owner_name()
    assert lookup(engine, token) == Principal(holder, "admin", cli_token_id(token))

    # A second start (or a second gateway of the home) registers nothing more.
    assert await register_cli_token(bus, engine, home, wait_s=30)
    assert len(await bus.history("token", cli_token_id(token))) == 1
    assert read_cli_token(home) == token

    # Revoked: the next start writes and registers a new one.
    revoke = TokenRevoked(token_id=cli_token_id(token))
    await bus.publish(envelope(revoke, actor="admin", source="test", prefix=bus.prefix))
    for _ in range(200):
        if token_state(engine, token) == "revoked":
            break
        await asyncio.sleep(0.05)
    assert await register_cli_token(bus, engine, home, wait_s=30)
    fresh = read_cli_token(home)
    assert fresh is not None and fresh != token
    assert lookup(engine, token) is None
    assert lookup(engine, fresh) == Principal(holder, "admin", cli_token_id(fresh))

    # A token file others can read is refused, as ssh refuses such a key.
    os.chmod(path, 0o644)
    with pytest.raises(CredentialError, match="chmod 600"):
        read_cli_token(home)


async def test_the_login_url_works_once_and_sets_a_strict_cookie(
    settings: Settings, bus: EventBus, engine: Engine, projector: None
) -> None:
    app = create_app(settings, bus, engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        signin = await http.get("/")  # no credential: the console's sign-in page
        assert signin.status_code == 200 and 'name="token"' in signin.text
        one_time = new_login_token(settings.home)
        wrong = await http.get("/", params={"token": one_time[:-1] + "x"})
        assert wrong.status_code == 401 and "hpc-ds1 token login" in wrong.json()["error"]

        login = await http.get("/", params={"token": one_time})
        assert login.status_code == 303 and login.headers["location"] == "/"
        cookie = login.headers["set-cookie"]
        assert cookie.startswith(f"{SESSION_COOKIE}=")
        for attribute in ("HttpOnly", "SameSite=strict", "Path=/"):
            assert attribute.lower() in cookie.lower(), cookie
        assert one_time not in cookie

        again = await http.get("/", params={"token": one_time})
        assert again.status_code == 401  # the one-time token worked once

        me = (await http.get("/v1/whoami")).json()
        assert me["name"] == owner_name() and me["role"] == "admin" and me["via"] == "cookie"
        assert (await http.get("/v1/audit")).status_code == 200

        # A cookie-authenticated change must come from this origin (CSRF).
        verdict = {"decision": "approve"}
        cross = await http.post("/v1/approvals/a1", json=verdict)
        assert cross.status_code == 403 and "Origin" in cross.json()["error"]
        evil = await http.post(
            "/v1/approvals/a1", json=verdict, headers={"Origin": "http://evil.example"}
        )
        assert evil.status_code == 403
        same = await http.post("/v1/approvals/a1", json=verdict, headers={"Origin": "http://gw"})
        assert same.status_code == 404  # past the guard: there is no approval a1
        scripted = await http.post(
            "/v1/approvals/a1", json=verdict, headers={"X-Requested-With": "fetch"}
        )
        assert scripted.status_code == 404

    # Without the cookie: nothing.
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as fresh:
        assert (await fresh.get("/v1/whoami")).status_code == 401
