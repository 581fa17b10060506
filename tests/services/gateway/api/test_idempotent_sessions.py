"""POST /v1/sessions with `Idempotency-Key`, through the gateway to a real coordinator over real
NATS and Postgres: a retry is answered with the session started first and the log holds one
session.started; another token's key is another session; the same key for another job, or a
key beside a session_id, is refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import start_session_subject
from hpc_ds1.events import DeviceRegistered
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.services.coordinator import Coordinator
from hpc_ds1.services.gateway import create_app
from hpc_ds1.settings import Settings
from tests.services.coordinator.device import DEVICE, FINGERPRINT, START
from tests.support.gateway import as_role, asgi_client, fold, role_token_events

JOB = {"workload": "gemm", "size": 256, "start": START}


@pytest.fixture
async def http(
    settings: Settings, engine: Engine, bus: EventBus
) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway and a coordinator answering starts (its sessions' runners cancelled after)."""
    assert settings.nats_url and settings.database_url
    device = DeviceRegistered(
        device_id=DEVICE, hostname="node", fingerprint=FINGERPRINT, local=True
    )
    await fold(settings, bus, engine, device, *role_token_events())
    stop = asyncio.Event()
    ctx = ServiceContext(
        "coordinator", settings, settings.nats_url, settings.database_url, bus, engine, stop
    )
    coordinator = Coordinator(ctx)
    sub = await bus.nc.subscribe(start_session_subject(settings), cb=coordinator.handle_start)
    try:
        async for client in asgi_client(create_app(settings, bus, engine), timeout=30):
            yield client
    finally:
        await sub.unsubscribe()
        for task in list(coordinator.tasks.values()):
            task.cancel()
        await asyncio.gather(*coordinator.tasks.values(), return_exceptions=True)
        stop.set()


async def started(bus: EventBus) -> list[str]:
    return [
        raw.subject
        async for chunk in bus.replay(1, f"{bus.prefix}.session.*.started")
        for raw in chunk
    ]


async def test_a_retried_start_is_one_session(http: httpx.AsyncClient, bus: EventBus) -> None:
    headers = {**as_role("engineer"), "Idempotency-Key": "tune-gemm-1"}
    first = await http.post("/v1/sessions", json=JOB, headers=headers)
    again = await http.post("/v1/sessions", json=JOB, headers=headers)
    assert first.status_code == again.status_code == 201, (first.text, again.text)
    assert (first.headers["Idempotent-Replayed"], again.headers["Idempotent-Replayed"]) == (
        "false",
        "true",
    )
    assert again.json() == first.json()
    session_id = first.json()["session_id"]
    assert await started(bus) == [f"{bus.prefix}.session.{session_id}.started"]

    admin = {**as_role("admin"), "Idempotency-Key": "tune-gemm-1"}
    other_token = await http.post("/v1/sessions", json=JOB, headers=admin)
    assert other_token.status_code == 201 and other_token.json()["session_id"] != session_id

    other_job = await http.post("/v1/sessions", json={**JOB, "size": 512}, headers=headers)
    assert other_job.status_code == 422
    assert "Idempotency-Key was used for a different request" in other_job.json()["error"]

    both = await http.post("/v1/sessions", json={**JOB, "session_id": "mine-1234"}, headers=headers)
    assert both.status_code == 422 and "not both" in both.json()["error"]
    assert len(await started(bus)) == 2
