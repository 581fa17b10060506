"""The agent's side of a session's cancel (issue 44, item 4), with real NATS and real MPI ranks:
the cancelled session's run in flight is killed, its whole process group (read from /proc); its
run still queued never starts; another session's run, queued behind, runs as asked; a cancel
naming a session with no run kills nothing; a malformed cancel is a 422 saying why."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from hpc_ds1.eventlog.subjects import agent_cancel_subject, agent_run_subject
from hpc_ds1.requests import CancelRunRequest, RunRequest
from hpc_ds1.settings import Settings
from hpc_ds1.stack import Stack, open_stack
from hpc_ds1.workloads import register, unregister
from tests.support.sleeper import alive, rank_pids, sleeper
from tests.support.waiting import until

CONFIG = {"ranks": 2, "threads": 1, "tile": 1}


@pytest.fixture
async def agent(tmp_path: Path, settings: Settings) -> AsyncIterator[tuple[Stack, str, str]]:
    wl = sleeper(tmp_path, tmp_path, "repeats = 1")
    register(wl, replace=True)
    try:
        async with open_stack(settings, ("projector", "agent"), "test-agent-cancel") as stack:
            yield stack, await stack.local_device(), wl.name
    finally:
        unregister(wl.name)


def none_alive(pids: list[int]) -> bool:
    return not any(alive(pid) for pid in pids)


async def test_a_cancelled_sessions_runs_die_or_never_start_and_others_run(
    agent: tuple[Stack, str, str], settings: Settings, tmp_path: Path
) -> None:
    stack, device_id, workload = agent
    nc = stack.bus.nc
    run_subject = agent_run_subject(settings, device_id)
    cancel_subject = agent_cancel_subject(settings, device_id)

    def ask(session_id: str, size: int) -> bytes:
        request = RunRequest(
            workload=workload, size=size, config=CONFIG, repeats=1, session_id=session_id
        )
        return request.model_dump_json().encode()

    async def reply_to(session_id: str, size: int) -> dict[str, Any]:
        answer = await nc.request(run_subject, ask(session_id, size), timeout=120)
        found: dict[str, Any] = orjson.loads(answer.data)
        return found

    async def cancel(body: bytes) -> dict[str, Any]:
        found: dict[str, Any] = orjson.loads((await nc.request(cancel_subject, body, 10)).data)
        return found

    long = asyncio.create_task(reply_to("s-long", 600))
    every = await asyncio.to_thread(rank_pids, tmp_path, 2)
    queued = asyncio.create_task(reply_to("s-long", 600))  # the same session's next run
    other = asyncio.create_task(reply_to("s-other", 1))  # another session's, queued behind
    await asyncio.sleep(0.5)  # both are queued behind the run in flight

    nothing = CancelRunRequest(session_id="s-idle", by="erin").model_dump_json().encode()
    assert await cancel(nothing) == {"ok": True, "killed": False}
    assert all(alive(pid) for pid in every)
    bad = await cancel(b'{"session_id": "a.b", "by": "erin"}')
    assert not bad["ok"] and bad["status"] == 422 and "session_id" in bad["error"], bad

    asked = CancelRunRequest(session_id="s-long", by="erin").model_dump_json().encode()
    assert await cancel(asked) == {"ok": True, "killed": True}
    await until("the ranks killed", functools.partial(none_alive, every), 20)
    killed = await asyncio.wait_for(long, 30)
    assert not killed["ok"] and killed["status"] == 409, killed
    assert killed["error"] == (
        "session s-long was cancelled by erin: its run was killed (the whole process group)"
    )
    never = await asyncio.wait_for(queued, 30)
    assert never["status"] == 409 and never["error"].endswith("its run did not start"), never
    ran = await asyncio.wait_for(other, 120)
    assert ran["ok"] and ran["result"]["status"] == "ok", ran
