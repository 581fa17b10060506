"""Tuning sessions for real: every step a real run, moves applied or approved, restarts survived."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx
import orjson
from sqlalchemy import select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.audit import verify
from hpc_ds1.eventlog.subjects import start_session_subject
from hpc_ds1.events import TokenCreated, envelope, new_id
from hpc_ds1.infra.ports import free_port
from hpc_ds1.security.approvals import ApprovalError, decide_approval
from hpc_ds1.security.tokens import new_token, token_hash
from hpc_ds1.settings import Settings
from hpc_ds1.stack import Stack, open_stack
from tests.support.waiting import until

SERVICES = ("projector", "agent", "decision", "coordinator", "gateway")
START = {"ranks": 1, "threads": 1, "tile": 32}


async def start(stack: Stack, size: int = 288, start: dict | None = None) -> str:
    body = {"workload": "gemm", "size": size, "start": start or START, "session_id": new_id()}
    reply = orjson.loads(
        (
            await stack.bus.nc.request(
                start_session_subject(stack.settings),
                orjson.dumps(body),
                timeout=30,
                headers={"Hpc-Actor": "tester"},
            )
        ).data
    )
    assert reply["ok"], reply
    return str(reply["session_id"])


def session_row(stack: Stack, session_id: str) -> dict[str, Any] | None:
    with stack.engine.connect() as conn:
        row = (
            conn.execute(select(tables.sessions).where(tables.sessions.c.session_id == session_id))
            .mappings()
            .first()
        )
    return dict(row) if row else None


async def wait_for(stack: Stack, session_id: str, status: str, within_s: float = 300) -> dict:
    async def row() -> dict | None:
        found = await asyncio.to_thread(session_row, stack, session_id)
        return found if found and found["status"] == status else None

    reached: dict = await until(f"session {session_id} {status}", row, within_s, every_s=0.2)
    return reached


async def waiting_approval(stack: Stack, session_id: str) -> dict[str, Any]:
    await wait_for(stack, session_id, "paused")
    await stack.caught_up()
    with stack.engine.connect() as conn:
        row = (
            conn.execute(
                select(tables.approvals).where(
                    tables.approvals.c.session_id == session_id,
                    tables.approvals.c.status == "waiting",
                )
            )
            .mappings()
            .one()
        )
    return dict(row)


def session_events(stack: Stack, session_id: str) -> list[dict[str, Any]]:
    e = tables.events
    with stack.engine.connect() as conn:
        rows = conn.execute(
            select(e.c.type, e.c.data)
            .where(e.c.subject.startswith(f"{stack.settings.subject_prefix}.session.{session_id}."))
            .order_by(e.c.seq)
        ).all()
    return [{"type": t, **d} for t, d in rows]


async def test_an_automatic_session_reaches_a_config_at_least_as_fast_as_its_start(
    e2e_settings: Settings, trained: dict
) -> None:
    # every decision runs alone: no confidence threshold, and no discrimination floor
    settings = e2e_settings.model_copy(
        update={"auto_threshold": 0.0, "min_auroc": 0.0, "port": free_port()}
    )
    async with open_stack(settings, SERVICES, "e2e-tune") as stack:
        await stack.local_device()
        session_id = await start(stack)
        done = await wait_for(stack, session_id, "finished")
        await stack.caught_up()
        events = session_events(stack, session_id)
        runs = [e for e in events if e["type"] == "session.step_run"]
        with stack.engine.connect() as conn:
            measured = dict(
                conn.execute(
                    select(
                        tables.measurements.c.measurement_id, tables.measurements.c.runtime_s
                    ).where(tables.measurements.c.purpose == "tune")
                ).all()
            )
            decisions = conn.execute(
                select(tables.decisions.c.decision_id, tables.decisions.c.approved_by).where(
                    tables.decisions.c.session_id == session_id
                )
            ).all()
    assert done["finish_reason"] in ("stop", "two_misses", "no_moves"), done
    kept = [e for e in events if e["type"] == "session.move_resolved" and e["kept"]]
    # the keep rule (runner/keep.py), and a PICK kept on a tie (domain.keeps_a_tied_pick)
    tied_picks = [e for e in kept if e["p_faster"] < 0.9]
    assert all(e["move"] == "PICK" and e["within_noise"] for e in tied_picks)
    if not any(r.get("race") for r in runs) and not tied_picks:
        # one run each: a kept move was faster than the best; after a race, the best is the
        # mean of its runs, and a tied PICK's run, either may sit above the start's single run
        assert done["best_runtime_s"] <= done["start_runtime_s"]
    assert done["real_runs"] == len(runs) >= 1
    # Every runtime the session saw is a real run recorded as a measurement.
    assert all(measured[r["measurement_id"]] == r["runtime_s"] for r in runs)
    decided = [e for e in events if e["type"] == "session.move_decided"]
    assert {d["decision_id"] for d in decided} <= {d for d, _ in decisions}
    assert all(by == "auto" for _, by in decisions)
    assert [r["step"] for r in runs] == list(range(len(runs)))
    lines = [json.loads(x) for x in settings.audit_path.read_text().splitlines()]
    logged = [
        x["data"]["decision_id"]
        for x in lines
        if x.get("type") == "decision.made" and x["data"].get("session_id") == session_id
    ]
    assert sorted(logged) == sorted(d for d, _ in decisions)
    assert verify(settings.audit_path).intact


def waiting_rows(stack: Stack, session_id: str) -> list[dict[str, Any]]:
    t = tables.approvals
    with stack.engine.connect() as conn:
        rows = (
            conn.execute(select(t).where(t.c.session_id == session_id, t.c.status == "waiting"))
            .mappings()
            .all()
        )
    return [dict(r) for r in rows]


async def next_approval(
    stack: Stack, session_id: str, answered: set[str] | None = None
) -> dict[str, Any] | None:
    """The session's next waiting approval not yet answered, or None once it has finished."""
    for _ in range(1500):
        waiting = await asyncio.to_thread(waiting_rows, stack, session_id)
        waiting = [w for w in waiting if w["approval_id"] not in (answered or set())]
        if waiting:
            (answered if answered is not None else set()).add(waiting[0]["approval_id"])
            return waiting[0]
        row = await asyncio.to_thread(session_row, stack, session_id)
        if row and row["status"] == "finished":
            return None
        await asyncio.sleep(0.2)
    raise AssertionError(f"session {session_id} neither paused nor finished")


async def test_approve_then_reject_ends_at_the_last_good_configuration(
    e2e_settings: Settings, trained: dict
) -> None:
    # Every decision needs an engineer: confidence can never reach auto. A doubtful STOP is
    # rejected (go on), the first real move approved, the next real move rejected.
    settings = e2e_settings.model_copy(
        update={"auto_threshold": 1.01, "escalate_threshold": 0.0, "port": free_port()}
    )
    viewer, engineer = new_token(), new_token()
    async with open_stack(settings, SERVICES, "e2e-tune") as stack:
        await stack.local_device()
        for holder, role, token in (("vic", "viewer", viewer), ("eve", "engineer", engineer)):
            await stack.bus.publish(
                envelope(
                    TokenCreated(
                        token_id=new_id(), holder=holder, role=role, sha256=token_hash(token)
                    ),
                    actor="admin",
                    source="test",
                    prefix=settings.subject_prefix,
                )
            )
        session_id = await start(stack)
        url = f"http://127.0.0.1:{settings.port}"
        as_engineer = {"Authorization": f"Bearer {engineer}"}
        approved_move: dict[str, Any] | None = None
        rejected_move: dict[str, Any] | None = None
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            seen: set[str] = set()
            first = await next_approval(stack, session_id, seen)
            assert first is not None
            assert (await http.get("/v1/approvals")).status_code == 401
            listed = (
                await http.get("/v1/approvals", headers={"Authorization": f"Bearer {viewer}"})
            ).json()["approvals"]
            assert [a["approval_id"] for a in listed] == [first["approval_id"]]
            assert listed[0]["move"] and listed[0]["confidence"] < 1.01
            denied = await http.post(
                f"/v1/approvals/{first['approval_id']}",
                json={"decision": "approve"},
                headers={"Authorization": f"Bearer {viewer}"},
            )
            assert denied.status_code == 403
            missing = await http.post(
                "/v1/approvals/nope", json={"decision": "reject"}, headers=as_engineer
            )
            assert missing.status_code == 404
            pending: dict[str, Any] | None = first
            while pending is not None and rejected_move is None:
                real = pending["move"] != "STOP"
                verdict = "approve" if real and approved_move is None else "reject"
                reply = await http.post(
                    f"/v1/approvals/{pending['approval_id']}",
                    json={"decision": verdict, "note": "checked"},
                    headers=as_engineer,
                )
                assert reply.status_code == 200, reply.text
                again = await http.post(
                    f"/v1/approvals/{pending['approval_id']}",
                    json={"decision": verdict},
                    headers=as_engineer,
                )
                assert again.status_code == 409 and "already" in again.text
                if real and verdict == "approve":
                    approved_move = pending
                elif real:
                    rejected_move = pending
                    before = await asyncio.to_thread(session_row, stack, session_id)
                pending = await next_approval(stack, session_id, seen)
        done = await wait_for(stack, session_id, "finished")
        await stack.caught_up()
        with stack.engine.connect() as conn:
            verdicts = dict(
                conn.execute(
                    select(tables.decisions.c.decision_id, tables.decisions.c.approved_by).where(
                        tables.decisions.c.session_id == session_id
                    )
                ).all()
            )
    assert approved_move is not None, "the model proposed no move at all"
    assert verdicts[approved_move["decision_id"]] == "eve"
    if rejected_move is not None:
        assert done["finish_reason"] == "rejected" and "eve rejected" in done["detail"]
        assert done["best_config"] == before["best_config"]
    else:  # every move from the best configuration got tried first
        assert done["finish_reason"] == "no_moves"


async def test_a_coordinator_restart_mid_session_loses_and_duplicates_nothing(
    e2e_settings: Settings, trained: dict
) -> None:
    settings = e2e_settings.model_copy(
        update={"auto_threshold": 1.01, "escalate_threshold": 0.0, "port": free_port()}
    )
    async with open_stack(settings, SERVICES, "e2e-tune") as stack:
        await stack.local_device()
        session_id = await start(stack)
        seen: set[str] = set()
        waiting = await next_approval(stack, session_id, seen)
        assert waiting is not None
    # Everything stopped while the session waited. A new coordinator picks it up from the log.
    async with open_stack(settings, SERVICES, "e2e-tune") as stack:
        pending: dict[str, Any] | None = waiting
        answered = 0
        while pending is not None:
            # Go on past a doubtful STOP once, approve one real move, then reject.
            go_on = pending["move"] == "STOP" or answered == 0
            await decide_approval(
                stack.bus,
                pending["approval_id"],
                pending["move"] != "STOP" and answered == 0,
                "eve",
                "engineer",
            )
            if not go_on:
                break
            answered += pending["move"] != "STOP"
            with contextlib.suppress(ApprovalError):
                await decide_approval(stack.bus, pending["approval_id"], True, "eve", "engineer")
            pending = await next_approval(stack, session_id, seen)
        done = await wait_for(stack, session_id, "finished")
        await stack.caught_up()
        events = session_events(stack, session_id)
    steps = [e["step"] for e in events if e["type"] == "session.step_run"]
    assert steps == list(range(len(steps)))
    assert [e["type"] for e in events].count("session.started") == 1
    assert [e["type"] for e in events].count("session.finished") == 1
    assert done["real_runs"] == len(steps) >= 1
