"""What the fleet gateway tests share: a real projector, one token per role and the join token
registered as events and folded by it, the gateway app on an ASGI client, and a join."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import structlog
from fastapi import FastAPI
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import TokenCreated, envelope
from hpc_ds1.process.runtime import run_service
from hpc_ds1.security.credentials import read_join_token, register_join_token, wait_active
from hpc_ds1.security.tokens import token_hash
from hpc_ds1.services.gateway import create_app
from hpc_ds1.settings import Settings
from tests.support.gateway import ROLE_TOKENS, as_role

FINGERPRINT: dict[str, Any] = {
    "device_id": "f00dfeed0001",
    "hostname": "node-7.lab",
    "cpu_model": "Test CPU 9000",
    "architecture": "x86_64",
    "sockets": 1,
    "physical_cores": 4,
    "logical_cpus": 8,
    "simd": ["avx2", "fma"],
    "memory_bytes": 16 * 2**30,
    "caches": {"L2": "1 MiB"},
    "gpus": [{"name": "Sim GPU", "memory_bytes": 2**33, "simulated": True}],
    "mpi_library": "MPICH Version:\t4.0.2",
    "numba_version": "0.60",
    "python_version": "3.11.9",
}


@dataclass
class Fleet:
    app: FastAPI
    http: httpx.AsyncClient
    join_token: str
    bus: EventBus
    engine: Engine
    settings: Settings

    async def join(self, name: str | None = None, hostname: str = "node-7.lab") -> Any:
        body: dict[str, Any] = {"hostname": hostname, "fingerprint": FINGERPRINT}
        if name is not None:
            body["name"] = name
        return await self.http.post("/v1/fleet/join", json=body, headers=bearer(self.join_token))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def keep_logging() -> Iterator[None]:
    """The CLI run in this process configures logging for itself: put the tests' back after."""
    saved = structlog.get_config()
    try:
        yield
    finally:
        structlog.configure(**saved)


@contextlib.asynccontextmanager
async def _service(name: str, settings: Settings) -> AsyncIterator[None]:
    """One service of this home, run in this process for the test's length."""
    assert settings.nats_url and settings.database_url
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_service(name, settings, settings.nats_url, settings.database_url, stop)
    )
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)


@pytest.fixture
async def projector(settings: Settings, engine: Engine) -> AsyncIterator[None]:
    async with _service("projector", settings):
        yield


@pytest.fixture
async def placement_service(settings: Settings, engine: Engine) -> AsyncIterator[None]:
    """The placement service, for a test whose tasks are placed for real."""
    async with _service("placement", settings):
        yield


@pytest.fixture
async def fleet(
    settings: Settings, bus: EventBus, engine: Engine, projector: None
) -> AsyncIterator[Fleet]:
    for role, token in ROLE_TOKENS.items():
        created = TokenCreated(
            token_id=f"tok_{role}",
            holder=role,
            role=role,  # type: ignore[arg-type]
            sha256=token_hash(token),
        )
        await bus.publish(envelope(created, actor="tester", source="test", prefix=bus.prefix))
    for token in ROLE_TOKENS.values():
        assert await wait_active(engine, token, 30)
    assert await register_join_token(bus, engine, settings.home, wait_s=30)
    join_token = read_join_token(settings.home)
    assert join_token is not None
    app = create_app(settings, bus, engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        yield Fleet(app, http, join_token, bus, engine, settings)


__all__ = [
    "FINGERPRINT",
    "Fleet",
    "as_role",
    "bearer",
    "fleet",
    "keep_logging",
    "placement_service",
    "projector",
]
