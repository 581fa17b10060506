"""POST /v1/tasks with `Idempotency-Key` on real NATS and Postgres: a retried submission is one
task.submitted event and answers the first task; another token's key is another task; the same
key for another job is refused; a malformed key is a 422 naming the accepted form."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import envelope
from hpc_ds1.process.runtime import run_service
from hpc_ds1.services.gateway import create_app
from hpc_ds1.settings import Settings
from tests.support.gateway import as_role, asgi_client, role_token_events

JOB = {"workload": "gemm", "size": 256}


@pytest.fixture
async def http(
    settings: Settings, bus: EventBus, engine: Engine
) -> AsyncIterator[httpx.AsyncClient]:
    assert settings.nats_url and settings.database_url
    stop = asyncio.Event()
    projector = asyncio.create_task(
        run_service("projector", settings, settings.nats_url, settings.database_url, stop)
    )
    for event in role_token_events():
        await bus.publish(envelope(event, actor="test", source="test", prefix=bus.prefix))
    async for client in asgi_client(create_app(settings, bus, engine), timeout=30):
        for _ in range(200):  # the tokens are folded
            if (await client.get("/v1/whoami", headers=as_role("viewer"))).status_code == 200:
                break
            await asyncio.sleep(0.05)
        yield client
    stop.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(projector, 30)


async def submitted(bus: EventBus) -> list[str]:
    """The subject of every task.submitted event in the log."""
    return [
        raw.subject
        async for chunk in bus.replay(1, f"{bus.prefix}.task.*.submitted")
        for raw in chunk
    ]


async def submit(
    http: httpx.AsyncClient, role: str, job: dict[str, Any], key: str | None
) -> httpx.Response:
    headers = {**as_role(role), **({"Idempotency-Key": key} if key is not None else {})}
    return await http.post("/v1/tasks", json=job, headers=headers)


async def test_a_retried_submission_is_one_task(http: httpx.AsyncClient, bus: EventBus) -> None:
    first = await submit(http, "engineer", JOB, "submit-42")
    again = await submit(http, "engineer", JOB, "submit-42")
    assert first.status_code == again.status_code == 201, (first.text, again.text)
    assert (first.headers["Idempotent-Replayed"], again.headers["Idempotent-Replayed"]) == (
        "false",
        "true",
    )
    task_id = first.json()["task_id"]
    assert again.json()["task_id"] == task_id
    assert again.json()["submitted_at"] == first.json()["submitted_at"]
    assert await submitted(bus) == [f"{bus.prefix}.task.{task_id}.submitted"]

    admin = await submit(http, "admin", JOB, "submit-42")  # another token: another task
    assert admin.status_code == 201 and admin.json()["task_id"] != task_id
    assert admin.headers["Idempotent-Replayed"] == "false"

    other = await submit(http, "engineer", {**JOB, "size": 512}, "submit-42")
    assert other.status_code == 422
    assert "Idempotency-Key was used for a different request" in other.json()["error"]

    bad = await submit(http, "engineer", JOB, "no spaces")
    assert bad.status_code == 422 and "1 to 255" in bad.json()["error"]

    plain = [await submit(http, "engineer", JOB, None) for _ in range(2)]
    assert plain[0].json()["task_id"] != plain[1].json()["task_id"]
    assert "Idempotent-Replayed" not in plain[0].headers
    assert len(await submitted(bus)) == 4
