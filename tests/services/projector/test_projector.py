from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.audit import AuditFile, verify
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import (
    ApprovalDecided,
    ApprovalRequested,
    DecisionMade,
    DeviceLeft,
    DeviceRegistered,
    EvaluationPublished,
    SessionFinished,
    SessionMoveDecided,
    SessionMoveResolved,
    SessionPaused,
    SessionResumed,
    SessionStarted,
    SessionStepRun,
    TokenCreated,
    TokenRevoked,
)
from hpc_ds1.services.projector import Projector, project, rebuild
from hpc_ds1.settings import Settings

from .events import measurement, wrap
from .projection import checkpoint, count, run_until, snapshot


def session_story() -> list[Any]:
    start = {"ranks": 1, "threads": 1, "tile": 64}
    better = {"ranks": 1, "threads": 2, "tile": 64}
    return [
        TokenCreated(token_id="t1", holder="bob", role="engineer", sha256="a" * 64),
        SessionStarted(session_id="s1", device_id="dev-1", workload="gemm", size=64, start=start),
        SessionStepRun(session_id="s1", step=0, config=start, status="ok", runtime_s=2.0),
        DecisionMade(
            decision_id="d2",
            device_id="dev-1",
            source="session",
            workload="gemm",
            size=64,
            config=start,
            choice="THREADS_UP",
            confidence=0.6,
            mode="confirm",
            session_id="s1",
        ),
        SessionMoveDecided(
            session_id="s1",
            step=1,
            decision_id="d2",
            move="THREADS_UP",
            confidence=0.6,
            mode="confirm",
            config=start,
        ),
        ApprovalRequested(
            approval_id="a1",
            session_id="s1",
            decision_id="d2",
            device_id="dev-1",
            workload="gemm",
            size=64,
            config=start,
            move="THREADS_UP",
            confidence=0.6,
            mode="confirm",
            reasons=["confidence 0.60"],
        ),
        SessionPaused(session_id="s1", step=1, approval_id="a1"),
        ApprovalDecided(
            approval_id="a1",
            session_id="s1",
            decision_id="d2",
            approved=True,
            by="bob",
            role="engineer",
            note="looks right",
        ),
        SessionResumed(session_id="s1", approval_id="a1", approved=True),
        SessionStepRun(
            session_id="s1", step=1, move="THREADS_UP", config=better, status="ok", runtime_s=1.0
        ),
        SessionMoveResolved(
            session_id="s1",
            step=1,
            move="THREADS_UP",
            kept=True,
            config=better,
            runtime_s=1.0,
            best_runtime_s=2.0,
            misses_in_a_row=0,
        ),
        SessionStepRun(
            session_id="s1", step=2, move="TILE_UP", config=better, status="ok", runtime_s=1.5
        ),
        SessionFinished(
            session_id="s1",
            reason="stop",
            best_config=better,
            best_runtime_s=1.0,
            start_runtime_s=2.0,
            speedup=2.0,
            real_runs=3,
        ),
        TokenRevoked(token_id="t1"),
    ]


def projector_for(settings: Settings, engine: Engine, bus: EventBus, batch: int = 500) -> Projector:
    return Projector(engine, bus, AuditFile(settings.audit_path), batch)


async def test_a_published_event_becomes_a_row_and_an_audit_line(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    device = wrap(bus, DeviceRegistered(device_id="dev-1", hostname="node1", fingerprint={"c": 2}))
    await bus.publish(device)
    last = await bus.publish(measurement(bus, 0))
    await run_until(projector_for(settings, engine, bus), engine, last)
    with engine.connect() as conn:
        row = conn.execute(select(tables.devices)).mappings().one()
        m = conn.execute(select(tables.measurements)).mappings().one()
        raw = conn.execute(select(tables.events).order_by(tables.events.c.seq)).mappings().all()
    assert (row["hostname"], row["status"], row["fingerprint"]) == ("node1", "online", {"c": 2})
    assert (m["workload"], m["size"], m["config"]["threads"]) == ("gemm", 256, 2)
    assert [r["event_id"] for r in raw] == [device.id, raw[1]["event_id"]]
    lines = settings.audit_path.read_text().splitlines()
    assert [json.loads(x)["seq"] for x in lines] == [1, 2]
    assert json.loads(lines[0])["id"] == device.id
    assert verify(settings.audit_path).intact


async def test_an_evaluation_becomes_a_row(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    results = {"ranking": {"spearman": 0.8}, "sizes": [4096]}
    event = EvaluationPublished(
        evaluation_id="e1",
        device_id="dev-1",
        model_version="m1",
        profile="quick",
        seed=7,
        landscape_runs=120,
        results=results,
        plots=["regret.png"],
    )
    last = await bus.publish(wrap(bus, event))
    await run_until(projector_for(settings, engine, bus), engine, last)
    with engine.connect() as conn:
        row = conn.execute(select(tables.evaluations)).mappings().one()
    assert (row["evaluation_id"], row["model_version"], row["profile"]) == ("e1", "m1", "quick")
    assert (row["seed"], row["landscape_runs"], row["seq"]) == (7, 120, last)
    assert row["results"] == results and row["plots"] == ["regret.png"]
    assert row["published_at"] is not None


async def test_a_redelivered_batch_changes_nothing(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    await bus.publish_many([measurement(bus, i) for i in range(20)])
    events = [e async for chunk in bus.replay() for e in chunk]
    audit = AuditFile(settings.audit_path)
    assert project(engine, events, audit) == 20
    before = snapshot(engine)
    assert project(engine, events, audit) == 0
    assert project(engine, events[5:9], AuditFile(settings.audit_path)) == 0
    assert snapshot(engine) == before
    assert len(settings.audit_path.read_text().splitlines()) == 20


async def test_restart_mid_stream_loses_and_duplicates_nothing(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    total = 600
    await bus.publish_many([measurement(bus, i) for i in range(total)])
    await run_until(projector_for(settings, engine, bus, batch=50), engine, 100)
    stopped_at = checkpoint(engine)
    assert 100 <= stopped_at < total
    # A crash after the audit write but before the commit: the file is ahead of Postgres.
    ahead = [
        e async for chunk in bus.replay(stopped_at + 1, stop_at=stopped_at + 30) for e in chunk
    ]
    AuditFile(settings.audit_path).append({"seq": e.seq, **json.loads(e.data)} for e in ahead)
    await run_until(projector_for(settings, engine, bus, batch=50), engine, total)
    assert count(engine, tables.measurements) == total
    assert count(engine, tables.events) == total
    seqs = [json.loads(x)["seq"] for x in settings.audit_path.read_text().splitlines()]
    assert seqs == list(range(1, total + 1))
    assert verify(settings.audit_path).intact


async def test_malformed_and_unknown_events_are_kept_and_skipped(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    await bus.publish(measurement(bus, 0))
    await bus.js.publish(f"{bus.prefix}.device.x.registered", b"{broken", stream=bus.stream)
    unknown = wrap(bus, DeviceRegistered(device_id="dev-9", hostname="h"))
    unknown = unknown.model_copy(update={"type": "device.teleported"})
    await bus.publish(unknown)
    bad = measurement(bus, 1)
    await bus.publish(bad.model_copy(update={"data": {**bad.data, "status": "exploded"}}))
    last = await bus.publish(measurement(bus, 2))
    await run_until(projector_for(settings, engine, bus), engine, last)
    with engine.connect() as conn:
        raw = conn.execute(select(tables.events).order_by(tables.events.c.seq)).mappings().all()
    assert [r["valid"] for r in raw] == [True, False, True, False, True]
    assert "not an event envelope" in raw[1]["error"] and raw[1]["raw"] == "{broken"
    assert "unknown event type" in raw[2]["error"]
    assert "status" in raw[3]["error"]
    assert count(engine, tables.measurements) == 2
    assert count(engine, tables.devices) == 0
    assert len(settings.audit_path.read_text().splitlines()) == 5


async def test_a_gap_in_the_sequence_is_recorded(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    await bus.publish_many([measurement(bus, i) for i in range(5)])
    await bus.js.delete_msg(bus.stream, 2)
    await bus.js.delete_msg(bus.stream, 3)
    await run_until(projector_for(settings, engine, bus), engine, 5)
    with engine.connect() as conn:
        gaps = conn.execute(select(tables.gaps)).all()
    assert [tuple(g) for g in gaps] == [(2, 3)]
    assert count(engine, tables.measurements) == 3


async def test_rebuild_equals_the_live_projection(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    await bus.publish(wrap(bus, DeviceRegistered(device_id="dev-1", hostname="a")))
    await bus.publish_many([measurement(bus, i) for i in range(50)])
    await bus.publish(wrap(bus, DeviceRegistered(device_id="dev-1", hostname="b")))
    await bus.js.publish(f"{bus.prefix}.device.y.left", b"[]", stream=bus.stream)
    await bus.publish(
        wrap(
            bus,
            DecisionMade(
                decision_id="d1",
                device_id="dev-1",
                source="api",
                workload="gemm",
                size=2048,
                config={"ranks": 2},
                choice="THREADS_UP",
                confidence=0.9,
                mode="auto",
            ),
            actor="alice",
        )
    )
    await bus.publish(wrap(bus, DeviceLeft(device_id="dev-1", reason="bye")))
    await bus.publish_many([wrap(bus, e, actor="alice") for e in session_story()])
    last = await bus.last_sequence()
    await run_until(projector_for(settings, engine, bus, batch=7), engine, last)
    live = snapshot(engine)
    assert live["devices"][0][1:5] == ("b", {}, False, "left")
    with engine.connect() as conn:
        session = conn.execute(select(tables.sessions)).mappings().one()
        approval = conn.execute(select(tables.approvals)).mappings().one()
        decision = (
            conn.execute(select(tables.decisions).where(tables.decisions.c.decision_id == "d2"))
            .mappings()
            .one()
        )
        token = conn.execute(select(tables.tokens)).mappings().one()
    assert (session["status"], session["real_runs"], session["speedup"]) == ("finished", 3, 2.0)
    assert session["best_config"] == {"ranks": 1, "threads": 2, "tile": 64}
    assert (approval["status"], approval["decided_by"], approval["note"]) == (
        "approved",
        "bob",
        "looks right",
    )
    assert (decision["approval"], decision["approved_by"]) == ("approved", "bob")
    assert (token["holder"], token["role"], token["revoked"]) == ("bob", "engineer", True)
    assert await rebuild(engine, bus) == last
    assert snapshot(engine) == live
    assert len(settings.audit_path.read_text().splitlines()) == last
