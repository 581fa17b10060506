"""Limits per client address: failed authentication and joins get 429 with Retry-After past
their limit (before any lookup), a flood of failures is a few log lines, not one per attempt;
the limiter's memory is bounded. The HTTP tests call from a non-loopback address (an ASGI
client's address), as a remote caller would."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.security.tokens import new_token
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.gateway.edge.auth import SESSION_COOKIE
from hpc_ds1.services.gateway.edge.ratelimit import QuietLog, RateLimiter
from hpc_ds1.services.gateway.edge.token_cache import TokenCache
from hpc_ds1.services.gateway.schemas import ErrorBody
from hpc_ds1.settings import Settings
from tests.support.gateway import as_role

from ..fleet_fixtures import FINGERPRINT, Fleet, bearer, fleet, projector

__all__ = ["fleet", "projector"]

REMOTE = ("203.0.113.7", 40000)  # TEST-NET-3: an address that is not this machine
OTHER = ("198.51.100.9", 40000)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_gives_its_burst_then_one_allowance_per_interval() -> None:
    clock = Clock()
    limiter = RateLimiter(3, clock=clock)  # 3 a minute: one back every 20 s
    assert [limiter.spend("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.wait("a") == pytest.approx(20.0)
    assert limiter.spend("a") == pytest.approx(20.0)  # refused: nothing spent
    assert limiter.wait("b") == 0.0  # per key
    clock.now += 5.0
    assert limiter.wait("a") == pytest.approx(15.0)  # waiting spends nothing either
    clock.now += 15.0
    assert limiter.spend("a") == 0.0 and limiter.wait("a") == pytest.approx(20.0)
    clock.now += 3600.0  # a long pause banks no more than the burst
    assert [limiter.spend("a") for _ in range(4)][-1] > 0


def test_no_limit_at_zero_and_memory_is_bounded() -> None:
    assert all(RateLimiter(0).spend("a") == 0.0 for _ in range(1000))
    limiter = RateLimiter(1, max_keys=100)
    for i in range(10_000):
        limiter.spend(f"10.0.{i // 256}.{i % 256}")
    assert len(limiter) == 100
    # The least recently used went first: the newest keys are still held to their limit.
    assert limiter.wait("10.0.39.15") > 0 and limiter.wait("10.0.0.0") == 0.0


def test_a_flood_is_its_first_line_then_a_count() -> None:
    clock = Clock()
    quiet = QuietLog(60.0, clock=clock)
    assert quiet.note("a") == (True, [])
    assert [quiet.note("a") for _ in range(499)] == [(False, [])] * 499
    assert quiet.note("b") == (True, [])
    clock.now += 61.0
    assert quiet.note("b") == (True, [("a", 499)])  # a's window is over: its count comes out
    bounded = QuietLog(60.0, max_keys=10, clock=clock)
    for i in range(1000):
        bounded.note(str(i))
    assert len(bounded) <= 10


@pytest.fixture
def limited(settings: Settings) -> Settings:
    return settings.model_copy(update={"auth_failures_per_minute": 5})


@pytest.fixture
async def app(limited: Settings, bus: EventBus, engine: Engine, role_tokens: None) -> FastAPI:
    return create_app(limited, bus, engine)


@pytest.fixture
async def remote(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, client=REMOTE)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        yield http


def records(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def assert_429(reply: httpx.Response, says: str) -> int:
    assert reply.status_code == 429, reply.text
    body = ErrorBody.model_validate(reply.json())  # the project's error body, nothing else
    assert says in body.error and "retry in" in body.error
    wait = int(reply.headers["retry-after"])
    assert 1 <= wait <= 60
    return wait


async def test_failed_authentication_gets_429_past_the_limit_before_any_lookup(
    app: FastAPI, remote: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = app.state.auth.tokens
    assert isinstance(cache, TokenCache)
    capsys.readouterr()
    for _ in range(5):  # five different wrong tokens: each looked up once, each refused
        assert (await remote.get("/v1/whoami", headers=bearer(new_token()))).status_code == 401
    assert cache.lookups == 5
    for _ in range(200):
        assert_429(
            await remote.get("/v1/whoami", headers=bearer(new_token())),
            "too many failed authentications",
        )
    assert cache.lookups == 5  # refused before the tokens table is asked
    # The address is held back as a whole while it has no failure left (a valid token too);
    # another address is not.
    assert_429(await remote.get("/v1/whoami", headers=as_role("viewer")), "failed auth")
    join = await remote.post("/v1/fleet/join", json={}, headers=bearer(new_token()))
    assert join.status_code == 429
    transport = httpx.ASGITransport(app=app, client=OTHER)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as other:
        assert (await other.get("/v1/whoami", headers=as_role("viewer"))).status_code == 200
    # 206 failures and refusals of one address: one auth line, and no request line for them.
    logged = records(capsys.readouterr().err)
    rejected = [r for r in logged if r["event"] == "auth_rejected"]
    assert len(rejected) == 1 and rejected[0]["client"] == REMOTE[0]
    requests = [r for r in logged if r["event"] == "request" and r["status"] in (401, 429)]
    assert len(requests) <= 1, requests


async def test_the_one_time_login_exchange_counts_as_failed_authentication(
    remote: httpx.AsyncClient,
) -> None:
    for _ in range(5):
        reply = await remote.get("/", params={"token": new_token()}, follow_redirects=False)
        assert reply.status_code == 401
    reply = await remote.get("/", params={"token": new_token()}, follow_redirects=False)
    assert_429(reply, "too many failed authentications")


async def test_the_consoles_sign_in_and_pages_count_as_failed_authentication(
    app: FastAPI, remote: httpx.AsyncClient
) -> None:
    form = {"Origin": "http://gw", "Content-Type": "application/x-www-form-urlencoded"}
    for _ in range(5):  # each failed sign-in counts once (an API token, then a login link)
        reply = await remote.post("/", content=f"token={new_token()}", headers=form)
        assert reply.status_code == 401
    assert_429(
        await remote.post("/", content=f"token={new_token()}", headers=form),
        "too many failed authentications",
    )
    remote.cookies.set(SESSION_COOKIE, new_token())
    assert_429(await remote.get("/"), "too many failed authentications")
    assert app.state.auth.tokens.lookups == 5


async def test_a_valid_token_spends_nothing(remote: httpx.AsyncClient) -> None:
    for _ in range(50):
        assert (await remote.get("/v1/whoami", headers=as_role("viewer"))).status_code == 200


async def test_joins_get_429_past_the_limit_except_from_this_machine(fleet: Fleet) -> None:
    settings = fleet.settings.model_copy(update={"joins_per_minute": 1})
    app = create_app(settings, fleet.bus, fleet.engine)
    body: dict[str, Any] = {"hostname": "node-9", "fingerprint": FINGERPRINT}

    async def join(client: tuple[str, int], name: str, **headers: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            return await http.post(
                "/v1/fleet/join",
                json={**body, "name": name},
                headers={**bearer(fleet.join_token), **headers},
            )

    assert (await join(REMOTE, "dev-r1")).status_code == 201
    wait = assert_429(await join(REMOTE, "dev-r2"), "too many joins")
    assert wait >= 55  # one join a minute
    # The limit is checked first: a wrong token past it is not even looked at.
    refused = await join(REMOTE, "dev-r3", Authorization=f"Bearer {new_token()}")
    assert refused.status_code == 429
    # This machine (loopback) brings up fleets: not limited.
    local = ("127.0.0.1", 40000)
    assert [(await join(local, f"dev-l{i}")).status_code for i in range(2)] == [201, 201]
    # Unless a proxy on this machine relayed the call (a forwarded header no trusted proxy
    # resolved): its callers are anywhere, and share the proxy's address.
    relayed = {"X-Forwarded-For": "8.8.8.8"}
    assert (await join(local, "dev-p1", **relayed)).status_code == 201
    assert_429(await join(local, "dev-p2", **relayed), "too many joins")
