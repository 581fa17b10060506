"""The gateway's tests' helpers: one token per role (registered as token.created events and folded
into the projection like any other), a folding shortcut, the app in process over ASGI, a token
granted on a running stack, and the gateway served on a loopback socket of its own."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine

from hpc_ds1.eventlog.audit import AuditFile
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import TokenCreated, envelope, new_id
from hpc_ds1.security.tokens import new_token, token_hash
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.projector import project
from hpc_ds1.settings import Settings
from hpc_ds1.stack import Stack
from tests.support.waiting import until

ROLE_TOKENS = {role: new_token() for role in ("viewer", "engineer", "admin", "agent")}


def as_role(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ROLE_TOKENS[role]}"}


def role_token_events() -> list[Any]:
    return [
        TokenCreated(token_id=f"tok_{r}", holder=r, role=r, sha256=token_hash(t))  # type: ignore[arg-type]
        for r, t in ROLE_TOKENS.items()
    ]


async def fold(settings: Settings, bus: EventBus, engine: Engine, *events: Any) -> None:
    """Publish the events and fold everything in the stream into the projection."""
    if events:
        envs = [envelope(e, actor="tester", source="test", prefix=bus.prefix) for e in events]
        await bus.publish_many(envs, window=1)
    project(
        engine, [e async for chunk in bus.replay() for e in chunk], AuditFile(settings.audit_path)
    )


async def asgi_client(app: FastAPI, **kwargs: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", **kwargs) as http:
        yield http


async def grant(stack: Stack, role: str, holder: str) -> str:
    """A new token of `role` for `holder`, registered on the stack's log (fold it to use it)."""
    token = new_token()
    event = TokenCreated(token_id=new_id(), holder=holder, role=role, sha256=token_hash(token))  # type: ignore[arg-type]
    await stack.bus.publish(
        envelope(event, actor="admin", source="test", prefix=stack.settings.subject_prefix)
    )
    return token


@contextlib.asynccontextmanager
async def gateway_served(settings: Settings, stack: Stack) -> AsyncIterator[str]:
    """The gateway app on the stack, served by uvicorn on a free loopback port: its base URL."""
    app = create_app(settings, stack.bus, stack.engine)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    await until("the gateway serving", lambda: server.started, 30)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await app.state.stream_hub.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, 30)
        sock.close()
