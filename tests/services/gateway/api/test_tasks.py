"""POST/GET /v1/tasks on real NATS and Postgres, with the projector service running: a task is
submitted as its caller, bad jobs are refused naming what is accepted, and the listing and the
task JSON follow the task through placement, waiting, failures and its result."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import (
    TaskFinished,
    TaskPlaced,
    TaskRequeued,
    TaskStarted,
    TaskWaiting,
    decode,
    envelope,
)
from hpc_ds1.process.runtime import run_service
from hpc_ds1.services.gateway import create_app
from hpc_ds1.settings import Settings
from tests.support.gateway import as_role, asgi_client, role_token_events
from tests.support.waiting import until

CONFIG = {"ranks": 2, "threads": 1, "tile": 64, "gpu": False}


@pytest.fixture
async def http(
    settings: Settings, bus: EventBus, engine: Engine
) -> AsyncIterator[httpx.AsyncClient]:
    assert settings.nats_url and settings.database_url
    stop = asyncio.Event()
    projector = asyncio.create_task(
        run_service("projector", settings, settings.nats_url, settings.database_url, stop)
    )
    await publish(settings, bus, *role_token_events())
    async for client in asgi_client(create_app(settings, bus, engine), timeout=30):
        for _ in range(200):  # the tokens are folded
            if (await client.get("/v1/whoami", headers=as_role("viewer"))).status_code == 200:
                break
            await asyncio.sleep(0.05)
        yield client
    stop.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(projector, 30)


async def publish(settings: Settings, bus: EventBus, *events: Any) -> None:
    for event in events:
        await bus.publish(envelope(event, actor="placement", source="test", prefix=bus.prefix))


async def until_status(http: httpx.AsyncClient, task_id: str, status: str) -> dict[str, Any]:
    async def task() -> dict[str, Any] | None:
        answer = await http.get(f"/v1/tasks/{task_id}", headers=as_role("viewer"))
        body: dict[str, Any] = answer.json()
        return body if answer.status_code == 200 and body["status"] == status else None

    found: dict[str, Any] = await until(f"task {task_id} {status}", task, within_s=15)
    return found


async def submit(
    http: httpx.AsyncClient, workload: str = "nbody", size: int = 4096
) -> dict[str, Any]:
    answer = await http.post(
        "/v1/tasks", json={"workload": workload, "size": size}, headers=as_role("engineer")
    )
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def placed(task_id: str, device: str, attempt: int = 1) -> TaskPlaced:
    return TaskPlaced(
        task_id=task_id,
        attempt=attempt,
        device_id=device,
        config=CONFIG,
        expected_s=4.2,
        queue_s=3.1,
        basis="measured",
        reason=f"{device}: queue 3.1 s + best measured 4.2 s (ranks=2 threads=1) = 7.3 s",
        runner_up="dev-z",
    )


async def test_a_task_is_submitted_as_its_caller_and_read_back(
    settings: Settings, bus: EventBus, http: httpx.AsyncClient
) -> None:
    task = await submit(http)
    assert task["status"] == "submitted" and task["attempt"] == 0
    assert (task["workload"], task["size"], task["submitted_by"]) == ("nbody", 4096, "engineer")
    assert task["placement"] is None and task["result"] is None and task["failures"] == []
    # The answer came once the row was there: a GET right after finds the same task.
    read = await http.get(f"/v1/tasks/{task['task_id']}", headers=as_role("viewer"))
    assert read.status_code == 200 and read.json() == task

    found = []
    async for chunk in bus.replay():
        found += [decode(raw.data, raw.subject) for raw in chunk]
    submitted = [e for e in found if e.type == "task.submitted"]
    assert len(submitted) == 1
    assert submitted[0].actor == "engineer" and submitted[0].data["task_id"] == task["task_id"]

    missing = await http.get("/v1/tasks/no-such-task", headers=as_role("viewer"))
    assert missing.status_code == 404 and "no-such-task" in missing.json()["error"]
    assert (await http.get("/v1/tasks/a.b", headers=as_role("viewer"))).status_code in (404, 422)


BAD_JOBS = [
    ({"workload": "nosuch", "size": 10}, "known workloads: gemm, montecarlo, nbody, stencil"),
    ({"workload": "stencil", "size": 2}, "out of bounds for stencil: 3 to"),
    ({"workload": "gemm", "size": 10**9}, "out of bounds for gemm: 1 to"),
    ({"workload": "gemm", "size": 0}, "size"),
    ({"workload": "gemm", "size": 2**41}, "size"),
    ({"workload": "gemm", "size": "64"}, "size"),
    ({"workload": "gemm"}, "size"),
    ({"workload": "gemm", "size": 64, "device_id": "dev-a"}, "device_id"),
    ({"workload": "ge mm", "size": 64}, "workload"),
]


async def test_a_bad_job_is_refused_naming_what_is_accepted(
    bus: EventBus, http: httpx.AsyncClient
) -> None:
    for body, says in BAD_JOBS:
        answer = await http.post("/v1/tasks", json=body, headers=as_role("engineer"))
        assert answer.status_code == 422, body
        assert says in answer.text, (body, answer.text)
    found = [raw async for chunk in bus.replay() for raw in chunk]
    assert not [r for r in found if ".task." in r.subject]


async def test_only_engineers_submit(bus: EventBus, http: httpx.AsyncClient) -> None:
    job = {"workload": "gemm", "size": 64}
    viewer = await http.post("/v1/tasks", json=job, headers=as_role("viewer"))
    assert viewer.status_code == 403 and "viewer" in viewer.json()["error"]
    agent = await http.post("/v1/tasks", json=job, headers=as_role("agent"))
    assert agent.status_code == 403
    assert (await http.post("/v1/tasks", json=job)).status_code == 401
    assert (await http.get("/v1/tasks")).status_code == 401
    assert (await http.post("/v1/tasks", json=job, headers=as_role("admin"))).status_code == 201


async def test_the_task_json_follows_the_lifecycle_and_the_list_filters(
    settings: Settings, bus: EventBus, http: httpx.AsyncClient
) -> None:
    waits = await submit(http, "gemm", 64)
    runs = await submit(http, "gemm", 64)
    done = await submit(http, "gemm", 64)

    await publish(settings, bus, TaskWaiting(task_id=waits["task_id"], reason="no device online"))
    waiting = await until_status(http, waits["task_id"], "waiting")
    assert waiting["waiting_for"] == "no device online" and waiting["placement"] is None

    # Placed on dev-a, which went offline; placed again on dev-b, running there.
    await publish(
        settings,
        bus,
        placed(runs["task_id"], "dev-a"),
        TaskRequeued(
            task_id=runs["task_id"], attempt=1, device_id="dev-a", reason="dev-a went offline"
        ),
        placed(runs["task_id"], "dev-b", attempt=2),
        TaskStarted(task_id=runs["task_id"], attempt=2, device_id="dev-b"),
    )
    running = await until_status(http, runs["task_id"], "running")
    assert running["attempt"] == 2 and running["failures"] == ["dev-a went offline"]
    placement = running["placement"]
    assert placement["device_id"] == "dev-b" and placement["attempt"] == 2
    assert placement["config"] == CONFIG and placement["runner_up"] == "dev-z"
    assert placement["reason"].startswith("dev-b: queue 3.1 s")
    assert (placement["expected_s"], placement["queue_s"], placement["basis"]) == (
        4.2,
        3.1,
        "measured",
    )
    assert running["result"] is None

    await publish(
        settings,
        bus,
        placed(done["task_id"], "dev-a"),
        TaskFinished(
            task_id=done["task_id"],
            attempt=1,
            device_id="dev-a",
            config=CONFIG,
            runtime_s=4.0,
            expected_s=4.2,
            measurement_id="task-x-1",
        ),
    )
    finished = await until_status(http, done["task_id"], "finished")
    assert finished["result"] == {
        "device_id": "dev-a",
        "config": CONFIG,
        "runtime_s": 4.0,
        "expected_s": 4.2,
        "measurement_id": "task-x-1",
        "off_estimate": None,  # 4.0 s is near its own 4.2 s
    }

    viewer = as_role("viewer")

    async def ids(**params: Any) -> list[str]:
        answer = await http.get("/v1/tasks", params=params, headers=viewer)
        assert answer.status_code == 200, answer.text
        return [t["task_id"] for t in answer.json()["tasks"]]

    newest_first = [done["task_id"], runs["task_id"], waits["task_id"]]
    assert await ids() == newest_first
    assert await ids(status="running") == [runs["task_id"]]
    assert await ids(status="waiting") == [waits["task_id"]]
    assert await ids(device="dev-a") == [done["task_id"]]
    assert await ids(device="dev-b", status="finished") == []
    page = (await http.get("/v1/tasks", params={"limit": 2}, headers=viewer)).json()
    assert [t["task_id"] for t in page["tasks"]] == newest_first[:2]
    assert await ids(before=page["next_before"]) == newest_first[2:]
    for bad in (
        {"limit": 501},
        {"limit": 0},
        {"status": "lost"},
        {"device": "a.b"},
        {"before": "soon"},
    ):
        assert (await http.get("/v1/tasks", params=bad, headers=viewer)).status_code == 422
