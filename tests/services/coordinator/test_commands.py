"""The coordinator over real NATS and Postgres: every start request gets a reply (409 for an id
already taken), and an approval request and its pause always end up together."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.audit import AuditFile
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import start_session_subject
from hpc_ds1.events import (
    ApprovalRequested,
    DeviceRegistered,
    Event,
    SessionMoveDecided,
    SessionPaused,
    SessionStarted,
    SessionStepRun,
    envelope,
)
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.security.approvals import ApprovalError, decide_approval
from hpc_ds1.services.coordinator import Coordinator
from hpc_ds1.services.coordinator.sessions import SessionRunner, approval_id_for
from hpc_ds1.services.projector import project
from hpc_ds1.settings import Settings
from hpc_ds1.space import ConfigSpace

from .device import DEVICE, FINGERPRINT, START


@pytest.fixture
async def ctx(settings: Settings, engine: Engine, bus: EventBus) -> AsyncIterator[ServiceContext]:
    assert settings.nats_url and settings.database_url
    stop = asyncio.Event()
    yield ServiceContext(
        "coordinator", settings, settings.nats_url, settings.database_url, bus, engine, stop
    )
    stop.set()


async def publish(bus: EventBus, event: Event) -> int:
    return await bus.publish(envelope(event, actor="tester", source="test", prefix=bus.prefix))


async def project_all(bus: EventBus, engine: Engine, settings: Settings) -> None:
    events = [e async for chunk in bus.replay() for e in chunk]
    await asyncio.to_thread(project, engine, events, AuditFile(settings.audit_path))


async def test_a_second_start_with_the_same_id_is_409_at_once(
    ctx: ServiceContext, settings: Settings, engine: Engine, bus: EventBus
) -> None:
    await publish(
        bus,
        DeviceRegistered(device_id=DEVICE, hostname="node", fingerprint=FINGERPRINT, local=True),
    )
    await project_all(bus, engine, settings)
    coordinator = Coordinator(ctx)
    sub = await bus.nc.subscribe(start_session_subject(settings), cb=coordinator.handle_start)

    async def ask(body: dict[str, Any]) -> dict[str, Any]:
        reply = await bus.nc.request(
            start_session_subject(settings),
            orjson.dumps(body),
            timeout=10,
            headers={"Hpc-Actor": "tester"},
        )
        answer: dict[str, Any] = orjson.loads(reply.data)
        return answer

    body = {"workload": "gemm", "size": 256, "start": START, "session_id": "session-dup"}
    try:
        first = await ask(body)
        assert first["ok"] is True and first["session_id"] == "session-dup", first
        second = await ask(body)
        assert second == {"ok": False, "status": 409, "error": "session session-dup already exists"}
        unknown = await ask({**body, "session_id": "session-other", "device_id": "nope"})
        assert unknown["ok"] is False and unknown["status"] == 404
    finally:
        await sub.unsubscribe()
        for task in list(coordinator.tasks.values()):
            task.cancel()
        await asyncio.gather(*coordinator.tasks.values(), return_exceptions=True)
    started = [e for _, e in await bus.history("session", "session-dup")]
    assert [e.type for e in started] == ["session.started"]


async def test_a_request_without_its_pause_is_completed_once_after_a_crash(
    ctx: ServiceContext, settings: Settings, engine: Engine, bus: EventBus
) -> None:
    sid = "s-crash"
    await publish(
        bus,
        SessionStarted(session_id=sid, device_id=DEVICE, workload="gemm", size=256, start=START),
    )
    await publish(
        bus, SessionStepRun(session_id=sid, step=0, config=START, status="ok", runtime_s=1.0)
    )
    await publish(
        bus,
        SessionMoveDecided(
            session_id=sid,
            step=1,
            decision_id="d1",
            move="THREADS_UP",
            confidence=0.6,
            mode="confirm",
            reasons=["confidence 0.60"],
            config=START,
        ),
    )
    # A message on the session's subjects that is no event: kept in the log, in no one's way.
    garbage = await bus.js.publish(f"{bus.prefix}.session.{sid}.noise", b"{", stream=bus.stream)
    approval_id = approval_id_for(sid, 1, "d1")
    # The coordinator appended the request, then died before the pause.
    await publish(
        bus,
        ApprovalRequested(
            approval_id=approval_id,
            session_id=sid,
            decision_id="d1",
            device_id=DEVICE,
            workload="gemm",
            size=256,
            config=START,
            move="THREADS_UP",
            confidence=0.6,
            mode="confirm",
            reasons=["confidence 0.60"],
        ),
    )
    space = ConfigSpace(ranks=(1, 2), threads=(1, 2), tiles=(32, 64), max_workers=2)
    runner = SessionRunner(ctx, sid, "tester", space)
    state = await runner.load()
    assert state.version == garbage.seq and state.awaiting is None and state.pending is not None
    await runner.step()  # the restarted coordinator: request again, then pause
    assert runner.state.status == "paused" and runner.state.awaiting == approval_id
    again = SessionRunner(ctx, sid, "tester", space)
    assert (await again.load()).awaiting == approval_id

    requests = [e for _, e in await bus.history("approval", approval_id)]
    assert [e.type for e in requests] == ["approval.requested"]
    events, _ = await again.history("session", sid)
    paused = [e for _, e in events if isinstance(e, SessionPaused)]
    assert [p.approval_id for p in paused] == [approval_id]
    await project_all(bus, engine, settings)
    with engine.connect() as conn:
        rows = conn.execute(select(tables.approvals.c.approval_id, tables.approvals.c.status))
        assert [tuple(r) for r in rows] == [(approval_id, "waiting")]
        status = conn.execute(select(tables.sessions.c.status)).scalar_one()
    assert status == "paused"

    # Deciding it: once; an id that is no subject token never reaches the log.
    decided = await decide_approval(bus, approval_id, True, "bob", "engineer", "ok")
    assert decided.session_id == sid and decided.decision_id == "d1"
    for approval, status in ((approval_id, 409), ("nope-nope", 404), ("*", 422), ("a.>", 422)):
        with pytest.raises(ApprovalError) as refused:
            await decide_approval(bus, approval, False, "eve", "engineer")
        assert refused.value.status == status, (approval, str(refused.value))
