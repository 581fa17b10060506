"""The gateway's tests' helpers: one token per role (registered as token.created events and folded
into the projection like any other), a folding shortcut, and the app in process over ASGI."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import Engine

from hpc_ds1.eventlog.audit import AuditFile
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import TokenCreated, envelope
from hpc_ds1.security.tokens import new_token, token_hash
from hpc_ds1.services.projector import project
from hpc_ds1.settings import Settings

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
