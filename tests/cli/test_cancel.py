"""`hpc-ds1 cancel SESSION_ID` (issue 44, item 4) against a real stack (projector, agent,
coordinator) running real sessions whose first step is a sleeper of two real MPI ranks: on this
home's log (as this user) and through a gateway with --server and an engineer's token (as the
token's holder). Each cancel kills the step's whole process group (read from /proc) and the
session finishes `interrupted`, naming who; a second cancel fails (1), an unknown session or a
bad id is a usage error (2), each saying why."""

from __future__ import annotations

import asyncio
import functools
import getpass
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.subjects import start_session_subject
from hpc_ds1.settings import Settings
from hpc_ds1.stack import Stack, open_stack
from hpc_ds1.workloads import register, unregister
from tests.support.commands import hpc
from tests.support.gateway import gateway_served, grant
from tests.support.sleeper import alive, rank_pids, sleeper
from tests.support.waiting import until


@pytest.fixture
async def served(tmp_path: Path, settings: Settings) -> AsyncIterator[tuple[Stack, str, str, str]]:
    """The stack, a gateway on a loopback socket, an engineer's token and the sleeper's name."""
    wl = sleeper(tmp_path, tmp_path, "repeats = 1")
    register(wl, replace=True)
    try:
        async with open_stack(settings, ("projector", "agent", "coordinator"), "test-cli") as stack:
            await stack.local_device()
            token = await grant(stack, "engineer", "erin")
            await stack.caught_up()
            async with gateway_served(settings, stack) as base:
                yield stack, base, token, wl.name
    finally:
        unregister(wl.name)


async def start(stack: Stack, workload: str, pids: Path) -> tuple[str, list[int]]:
    """A session of the sleeper (2 ranks, 600 s), once its ranks run: its id and their pids."""
    body = {"workload": workload, "size": 600, "start": {"ranks": 2, "threads": 1}}
    reply = await stack.bus.nc.request(
        start_session_subject(stack.settings),
        orjson.dumps(body),
        timeout=30,
        headers={"Hpc-Actor": "tester"},
    )
    answer = orjson.loads(reply.data)
    assert answer["ok"], answer
    return answer["session_id"], await asyncio.to_thread(rank_pids, pids, 2)


def clear(folder: Path) -> None:
    for old in folder.glob("rank-*.pid"):
        old.unlink()


def none_alive(pids: list[int]) -> bool:
    return not any(alive(pid) for pid in pids)


async def ended(stack: Stack, session_id: str) -> dict[str, Any]:
    def row() -> dict[str, Any] | None:
        t = tables.sessions
        with stack.engine.connect() as conn:
            found = conn.execute(select(t).where(t.c.session_id == session_id)).mappings().first()
        return dict(found) if found and found["status"] == "finished" else None

    done: dict[str, Any] = await until(f"session {session_id} finished", row, 60)
    return done


async def test_cancel_from_the_cli_kills_the_run_and_names_who(
    tmp_path: Path, settings: Settings, served: tuple[Stack, str, str, str]
) -> None:
    stack, url, token, workload = served
    for how in ("server", "home"):
        await asyncio.to_thread(clear, tmp_path)
        session_id, every = await start(stack, workload, tmp_path)
        assert all(alive(pid) for pid in every)
        via = ("--server", url, "--token", token) if how == "server" else ()
        done = await hpc(settings, "cancel", session_id, "--reason", "lunch", "--json", *via)
        assert done.returncode == 0, done.stdout + done.stderr
        said = json.loads(done.stdout)
        who = "erin" if how == "server" else getpass.getuser()
        assert (said["session_id"], said["by"], said["reason"]) == (session_id, who, "lunch")
        await until("the ranks killed", functools.partial(none_alive, every), 20)
        row = await ended(stack, session_id)
        assert row["finish_reason"] == "interrupted", row
        assert row["detail"] == f"cancelled by {who} (engineer): lunch", row
        history = await stack.bus.history("cancel", session_id)
        assert [env.actor for _, env in history] == [who]

        again = await hpc(settings, "cancel", session_id, *via)
        assert again.returncode == 1, again.stdout + again.stderr
        assert "already finished (interrupted)" in again.stderr, again.stderr

    unknown = await hpc(settings, "cancel", "no-such-session")
    assert unknown.returncode == 2 and "no session no-such-session" in unknown.stderr
    odd = await hpc(settings, "cancel", "a.b", "--server", url, "--token", token)
    assert odd.returncode == 2 and "letters, digits" in odd.stderr, odd.stderr
