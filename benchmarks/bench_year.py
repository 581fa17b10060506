"""A year of a facility through the real bus (issue 46, items 1-3): `python benchmarks/bench_year.py
[--events N] [--devices D]` appends N events from D devices with `EventBus.publish_many` (the
product's publisher), rebuilds the projection from scratch, checks it row for row against
what was generated, times the reads the console and the API make at that size, archives all
but the last month and rebuilds again from the archive and the stream.

The year is generated, not recorded: no facility's log exists yet. Its shape follows the
product's own event sequences (what the coordinator, placement, the decision service and the
agents append for one session, one task, one decision). The mix is a stated assumption,
`MIX`: per unit of work, its share and its events.

- a decision asked through the API: 1 event;
- a fleet task: submitted, placed, started, finished, and a run heartbeat for one in four: 4-5;
- a tuning session: started, 5 steps each with its measurement, decision, move decided and
  resolved, an approval for one in three (requested, paused, decided, resumed), finished:
  about 24;
- a device's status change: 1;
- once a month per device, a model published: 1.

Printed: events/s appended; the rebuild's events/s and wall time; rows per table against the
events generated; the reads (`/v1/audit`'s newest page and one deep in the log, the console's
session list) p50/p99 over 50 calls each; the bytes per million events of JetStream, Postgres
and the archive. Targets (issue 46): rebuild >= 20,000 events/s; a decisions page p99 <= 50 ms
at 10M events. Small mode in CI: tests/benchmarks/test_bench_year.py (100,000 events is the
issue's; CI runs fewer to keep its time)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpc_ds1.db import make_engine, tables, upgrade
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import (
    ApprovalDecided,
    ApprovalRequested,
    DecisionMade,
    DeviceRegistered,
    DeviceStatusChanged,
    Envelope,
    Event,
    MeasurementRecorded,
    ModelPublished,
    SessionFinished,
    SessionMoveDecided,
    SessionMoveResolved,
    SessionPaused,
    SessionResumed,
    SessionStarted,
    SessionStepRun,
    TaskFinished,
    TaskPlaced,
    TaskStarted,
    TaskSubmitted,
    envelope,
)
from hpc_ds1.operations.archive import archive_before, folder_of
from hpc_ds1.settings import Settings

START = datetime(2026, 1, 1, tzinfo=UTC)
YEAR = timedelta(days=365)
MIX = {"decision": 0.55, "task": 0.25, "session": 0.05, "status": 0.15}  # shares of units
CONFIG = {"ranks": 2, "threads": 1, "tile": 64}
WORKLOADS = ("gemm", "stencil", "nbody", "montecarlo")


@dataclass
class Generated:
    """What the year holds, by id: what the projection must show after a rebuild."""

    events: int = 0
    devices: set[str] = field(default_factory=set)
    decisions: set[str] = field(default_factory=set)
    sessions: set[str] = field(default_factory=set)
    tasks: set[str] = field(default_factory=set)
    measurements: set[str] = field(default_factory=set)
    models: int = 0


def year(prefix: str, events: int, devices: int, seed: int = 0) -> Iterator[list[Envelope]]:
    """About `events` envelopes (whole units of work, so a few more), in time order, in
    chunks of a unit at a time."""
    rng = random.Random(seed)
    ids = [f"dev-{i:05d}" for i in range(devices)]
    made = 0
    span = YEAR / max(events, 1)
    at = START

    def wrap(items: list[Event], actor: str = "bench") -> list[Envelope]:
        nonlocal made, at
        out = []
        for item in items:
            env = envelope(item, actor=actor, source="bench", prefix=prefix)
            out.append(env.model_copy(update={"time": at}))
            at += span
        made += len(out)
        return out

    yield wrap(
        [DeviceRegistered(device_id=d, hostname=f"node{i}", local=False) for i, d in enumerate(ids)]
    )
    month = -1
    kinds, weights = zip(*MIX.items(), strict=True)
    while made < events:
        if (at - START).days // 30 != month:
            month = (at - START).days // 30
            yield wrap(
                [
                    ModelPublished(
                        model_version=f"m{month}-{d}",
                        device_id=d,
                        artifact=f"{d}/m{month}.onnx",
                        sha256="0" * 64,
                        trained_on=720,
                    )
                    for d in ids
                ],
                "trainer",
            )
        kind = rng.choices(kinds, weights)[0]
        device = rng.choice(ids)
        workload = rng.choice(WORKLOADS)
        size = rng.choice((256, 512, 1024, 2048))
        if kind == "decision":
            yield wrap([_decision(uuid.uuid4().hex, device, workload, size, "api")], "alice")
        elif kind == "status":
            went = DeviceStatusChanged(device_id=device, status="online")
            if rng.random() < 0.5:
                went = DeviceStatusChanged(device_id=device, status="offline")
            yield wrap([went], "coordinator")
        elif kind == "task":
            yield wrap(_task(rng, device, workload, size), "placement")
        else:
            yield wrap(_session(rng, device, workload, size), "coordinator")


def _decision(decision_id: str, device: str, workload: str, size: int, source: str) -> Event:
    return DecisionMade(
        decision_id=decision_id,
        device_id=device,
        source=source,
        workload=workload,
        size=size,
        config=CONFIG,
        choice="THREADS_UP",
        confidence=0.9,
        mode="auto",
        reasons=["telemetry"],
        model_version="m0",
    )


def _task(rng: random.Random, device: str, workload: str, size: int) -> list[Event]:
    task = uuid.uuid4().hex
    runtime = rng.uniform(0.5, 600.0)
    return [
        TaskSubmitted(task_id=task, workload=workload, size=size, submitted_by="alice"),
        TaskPlaced(
            task_id=task,
            attempt=1,
            device_id=device,
            config=CONFIG,
            expected_s=runtime,
            queue_s=0.0,
            basis="predicted",
            reason="expected to finish first",
        ),
        TaskStarted(task_id=task, attempt=1, device_id=device),
        TaskFinished(task_id=task, attempt=1, device_id=device, config=CONFIG, runtime_s=runtime),
    ]


def _session(rng: random.Random, device: str, workload: str, size: int) -> list[Event]:
    session = uuid.uuid4().hex
    out: list[Event] = [
        SessionStarted(
            session_id=session, device_id=device, workload=workload, size=size, start=CONFIG
        )
    ]
    asks = rng.random() < 1 / 3
    for step in range(5):
        measurement = uuid.uuid4().hex
        decision = uuid.uuid4().hex
        runtime = rng.uniform(0.1, 10.0)
        out += [
            MeasurementRecorded(
                measurement_id=measurement,
                device_id=device,
                workload=workload,
                size=size,
                config=CONFIG,
                status="ok",
                runtime_s=runtime,
                purpose="tune",
            ),
            SessionStepRun(
                session_id=session,
                step=step,
                config=CONFIG,
                status="ok",
                runtime_s=runtime,
                measurement_id=measurement,
            ),
            _decision(decision, device, workload, size, "session"),
            SessionMoveDecided(
                session_id=session,
                step=step + 1,
                decision_id=decision,
                move="TILE_UP",
                confidence=0.9,
                mode="auto",
                config=CONFIG,
            ),
        ]
        if asks and step == 2:
            approval = uuid.uuid4().hex
            out += [
                ApprovalRequested(
                    approval_id=approval,
                    session_id=session,
                    decision_id=decision,
                    device_id=device,
                    workload=workload,
                    size=size,
                    config=CONFIG,
                    move="TILE_UP",
                    confidence=0.6,
                    mode="confirm",
                ),
                SessionPaused(session_id=session, step=step + 1, approval_id=approval),
                ApprovalDecided(
                    approval_id=approval,
                    session_id=session,
                    decision_id=decision,
                    approved=True,
                    by="alice",
                    role="engineer",
                ),
                SessionResumed(session_id=session, approval_id=approval, approved=True),
            ]
        out.append(
            SessionMoveResolved(
                session_id=session,
                step=step + 1,
                move="TILE_UP",
                kept=step % 2 == 0,
                config=CONFIG,
                misses_in_a_row=0,
            )
        )
    out.append(SessionFinished(session_id=session, reason="stop", real_runs=5))
    return out


def note(generated: Generated, envs: list[Envelope]) -> None:
    generated.events += len(envs)
    for env in envs:
        data = env.data
        if env.type == "device.registered":
            generated.devices.add(data["device_id"])
        elif env.type == "decision.made":
            generated.decisions.add(data["decision_id"])
        elif env.type == "session.started":
            generated.sessions.add(data["session_id"])
        elif env.type == "task.submitted":
            generated.tasks.add(data["task_id"])
        elif env.type == "measurement.recorded":
            generated.measurements.add(data["measurement_id"])
        elif env.type == "model.published":
            generated.models += 1


async def append_year(
    bus: EventBus, events: int, devices: int, window: int = 4096
) -> tuple[Generated, float]:
    """Publish the year; (what it holds, wall seconds)."""
    generated = Generated()
    pending: list[Envelope] = []
    started = time.perf_counter()
    for chunk in year(bus.prefix, events, devices):
        note(generated, chunk)
        pending += chunk
        if len(pending) >= window:
            await bus.publish_many(pending, window=1024)
            pending = []
    if pending:
        await bus.publish_many(pending, window=1024)
    return generated, time.perf_counter() - started


def rows_against(engine: Engine, generated: Generated) -> dict[str, Any]:
    """Each read model's ids against the generated ones: the mismatches (empty: row for
    row), and the counts."""
    checks = {
        "devices": (tables.devices.c.device_id, generated.devices),
        "decisions": (tables.decisions.c.decision_id, generated.decisions),
        "sessions": (tables.sessions.c.session_id, generated.sessions),
        "tasks": (tables.tasks.c.task_id, generated.tasks),
        "measurements": (tables.measurements.c.measurement_id, generated.measurements),
    }
    out: dict[str, Any] = {}
    with engine.connect() as conn:
        for name, (column, expected) in checks.items():
            found = {str(v) for v in conn.execute(select(column)).scalars()}
            out[name] = {
                "rows": len(found),
                "expected": len(expected),
                "missing": len(expected - found),
                "unexpected": len(found - expected),
            }
        out["set_aside"] = conn.execute(
            select(func.count()).select_from(tables.set_aside)
        ).scalar_one()
    return out


def read_timings(engine: Engine, calls: int = 50) -> dict[str, dict[str, float]]:
    """p50/p99 ms of the API's and the console's reads, straight against Postgres."""
    from hpc_ds1.services.gateway.api.audit import query_audit

    with engine.connect() as conn:
        last = int(conn.execute(select(func.max(tables.decisions.c.seq))).scalar() or 0)
    reads = {
        "audit newest page": lambda: query_audit(
            engine, after=None, before=None, limit=100, filters={}
        ),
        "audit page deep in the log": lambda: query_audit(
            engine, after=None, before=max(1, last // 2), limit=100, filters={}
        ),
        "audit page by workload": lambda: query_audit(
            engine, after=None, before=None, limit=100, filters={"workload": "gemm"}
        ),
        "sessions newest page": lambda: _sessions_page(engine),
    }
    out = {}
    for name, read in reads.items():
        times = []
        for _ in range(calls):
            begun = time.perf_counter()
            read()
            times.append((time.perf_counter() - begun) * 1000)
        times.sort()
        out[name] = {
            "p50_ms": statistics.median(times),
            "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))],
        }
    return out


def _sessions_page(engine: Engine) -> None:
    t = tables.sessions
    with engine.connect() as conn:
        conn.execute(select(t).order_by(t.c.started_at.desc()).limit(50)).all()


async def run_year(settings: Settings, engine: Engine, events: int, devices: int) -> dict[str, Any]:
    from hpc_ds1.projection.rebuild import rebuild

    assert settings.nats_url
    bus = await EventBus.connect(settings, settings.nats_url, "bench-year")
    try:
        generated, appended_s = await append_year(bus, events, devices)
        last = await bus.last_sequence()
        started = time.perf_counter()
        rebuilt_to = await rebuild(engine, bus)
        rebuild_s = time.perf_counter() - started
        rows = rows_against(engine, generated)
        reads = read_timings(engine)
        info = await bus.js.stream_info(settings.stream)
        with engine.connect() as conn:
            pg_bytes = int(
                conn.execute(text("select pg_database_size(current_database())")).scalar_one()
            )
        # All but the last month leaves for the archive; then a rebuild reads both.
        before = START + YEAR - timedelta(days=30)
        archived = await archive_before(bus, settings.home, settings.audit_path, before, rebuilt_to)
        archive_bytes = sum(p.stat().st_size for p in folder_of(settings.home).glob("*"))
        started = time.perf_counter()
        again = await rebuild(engine, bus, archive=folder_of(settings.home))
        rebuild_archive_s = time.perf_counter() - started
        rows_after_archive = rows_against(engine, generated)
    finally:
        await bus.close()
    millions = generated.events / 1e6
    return {
        "events": generated.events,
        "devices": devices,
        "last_seq": last,
        "append_events_per_s": generated.events / appended_s,
        "rebuild_s": rebuild_s,
        "rebuild_events_per_s": generated.events / rebuild_s,
        "rebuilt_to": rebuilt_to,
        "rows": rows,
        "reads": reads,
        "bytes_per_million": {
            "jetstream": int(info.state.bytes) / millions,
            "postgres": pg_bytes / millions,
            "archive": archive_bytes / max(archived.events / 1e6, 1e-9),
        },
        "archived_events": archived.events,
        "rebuild_with_archive_s": rebuild_archive_s,
        "rebuild_with_archive_to": again,
        "rows_after_archive": rows_after_archive,
    }


@contextlib.contextmanager
def embedded_stack(prefix: str) -> Iterator[tuple[Settings, Engine]]:
    """A NATS and a Postgres of their own in a temporary folder (durable settings, as `serve`
    runs them), the schema migrated: the settings and an engine, all removed after."""
    from hpc_ds1.infra.nats_server import EmbeddedNats
    from hpc_ds1.infra.postgres import EmbeddedPostgres

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = Path(tmp)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pg = EmbeddedPostgres(root / "pg")
            db_url = pg.start()
        nats = EmbeddedNats(root / "nats", sync="default")
        try:
            url = nats.start()
            settings = Settings(
                home=root / "home",
                nats_url=url,
                database_url=db_url,
                stream="YEAR",
                subject_prefix="year",
            )
            engine = make_engine(db_url, pool_size=2)
            upgrade(engine)
            try:
                yield settings, engine
            finally:
                engine.dispose()
        finally:
            nats.stop()
            pg.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--devices", type=int, default=1_000)
    args = parser.parse_args(argv)
    with embedded_stack("bench-year-") as (settings, engine):
        result = asyncio.run(run_year(settings, engine, args.events, args.devices))
    print(f"a year of {result['events']:,} events from {result['devices']:,} devices")
    print(f"  appended        {result['append_events_per_s']:,.0f} events/s (publish_many)")
    print(
        f"  rebuild         {result['rebuild_s']:.1f} s, "
        f"{result['rebuild_events_per_s']:,.0f} events/s (target >= 20,000)"
    )
    for name, row in result["rows"].items():
        print(f"  rows {name:<13}{row}")
    for name, timing in result["reads"].items():
        print(f"  read {name:<28} p50 {timing['p50_ms']:.1f} ms  p99 {timing['p99_ms']:.1f} ms")
    for name, size in result["bytes_per_million"].items():
        print(f"  {name:<10} {size / 1e6:,.0f} MB per million events")
    print(
        f"  archived {result['archived_events']:,} events; rebuild with the archive "
        f"{result['rebuild_with_archive_s']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
