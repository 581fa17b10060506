"""A poison event (a value Postgres refuses) is set aside with its reason; the projector goes on
and reports its health; a failure of the database itself holds it and says so."""

from __future__ import annotations

import asyncio
import json

from nats.errors import NoRespondersError
from sqlalchemy import Engine, select, text

from hpc_ds1.db import tables
from hpc_ds1.eventlog.audit import AuditFile, verify
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import status_subject
from hpc_ds1.events import ApprovalDecided, DeviceRegistered, MeasurementRecorded
from hpc_ds1.process.runtime import run_services
from hpc_ds1.services.projector import Projector, rebuild
from hpc_ds1.settings import Settings
from tests.support.commands import hpc

from .events import measurement, wrap
from .projection import checkpoint, count, run_until, snapshot


def too_big(bus: EventBus) -> MeasurementRecorded:
    good = measurement(bus, 0).data
    return MeasurementRecorded.model_validate({**good, "measurement_id": "big", "size": 10**19})


async def test_poison_events_are_set_aside_and_the_rest_goes_on(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    await bus.publish(wrap(bus, DeviceRegistered(device_id="dev-1", hostname="first")))
    await bus.publish(measurement(bus, 0))
    big = await bus.publish(wrap(bus, too_big(bus)))  # past bigint
    nul = await bus.publish(wrap(bus, DeviceRegistered(device_id="dev-2", hostname="h\x00st")))
    note = ApprovalDecided(
        approval_id="a1",
        session_id="s1",
        decision_id="d1",
        approved=True,
        by="bob",
        role="engineer",
        note="fine\x00",
    )
    nul_note = await bus.publish(wrap(bus, note))
    # Past any 64-bit integer: not even the audit file's JSON encoder takes it as a number.
    huge = measurement(bus, 9)
    huge = huge.model_copy(update={"data": {**huge.data, "size": 10**30}})
    past_u64 = await bus.publish(huge)
    renamed = await bus.publish(wrap(bus, DeviceRegistered(device_id="dev-1", hostname="second")))
    # The first registration published again after the dedup window (no Nats-Msg-Id dedup now):
    # it must not rename the device back, nor add a row anywhere.
    first = (await bus.history("device", "dev-1"))[0][1]
    replayed = await bus.js.publish(first.subject, first.to_json(), stream=bus.stream)
    last = await bus.publish(measurement(bus, 1))

    projector = Projector(engine, bus, AuditFile(settings.audit_path), batch=500)
    await run_until(projector, engine, last)

    with engine.connect() as conn:
        aside = conn.execute(select(tables.set_aside).order_by(tables.set_aside.c.seq)).mappings()
        aside = list(aside)
        device = conn.execute(select(tables.devices)).mappings().one()
        raw = {r.seq: r for r in conn.execute(select(tables.events))}
    assert [a["seq"] for a in aside] == [big, nul, nul_note, past_u64, replayed.seq]
    reasons = {a["seq"]: a["reason"] for a in aside}
    assert "out of range" in reasons[big]
    assert "NUL" in reasons[nul] or "0x00" in reasons[nul] or "\\u0000" in reasons[nul]
    assert "duplicate key" in reasons[replayed.seq]
    assert aside[0]["raw"] == (await bus.js.get_msg(bus.stream, big)).data
    assert all(a["subject"] for a in aside)
    # The rows of the events after them are there; the set-aside ones left nothing behind.
    assert (device["device_id"], device["hostname"], device["seq"]) == ("dev-1", "second", renamed)
    assert count(engine, tables.measurements) == 2
    assert count(engine, tables.approvals) == 0
    assert sorted(raw) == list(range(1, last + 1))
    assert raw[big].valid is False and raw[big].error.startswith("set aside: ")
    assert checkpoint(engine) == last
    # The audit file holds every event, the set-aside ones too, in order.
    lines = [json.loads(x) for x in settings.audit_path.read_text().splitlines()]
    assert [x["seq"] for x in lines] == list(range(1, last + 1))
    as_text = lines[past_u64 - 1]
    assert as_text["malformed"] is True and "1" + "0" * 30 in as_text["raw"]
    assert verify(settings.audit_path).intact
    assert projector.set_aside == 5
    facts = projector.facts()
    assert facts["checkpoint"] == last and facts["set_aside"] == 5 and facts["healthy"] is True

    # A rebuild sets the same events aside and gives the same read models.
    live = snapshot(engine)
    assert await rebuild(engine, bus) == last
    assert snapshot(engine) == live
    with engine.connect() as conn:
        assert conn.execute(select(tables.set_aside.c.seq)).scalars().all() == [
            big,
            nul,
            nul_note,
            past_u64,
            replayed.seq,
        ]


async def test_a_database_failure_is_not_the_events_fault(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    """A missing table (the database's state) sets nothing aside: the projector holds its
    position, says it is stuck, and goes on once the table is back."""
    await bus.publish(measurement(bus, 0))
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE measurements RENAME TO measurements_away"))
    last = await bus.publish(measurement(bus, 1))
    projector = Projector(
        engine, bus, AuditFile(settings.audit_path), stuck_after_s=0.0, stalled_after_s=3600.0
    )
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    try:
        for _ in range(400):
            if projector.facts()["healthy"] is False:
                break
            await asyncio.sleep(0.05)
        facts = projector.facts()
        assert facts["healthy"] is False, facts
        assert "stuck at seq 1" in facts["problem"] and "UndefinedTable" in facts["problem"]
        assert facts["checkpoint"] == 0 and facts["set_aside"] == 0
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE measurements_away RENAME TO measurements"))
        for _ in range(400):
            if checkpoint(engine) == last and projector.facts()["healthy"]:
                break
            await asyncio.sleep(0.05)
        assert projector.facts() == {
            "lag": 0,
            "checkpoint": last,
            "set_aside": 0,
            "healthy": True,
            "problem": None,
        }
    finally:
        stop.set()
        await task
    assert count(engine, tables.measurements) == 2
    assert count(engine, tables.set_aside) == 0


async def test_the_status_reply_carries_the_projectors_health(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    """What readiness reads: lag, checkpoint, set_aside, healthy, problem."""
    await bus.publish(measurement(bus, 0))
    last = await bus.publish(wrap(bus, too_big(bus)))
    assert settings.nats_url and settings.database_url
    stop = asyncio.Event()
    facts: dict[str, object] = {}
    service = asyncio.create_task(
        run_services(("projector",), settings, settings.nats_url, settings.database_url, stop)
    )
    try:
        for _ in range(400):
            try:
                reply = await bus.nc.request(status_subject(settings, "projector"), b"", timeout=5)
            except NoRespondersError:  # not subscribed yet
                await asyncio.sleep(0.05)
                continue
            facts = json.loads(reply.data)
            if facts["checkpoint"] == last and facts["lag"] == 0:
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await service
    assert facts["service"] == "projector"
    assert {k: facts[k] for k in ("lag", "checkpoint", "set_aside", "healthy", "problem")} == {
        "lag": 0,
        "checkpoint": last,
        "set_aside": 1,
        "healthy": True,
        "problem": None,
    }


async def test_projection_rebuild_sets_poison_aside_and_says_so(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    await bus.publish(measurement(bus, 0))
    await bus.publish(wrap(bus, too_big(bus)))
    last = await bus.publish(measurement(bus, 1))
    done = await hpc(settings, "projection", "rebuild")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"rebuilt the projection from {last} events" in done.stdout
    assert "1 event(s) set aside" in done.stdout and "projection_set_aside" in done.stdout
    assert checkpoint(engine) == last and count(engine, tables.measurements) == 2
