"""The small reads the console's fleet and approvals sections need, on real NATS and Postgres: a
task's placed/started/finished times (its timeline), the workloads a task form offers, and the
moves already decided with who decided them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import (
    ApprovalDecided,
    ApprovalRequested,
    TaskFinished,
    TaskPlaced,
    TaskRequeued,
    TaskStarted,
    TaskSubmitted,
)
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.gateway.api.tasks import size_bounds
from hpc_ds1.settings import Settings
from hpc_ds1.workloads import list_workloads
from tests.support.gateway import as_role, asgi_client, fold

CONFIG = {"ranks": 2, "threads": 1, "tile": 64, "gpu": False}


@pytest.fixture
async def http(
    settings: Settings, bus: EventBus, engine: Engine, role_tokens: None
) -> AsyncIterator[httpx.AsyncClient]:
    async for client in asgi_client(create_app(settings, bus, engine)):
        yield client


def placed(task_id: str, device: str, attempt: int = 1) -> TaskPlaced:
    return TaskPlaced(
        task_id=task_id,
        attempt=attempt,
        device_id=device,
        config=CONFIG,
        expected_s=1.5,
        queue_s=0.0,
        basis="measured",
        reason=f"{device}: best measured 1.5 s",
    )


def submitted(task_id: str) -> TaskSubmitted:
    return TaskSubmitted(task_id=task_id, workload="gemm", size=256, submitted_by="engineer")


async def test_a_task_shows_when_it_was_placed_started_and_finished(
    settings: Settings, bus: EventBus, engine: Engine, http: httpx.AsyncClient
) -> None:
    await fold(
        settings,
        bus,
        engine,
        submitted("t-done"),
        placed("t-done", "dev-a"),
        TaskStarted(task_id="t-done", attempt=1, device_id="dev-a"),
        TaskFinished(task_id="t-done", attempt=1, device_id="dev-a", config=CONFIG, runtime_s=1.4),
        submitted("t-back"),
        placed("t-back", "dev-b"),
        TaskStarted(task_id="t-back", attempt=1, device_id="dev-b"),
        TaskRequeued(task_id="t-back", attempt=1, device_id="dev-b", reason="dev-b went offline"),
        submitted("t-new"),
    )
    viewer = as_role("viewer")
    tasks = {t["task_id"]: t for t in (await http.get("/v1/tasks", headers=viewer)).json()["tasks"]}
    done = tasks["t-done"]
    times = [datetime.fromisoformat(done[k]) for k in ("placed_at", "started_at", "finished_at")]
    assert times == sorted(times) and times[0] >= datetime.fromisoformat(done["submitted_at"])
    one = (await http.get("/v1/tasks/t-done", headers=viewer)).json()
    assert one["finished_at"] == done["finished_at"]
    # Back in the queue: the abandoned attempt's times are not the task's any more.
    back = tasks["t-back"]
    assert back["status"] == "submitted"
    assert (back["placed_at"], back["started_at"], back["finished_at"]) == (None, None, None)
    new = tasks["t-new"]
    assert (new["placed_at"], new["started_at"], new["finished_at"]) == (None, None, None)


async def test_the_workloads_a_task_may_be_are_listed_with_their_sizes(
    http: httpx.AsyncClient,
) -> None:
    answer = await http.get("/v1/workloads", headers=as_role("viewer"))
    assert answer.status_code == 200, answer.text
    listed = answer.json()["workloads"]
    assert [w["name"] for w in listed] == list_workloads()
    for w in listed:
        assert (w["min_size"], w["max_size"]) == size_bounds(w["name"])
    stencil = next(w for w in listed if w["name"] == "stencil")
    # The bounds are what POST /v1/tasks accepts: the largest is, one more is not.
    job = {"workload": "stencil", "size": stencil["max_size"] + 1}
    over = await http.post("/v1/tasks", json=job, headers=as_role("viewer"))
    assert over.status_code == 403
    over = await http.post("/v1/tasks", json=job, headers=as_role("engineer"))
    assert over.status_code == 422 and str(stencil["max_size"]) in over.text
    assert (await http.get("/v1/workloads")).status_code == 401


def requested(approval_id: str) -> ApprovalRequested:
    return ApprovalRequested(
        approval_id=approval_id,
        session_id=f"s-{approval_id}",
        decision_id=f"d-{approval_id}",
        device_id="dev-a",
        workload="gemm",
        size=512,
        config=CONFIG,
        move="ADD_RANK",
        confidence=0.62,
        mode="confirm",
        reasons=["confidence 0.62 is below 0.85"],
    )


def decided(approval_id: str, approved: bool, by: str, note: str) -> ApprovalDecided:
    return ApprovalDecided(
        approval_id=approval_id,
        session_id=f"s-{approval_id}",
        decision_id=f"d-{approval_id}",
        approved=approved,
        by=by,
        role="engineer",
        note=note,
    )


async def test_decided_moves_are_listed_latest_first_with_who_decided(
    settings: Settings, bus: EventBus, engine: Engine, http: httpx.AsyncClient
) -> None:
    await fold(
        settings,
        bus,
        engine,
        requested("a1"),
        requested("a2"),
        requested("a3"),
        decided("a1", True, "alice", "looks right"),
        decided("a3", False, "bob", "not on this node"),
    )
    viewer = as_role("viewer")

    async def listed(**params: Any) -> list[dict[str, Any]]:
        answer = await http.get("/v1/approvals", params=params, headers=viewer)
        assert answer.status_code == 200, answer.text
        approvals: list[dict[str, Any]] = answer.json()["approvals"]
        return approvals

    assert [a["approval_id"] for a in await listed()] == ["a2"]
    assert [a["approval_id"] for a in await listed(status="waiting")] == ["a2"]
    latest_first = await listed(status="decided")
    assert [a["approval_id"] for a in latest_first] == ["a3", "a1"]
    assert [(a["status"], a["decided_by"], a["note"]) for a in latest_first] == [
        ("rejected", "bob", "not on this node"),
        ("approved", "alice", "looks right"),
    ]
    assert latest_first[0]["decided_at"] is not None
    assert [a["approval_id"] for a in await listed(status="approved")] == ["a1"]
    assert [a["approval_id"] for a in await listed(status="rejected")] == ["a3"]
    assert [a["approval_id"] for a in await listed(status="decided", limit=1)] == ["a3"]
    for bad in ({"status": "lost"}, {"limit": 0}, {"limit": 1001}):
        assert (await http.get("/v1/approvals", params=bad, headers=viewer)).status_code == 422
