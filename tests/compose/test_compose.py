"""docker-compose.yml running for real (make test-compose): every service in its own container
against NATS and Postgres containers, driven through the gateway's HTTP API with an engineer's
token, as a user of the deployment would. Each flow ends in the projected read models, so it
went through the log, the projector and Postgres too."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.waiting import wait_for

URL = os.environ.get("HPC_DS1_COMPOSE_URL", "")
TOKEN = os.environ.get("HPC_DS1_COMPOSE_TOKEN", "")
DEADLINE_S = 600.0  # generous: every step is a real MPI run on two shared cores


@pytest.fixture(scope="module")
def api() -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=URL, headers=headers, timeout=120) as client:
        yield client


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, f"{response.request.url}: {response.text}"
    return response.json()


@pytest.fixture(scope="module")
def device(api: httpx.Client) -> dict[str, Any]:
    devices = ok(api.get("/v1/devices"))["devices"]
    local = [d for d in devices if d["local"] and d["hostname"] == "hpc-ds1-agent"]
    assert len(local) == 1, devices
    assert local[0]["status"] == "online", local[0]
    return local[0]


def test_ready_with_every_service(api: httpx.Client) -> None:
    ready = ok(api.get("/readyz"))
    assert ready["ready"] is True, ready
    assert ready["checks"]["services"]["missing"] == [], ready
    assert ok(api.get("/v1/whoami"))["role"] == "engineer"


def test_a_decision_runs_the_job_on_the_agent_and_is_audited(
    api: httpx.Client, device: dict[str, Any]
) -> None:
    body = {"workload": "gemm", "size": 96, "config": {"ranks": 1, "threads": 1}}
    decision = ok(api.post("/v1/decide", json=body))
    assert decision["ran"] is True and decision["telemetry"]["runtime_s"] > 0, decision
    assert decision["device_id"] == device["device_id"]
    assert decision["mode"] in ("auto", "confirm", "escalate")
    assert decision["choice"] in decision["alternatives"]

    def audited() -> dict[str, Any] | None:
        rows = ok(api.get("/v1/audit", params={"source": "api", "limit": 50}))["decisions"]
        return next((r for r in rows if r["decision_id"] == decision["decision_id"]), None)

    row = wait_for("the decision in /v1/audit", audited, DEADLINE_S, every_s=0.5)
    assert row["choice"] == decision["choice"] and row["mode"] == decision["mode"]


def test_a_session_waits_for_an_engineer_and_goes_on_when_approved(
    api: httpx.Client, device: dict[str, Any]
) -> None:
    kernels = ok(api.get("/v1/measurements/summary"))["kernels"]
    guard = next(k["guard_range"] for k in kernels if k["kernel"] == "gemm")
    # Outside the measured range the familiarity guard sends every move to an engineer.
    size = 2 * guard[1]
    start = {"workload": "gemm", "size": size, "start": {"ranks": 1, "threads": 1, "tile": 64}}
    started = ok(api.post("/v1/sessions", json=start), 201)
    session_id = started["session_id"]
    assert started["device_id"] == device["device_id"]

    verdicts: list[dict[str, Any]] = []

    def settled() -> dict[str, Any] | None:
        response = api.get(f"/v1/sessions/{session_id}")
        if response.status_code == 404:
            return None  # started, not projected yet
        session = ok(response)
        if session["status"] == "finished":
            return session
        if session["status"] != "paused":
            return None
        waiting = ok(api.get("/v1/approvals"))["approvals"]
        mine = [a for a in waiting if a["session_id"] == session_id]
        if not mine:
            return None  # paused, its approval not projected yet
        approval = mine[0]
        assert approval["mode"] in ("confirm", "escalate"), approval
        # The first move is approved (it runs); after it, a move is rejected, which ends the
        # session, and a STOP is approved, which ends it too.
        approve = not verdicts or approval["move"] == "STOP"
        verdict = {"decision": "approve" if approve else "reject", "note": "test-compose"}
        ok(api.post(f"/v1/approvals/{approval['approval_id']}", json=verdict))
        verdicts.append({**approval, "verdict": verdict["decision"]})
        return None

    session = wait_for(f"session {session_id} finished", settled, DEADLINE_S, every_s=0.5)
    assert verdicts and verdicts[0]["verdict"] == "approve", verdicts
    types = [e["type"] for e in session["events"]]
    assert "session.paused" in types, types
    runs = [e for e in session["events"] if e["type"] == "session.step_run"]
    # The start configuration, then the approved move: both real runs on the agent. The model
    # may say STOP first (it did on a freshly trained quick model): approved, it ends the
    # session after the start's run, and no move is left to run.
    moved = verdicts[0]["move"] != "STOP"
    assert len(runs) >= (2 if moved else 1), (verdicts, runs)
    assert all(r["data"]["runtime_s"] > 0 for r in runs), runs
    decided = ok(api.get("/v1/approvals", params={"status": "decided", "limit": 1000}))
    by_id = {a["approval_id"]: a for a in decided["approvals"]}
    first = by_id[verdicts[0]["approval_id"]]
    assert first["status"] == "approved" and first["decided_by"] == "compose-test", first


def test_a_fleet_task_is_placed_on_the_agent_and_runs(
    api: httpx.Client, device: dict[str, Any]
) -> None:
    task = ok(api.post("/v1/tasks", json={"workload": "gemm", "size": 96}), 201)

    def done() -> dict[str, Any] | None:
        row = ok(api.get(f"/v1/tasks/{task['task_id']}"))
        return row if row["status"] in ("finished", "failed") else None

    row = wait_for(f"task {task['task_id']} done", done, DEADLINE_S, every_s=0.5)
    assert row["status"] == "finished", row
    assert row["placement"]["device_id"] == device["device_id"], row
    assert row["result"]["device_id"] == device["device_id"]
    assert row["result"]["runtime_s"] > 0
