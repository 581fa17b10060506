from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import Engine

from hpc_ds1.audit import AuditFile
from hpc_ds1.bus import EventBus
from hpc_ds1.events import DeviceRegistered, MeasurementRecorded, envelope
from hpc_ds1.runtime import SERVICES
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.projector import project
from hpc_ds1.settings import Settings


@pytest.fixture
async def client(
    settings: Settings, bus: EventBus, engine: Engine
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, bus, engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        yield http


async def test_health_and_request_id(client: httpx.AsyncClient) -> None:
    reply = await client.get("/healthz", headers={"x-request-id": "abc123"})
    assert reply.json() == {"status": "ok"}
    assert reply.headers["x-request-id"] == "abc123"
    assert len((await client.get("/healthz")).headers["x-request-id"]) == 16


async def test_readyz_names_what_is_missing(client: httpx.AsyncClient) -> None:
    reply = await client.get("/readyz")
    body = reply.json()
    assert reply.status_code == 503
    assert body["checks"]["nats"]["ok"] and body["checks"]["postgres"]["ok"]
    assert body["checks"]["services"]["missing"] == list(SERVICES)


async def test_openapi_lists_the_event_log(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert "/v1/events" in spec["paths"] and "/readyz" in spec["paths"]


async def test_events_are_paged_and_filtered(
    client: httpx.AsyncClient, bus: EventBus, engine: Engine, settings: Settings
) -> None:
    envs = [
        envelope(
            DeviceRegistered(device_id=f"d{i}", hostname="h"),
            actor="t",
            source="t",
            prefix=bus.prefix,
        )
        for i in range(3)
    ] + [
        envelope(
            MeasurementRecorded(
                measurement_id=f"m{i}",
                device_id="d0",
                workload="gemm",
                size=64,
                config={},
                status="ok",
            ),
            actor="t",
            source="t",
            prefix=bus.prefix,
        )
        for i in range(4)
    ]
    await bus.publish_many(envs)
    project(
        engine, [e async for chunk in bus.replay() for e in chunk], AuditFile(settings.audit_path)
    )

    first = (await client.get("/v1/events", params={"limit": 4})).json()
    assert [e["seq"] for e in first["events"]] == [1, 2, 3, 4] and first["next_after"] == 4
    rest = (await client.get("/v1/events", params={"limit": 4, "after": 4})).json()
    assert [e["seq"] for e in rest["events"]] == [5, 6, 7] and rest["next_after"] is None

    only = (await client.get("/v1/events", params={"type": "measurement.recorded"})).json()
    assert [e["data"]["measurement_id"] for e in only["events"]] == ["m0", "m1", "m2", "m3"]
    prefix = f"{bus.prefix}.device.d1."
    by_subject = (await client.get("/v1/events", params={"subject": prefix})).json()
    assert [e["subject"] for e in by_subject["events"]] == [f"{prefix}registered"]

    bad = await client.get("/v1/events", params={"limit": 0})
    assert bad.status_code == 422
