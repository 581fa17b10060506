"""Cancelling a session over HTTP (issue 44, item 4), end to end with real NATS, Postgres and a
real MPI launch: a session whose step runs for minutes shows its run in flight (run.heartbeat)
in GET /v1/sessions/{id}; an engineer cancels it, the cancel.requested event names them, the
coordinator has the agent kill the launch's whole process group (every rank and its launcher's
proxy gone, read from /proc) and the session finishes `interrupted`, saying who. A viewer or
an agent may not cancel; bad ids and bodies are a 4xx saying what is accepted; a second cancel,
or one of a finished session, is a 409 saying why."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpc_ds1.services.gateway import create_app
from hpc_ds1.settings import Settings
from hpc_ds1.stack import Stack, open_stack
from hpc_ds1.workloads import register, unregister
from tests.support.gateway import grant
from tests.support.sleeper import alive, rank_pids, sleeper
from tests.support.waiting import until

ROLES = ("viewer", "engineer", "agent")


@pytest.fixture
async def served(
    tmp_path: Path, settings: Settings
) -> AsyncIterator[tuple[Stack, httpx.AsyncClient, dict[str, dict[str, str]], Path, str]]:
    """A stack (projector, agent, coordinator) with heartbeats every 0.3 s, the gateway in
    process, a token per role, and a sleeper workload of 2 real MPI ranks (its pids in a
    folder)."""
    fast = settings.model_copy(update={"run_heartbeat_s": 0.3})
    pids = tmp_path / "pids"
    pids.mkdir()
    wl = sleeper(tmp_path, pids, "repeats = 1")
    register(wl, replace=True)
    try:
        async with open_stack(fast, ("projector", "agent", "coordinator"), "test-cancel") as stack:
            await stack.local_device()
            tokens = {r: await grant(stack, r, f"{r}-holder") for r in ROLES}
            await stack.caught_up()
            headers = {r: {"Authorization": f"Bearer {t}"} for r, t in tokens.items()}
            transport = httpx.ASGITransport(app=create_app(fast, stack.bus, stack.engine))
            async with httpx.AsyncClient(
                transport=transport, base_url="http://gw", timeout=30
            ) as http:
                yield stack, http, headers, pids, wl.name
    finally:
        unregister(wl.name)


async def session(http: httpx.AsyncClient, as_: dict[str, str], session_id: str) -> dict[str, Any]:
    reply = await http.get(f"/v1/sessions/{session_id}", headers=as_)
    return reply.json() if reply.status_code == 200 else {}


async def test_an_engineer_cancels_a_long_run_its_process_group_dies_and_who_is_recorded(
    served: tuple[Stack, httpx.AsyncClient, dict[str, dict[str, str]], Path, str],
) -> None:
    stack, http, as_, pids, workload = served
    job = {"workload": workload, "size": 600, "start": {"ranks": 2, "threads": 1}}
    started = await http.post("/v1/sessions", json=job, headers=as_["engineer"])
    assert started.status_code == 201, started.text
    session_id = started.json()["session_id"]
    every = await asyncio.to_thread(rank_pids, pids, 2)  # the ranks and their proxies
    assert all(alive(pid) for pid in every)

    # The run in flight, from its heartbeats: what runs and for how long.
    async def in_flight() -> dict[str, Any] | None:
        running: dict[str, Any] | None = (await session(http, as_["viewer"], session_id)).get(
            "running"
        )
        return running if running and running["beat"] >= 2 else None

    running = await until("the session's run in flight", in_flight, 60)
    assert running["workload"] == workload and running["size"] == 600
    assert running["config"]["ranks"] == 2 and running["elapsed_s"] >= 0.6
    assert running["session_id"] == session_id and running["purpose"] == "tune"

    # Who may cancel, and what is accepted.
    url = f"/v1/sessions/{session_id}/cancel"
    for role in ("viewer", "agent"):
        refused = await http.post(url, json={}, headers=as_[role])
        assert refused.status_code == 403, (role, refused.text)
    assert (await http.post(url, json={})).status_code == 401
    for bad, words in (
        ({"reason": "a\x00b"}, "control characters"),
        ({"reason": "r" * 2001}, "2000"),
        ({"why": "x"}, "why"),
    ):
        reply = await http.post(url, json=bad, headers=as_["engineer"])
        assert reply.status_code == 422 and words in reply.text, (bad, reply.text)
    odd = await http.post("/v1/sessions/not.an.id/cancel", headers=as_["engineer"])
    assert odd.status_code == 422 and "path.session_id" in odd.text, odd.text
    assert "A-Za-z0-9_" in odd.text  # the pattern accepted
    unknown = await http.post("/v1/sessions/no-such-session/cancel", headers=as_["engineer"])
    assert unknown.status_code == 404 and "no session no-such-session" in unknown.text
    assert all(alive(pid) for pid in every)  # nothing above touched the run

    cancelled = await http.post(url, json={"reason": "too long"}, headers=as_["engineer"])
    assert cancelled.status_code == 202, cancelled.text
    assert cancelled.json()["by"] == "engineer-holder"
    assert cancelled.json()["role"] == "engineer" and cancelled.json()["reason"] == "too long"

    # The whole process group dies: every rank and the launcher's proxies.
    def gone() -> bool:
        return not any(alive(pid) for pid in every)

    await until("the ranks killed", gone, 20)

    async def finished() -> dict[str, Any] | None:
        found = await session(http, as_["viewer"], session_id)
        return found if found.get("status") == "finished" and found.get("cancel") else None

    done = await until("the session finished", finished, 60)
    assert done["finish_reason"] == "interrupted", done
    assert done["detail"] == "cancelled by engineer-holder (engineer): too long", done
    assert done["real_runs"] == 0 and done["running"] is None
    assert not [e for e in done["events"] if e["type"] == "session.step_run"]  # no killed step
    assert done["cancel"]["by"] == "engineer-holder" and done["cancel"]["role"] == "engineer"

    # The audit: one cancel.requested, its actor the engineer.
    history = await stack.bus.history("cancel", session_id)
    assert [(env.type, env.actor, env.source) for _, env in history] == [
        ("cancel.requested", "engineer-holder", "cancels")
    ]
    again = await http.post(url, headers=as_["engineer"])
    assert again.status_code == 409 and "already finished (interrupted)" in again.text, again.text
