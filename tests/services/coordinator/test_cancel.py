"""A cancel reaches a session wherever it stands (issue 44, item 4), with real NATS and Postgres:
a session paused on a move waiting for an engineer stops waiting and finishes `interrupted` at
once, naming who cancelled; a session cancelled while no coordinator drove it finishes so when
one resumes it, without running anything. (A run in flight killed: tests/services/gateway/api/
test_cancel_sessions.py and tests/cli/test_cancel.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.audit import AuditFile
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import (
    ApprovalDecided,
    ApprovalRequested,
    ApprovalWithdrawn,
    DeviceRegistered,
    Event,
    SessionFinished,
    SessionMoveDecided,
    SessionPaused,
    SessionStarted,
    SessionStepRun,
    envelope,
    typed,
)
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.security.approvals import ApprovalError, decide_approval, withdraw_approval
from hpc_ds1.security.cancels import CancelError, cancel_session, cancel_subject
from hpc_ds1.services.coordinator import Coordinator
from hpc_ds1.services.projector import project
from hpc_ds1.settings import Settings
from tests.services.coordinator.device import DEVICE, FINGERPRINT, START
from tests.support.waiting import until


def paused(session_id: str) -> list[Event]:
    """A session whose baseline ran and whose first move waits for an engineer."""
    return [
        SessionStarted(
            session_id=session_id, device_id=DEVICE, workload="gemm", size=256, start=START
        ),
        SessionStepRun(session_id=session_id, step=0, config=START, status="ok", runtime_s=0.5),
        SessionMoveDecided(
            session_id=session_id,
            step=1,
            decision_id="d-1",
            move="ADD_RANK",
            confidence=0.6,
            mode="confirm",
            config=START,
        ),
        SessionPaused(session_id=session_id, step=1, approval_id=f"a-{session_id}"),
    ]


@pytest.fixture
async def coordinator(
    settings: Settings, engine: Engine, bus: EventBus
) -> AsyncIterator[Coordinator]:
    """A coordinator taking cancels (no agent: nothing runs), its sessions' runners stopped
    after."""
    assert settings.nats_url and settings.database_url
    device = DeviceRegistered(device_id=DEVICE, hostname="node", fingerprint=FINGERPRINT)
    await publish(bus, [device])
    stored = [e async for chunk in bus.replay() for e in chunk]
    project(engine, stored, AuditFile(settings.audit_path))  # the device, for its space
    stop = asyncio.Event()
    ctx = ServiceContext(
        "coordinator", settings, settings.nats_url, settings.database_url, bus, engine, stop
    )
    coord = Coordinator(ctx)
    sub = await bus.nc.subscribe(cancel_subject(bus.prefix, "*"), cb=coord.handle_cancel)
    try:
        yield coord
    finally:
        await sub.unsubscribe()
        stop.set()
        for task in list(coord.tasks.values()):
            task.cancel()
        await asyncio.gather(*coord.tasks.values(), return_exceptions=True)


async def finished(bus: EventBus, session_id: str) -> SessionFinished:
    async def look() -> SessionFinished | None:
        for _, env in await bus.history("session", session_id):
            event = typed(env)
            if isinstance(event, SessionFinished):
                return event
        return None

    found: SessionFinished = await until(f"session {session_id} finished", look, 30)
    return found


async def publish(bus: EventBus, events: list[Any], actor: str = "tester") -> None:
    for event in events:
        await bus.publish(envelope(event, actor=actor, source="test", prefix=bus.prefix))


async def test_a_paused_session_stops_waiting_when_cancelled(
    coordinator: Coordinator, bus: EventBus
) -> None:
    await publish(bus, paused("s-paused"))
    assert await coordinator.resume_unfinished() == 1
    await asyncio.sleep(0.5)  # it waits for the engineer now
    assert "s-paused" in coordinator.tasks
    await cancel_session(bus, "s-paused", "erin", "engineer", "not needed")
    done = await finished(bus, "s-paused")
    assert done.reason == "interrupted"
    assert done.detail == "cancelled by erin (engineer): not needed"
    assert done.real_runs == 1 and done.best_runtime_s == 0.5
    await until("its runner gone", lambda: "s-paused" not in coordinator.tasks, 10)
    with pytest.raises(CancelError) as again:
        await cancel_session(bus, "s-paused", "erin", "engineer")
    assert again.value.status == 409 and "already finished (interrupted)" in str(again.value)


def requested(session_id: str) -> ApprovalRequested:
    return ApprovalRequested(
        approval_id=f"a-{session_id}",
        session_id=session_id,
        decision_id="d-1",
        device_id=DEVICE,
        workload="gemm",
        size=256,
        config=START,
        move="ADD_RANK",
        confidence=0.6,
        mode="confirm",
    )


async def test_the_move_a_cancelled_session_waited_on_is_withdrawn_not_left_waiting(
    coordinator: Coordinator, bus: EventBus, engine: Engine, settings: Settings
) -> None:
    await publish(bus, [*paused("s-queue")[:-1], requested("s-queue"), paused("s-queue")[-1]])
    assert await coordinator.resume_unfinished() == 1
    await until("it waits for the engineer", lambda: "s-queue" in coordinator.tasks, 10)
    await cancel_session(bus, "s-queue", "erin", "engineer")
    await finished(bus, "s-queue")
    history = [typed(env) for _, env in await bus.history("approval", "a-s-queue")]
    withdrawn = [e for e in history if isinstance(e, ApprovalWithdrawn)]
    assert [(w.session_id, w.decision_id, w.reason) for w in withdrawn] == [
        ("s-queue", "d-1", "session cancelled by erin")
    ]
    with pytest.raises(ApprovalError) as late:
        await decide_approval(bus, "a-s-queue", True, "bob", "engineer")
    assert late.value.status == 409 and "withdrawn: session cancelled by erin" in str(late.value)
    # the projection's queue no longer holds it
    stored = [e async for chunk in bus.replay() for e in chunk]
    project(engine, stored, AuditFile(settings.audit_path))
    with engine.connect() as conn:
        row = conn.execute(
            select(tables.approvals).where(tables.approvals.c.approval_id == "a-s-queue")
        ).one()
    assert (row.status, row.note) == ("withdrawn", "session cancelled by erin")


async def test_a_verdict_given_first_stands_and_nothing_is_withdrawn_twice(bus: EventBus) -> None:
    await publish(bus, [requested("s-race")])
    await decide_approval(bus, "a-s-race", False, "bob", "engineer")
    assert await withdraw_approval(bus, "a-s-race", "late", "erin") is None
    await publish(bus, [requested("s-twice")])
    assert await withdraw_approval(bus, "a-s-twice", "first", "erin") is not None
    assert await withdraw_approval(bus, "a-s-twice", "second", "erin") is None
    assert await withdraw_approval(bus, "a-unknown", "none", "erin") is None
    kinds = [env.type for _, env in await bus.history("approval", "a-s-race")]
    assert kinds == ["approval.requested", "approval.decided"]
    decided = [typed(env) for _, env in await bus.history("approval", "a-s-race")][-1]
    assert isinstance(decided, ApprovalDecided) and decided.by == "bob"


async def test_a_cancel_made_while_no_coordinator_drove_it_ends_it_on_resume(
    coordinator: Coordinator, bus: EventBus
) -> None:
    await publish(bus, paused("s-later"))
    await cancel_session(bus, "s-later", "ann", "admin")
    with pytest.raises(CancelError) as twice:
        await cancel_session(bus, "s-later", "bob", "engineer")
    assert twice.value.status == 409 and "already cancelled by ann" in str(twice.value)
    assert await coordinator.resume_unfinished() == 1
    done = await finished(bus, "s-later")
    assert (done.reason, done.detail) == ("interrupted", "cancelled by ann (admin)")
    cancels = await bus.history("cancel", "s-later")
    assert [(env.actor, env.data["by"], env.data["role"]) for _, env in cancels] == [
        ("ann", "ann", "admin")
    ]


async def test_cancel_refuses_what_is_not_a_session_it_can_stop(bus: EventBus) -> None:
    for session_id, status, words in (
        ("a.b", 422, "letters, digits"),
        ("no-such", 404, "no session no-such"),
    ):
        with pytest.raises(CancelError) as refused:
            await cancel_session(bus, session_id, "erin", "engineer")
        assert refused.value.status == status and words in str(refused.value)
