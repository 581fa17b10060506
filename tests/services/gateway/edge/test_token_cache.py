"""The gateway's token cache: a token is looked up in Postgres once, not on every request, and a
revocation still takes effect at once (the token.revoked event, before the projector folds it)
or, if the event never came, within the cache's TTL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, insert, update

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import TokenCreated, TokenRevoked, envelope
from hpc_ds1.security.tokens import new_token, token_hash
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.gateway.edge.auth import install_auth
from hpc_ds1.services.gateway.edge.token_cache import TokenCache
from hpc_ds1.settings import Settings
from tests.support.gateway import as_role, asgi_client, fold

# The longest the tests wait for the event to reach the gateway (it takes milliseconds).
EVENT_WAIT_S = 10.0


@pytest.fixture
async def app(settings: Settings, bus: EventBus, engine: Engine, role_tokens: None) -> FastAPI:
    built = create_app(settings, bus, engine)
    install_auth(built, settings, engine, bus)
    return built


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async for client in asgi_client(app):
        yield client


def cache_of(app: FastAPI) -> TokenCache:
    tokens = app.state.auth.tokens
    assert isinstance(tokens, TokenCache)
    return tokens


async def whoami(http: httpx.AsyncClient, role: str) -> int:
    return (await http.get("/v1/whoami", headers=as_role(role))).status_code


async def test_a_token_is_looked_up_once_for_many_requests(
    app: FastAPI, http: httpx.AsyncClient
) -> None:
    for _ in range(20):
        assert await whoami(http, "viewer") == 200
    assert await whoami(http, "engineer") == 200
    assert cache_of(app).lookups == 2


async def test_a_revocation_is_refused_as_its_event_arrives_before_the_projection(
    app: FastAPI, http: httpx.AsyncClient, bus: EventBus, engine: Engine
) -> None:
    cache = cache_of(app)
    cache.ttl_s = 3600.0  # only the event can end the cached entry here
    assert await whoami(http, "viewer") == 200
    await bus.publish(
        envelope(
            TokenRevoked(token_id="tok_viewer"), actor="tester", source="test", prefix=bus.prefix
        )
    )
    deadline = asyncio.get_running_loop().time() + EVENT_WAIT_S
    while await whoami(http, "viewer") == 200:
        assert asyncio.get_running_loop().time() < deadline, "the revocation never took effect"
        await asyncio.sleep(0.01)
    # Nothing folded the event: Postgres still holds the token as active, the gateway refuses it.
    with engine.connect() as conn:
        revoked = conn.execute(
            tables.tokens.select().where(tables.tokens.c.token_id == "tok_viewer")
        ).one()
    assert revoked.revoked is False
    assert await whoami(http, "viewer") == 401
    assert await whoami(http, "engineer") == 200  # the others stay valid


async def test_a_revocation_without_event_takes_effect_within_the_ttl(
    app: FastAPI, http: httpx.AsyncClient, engine: Engine
) -> None:
    cache = cache_of(app)
    cache.ttl_s = 0.2
    assert await whoami(http, "viewer") == 200
    with engine.begin() as conn:  # a row changed by hand: no event tells the gateway
        conn.execute(
            update(tables.tokens)
            .where(tables.tokens.c.token_id == "tok_viewer")
            .values(revoked=True)
        )
    await asyncio.sleep(cache.ttl_s + 0.1)
    assert await whoami(http, "viewer") == 401


async def test_nothing_kept_is_trusted_after_the_connection_came_back(
    app: FastAPI, http: httpx.AsyncClient, bus: EventBus
) -> None:
    cache = cache_of(app)
    assert await whoami(http, "viewer") == 200
    assert await whoami(http, "viewer") == 200
    assert cache.lookups == 1
    # A reconnection may have lost a revocation sent meanwhile: everything is looked up again.
    bus.nc.stats["reconnects"] += 1
    assert await whoami(http, "viewer") == 200
    assert cache.lookups == 2
    assert await whoami(http, "viewer") == 200
    assert cache.lookups == 2


async def bearer_status(http: httpx.AsyncClient, token: str) -> int:
    reply = await http.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    return reply.status_code


async def test_a_token_known_to_be_bad_is_not_looked_up_again(
    app: FastAPI, http: httpx.AsyncClient
) -> None:
    cache = cache_of(app)
    cache.refused_s = 3600.0
    wrong = new_token()
    for _ in range(30):
        assert await bearer_status(http, wrong) == 401
    assert cache.lookups == 1 and cache.refusals == 29
    # A revoked token, too.
    assert await whoami(http, "viewer") == 200
    cache.revoked.add("tok_viewer")
    for _ in range(10):
        assert await whoami(http, "viewer") == 401
    assert cache.lookups == 3  # viewer's first lookup, then its refusal's


async def test_a_token_created_after_a_failed_try_works_once_its_event_arrives(
    app: FastAPI, http: httpx.AsyncClient, settings: Settings, bus: EventBus, engine: Engine
) -> None:
    cache = cache_of(app)
    cache.refused_s = 3600.0  # only its token.created event can end the refusal here
    token = new_token()
    assert await bearer_status(http, token) == 401
    assert await bearer_status(http, token) == 401
    assert cache.lookups == 1  # refused from memory the second time
    created = TokenCreated(
        token_id="tok_late", holder="late", role="viewer", sha256=token_hash(token)
    )
    await fold(settings, bus, engine, created)
    deadline = asyncio.get_running_loop().time() + EVENT_WAIT_S
    while await bearer_status(http, token) != 200:
        assert asyncio.get_running_loop().time() < deadline, "the new token stayed refused"
        await asyncio.sleep(0.01)


async def test_a_token_looked_up_before_its_event_is_folded_is_not_remembered_as_bad(
    app: FastAPI, http: httpx.AsyncClient, settings: Settings, bus: EventBus, engine: Engine
) -> None:
    cache = cache_of(app)
    cache.refused_s = 3600.0
    assert await whoami(http, "viewer") == 200  # subscribed
    token = new_token()
    created = TokenCreated(
        token_id="tok_soon", holder="soon", role="viewer", sha256=token_hash(token)
    )
    await bus.publish(envelope(created, actor="tester", source="test", prefix=bus.prefix))
    deadline = asyncio.get_running_loop().time() + EVENT_WAIT_S
    while token_hash(token) not in cache._created:  # the event reached the gateway
        assert asyncio.get_running_loop().time() < deadline, "the event never came"
        await asyncio.sleep(0.01)
    assert await bearer_status(http, token) == 401  # not projected yet
    await fold(settings, bus, engine)
    assert await bearer_status(http, token) == 200  # at once: the miss was not remembered


async def test_a_token_made_without_an_event_works_within_the_refusal_window(
    app: FastAPI, http: httpx.AsyncClient, engine: Engine
) -> None:
    cache = cache_of(app)
    cache.refused_s = 0.2
    token = new_token()
    assert await bearer_status(http, token) == 401
    assert await bearer_status(http, token) == 401
    assert cache.lookups == 1
    with engine.begin() as conn:  # a row made by hand: no event tells the gateway
        conn.execute(
            insert(tables.tokens).values(
                token_id="tok_hand",
                holder="hand",
                role="viewer",
                sha256=token_hash(token),
                created_by="hand",
                created_at=datetime.now(UTC),
                revoked=False,
                seq=0,
            )
        )
    await asyncio.sleep(cache.refused_s + 0.1)
    assert await bearer_status(http, token) == 200
