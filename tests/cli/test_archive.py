"""`hpc-ds1 archive --before DATE` as a user runs it (issue 46): old decisions, run heartbeats
and finished sessions leave the stream for a hash-chained segment; devices, tokens, models,
measurements and an open session stay. `audit verify` then checks the archive with the live
stream, the rebuilt projection is the same, a backup carries the archive into a restore, and
a tampered, removed or replaced segment fails verification."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, select

from hpc_ds1.cli.audit import against_log
from hpc_ds1.db import make_engine, tables
from hpc_ds1.eventlog.audit import Verdict
from hpc_ds1.eventlog.bus import EventBus, RawEvent
from hpc_ds1.events import (
    ApprovalDecided,
    ApprovalRequested,
    DecisionMade,
    DeviceRegistered,
    Envelope,
    MeasurementRecorded,
    SessionFinished,
    SessionStarted,
    TokenCreated,
    envelope,
)
from hpc_ds1.operations.archive import Planner, folder_of, plan, segments
from hpc_ds1.operations.backup import projection_digest
from hpc_ds1.settings import Settings
from hpc_ds1.stack import open_stack
from tests.support.commands import hpc

CONFIG = {"ranks": 1, "threads": 2, "tile": 64}
OLD = datetime(2025, 3, 1, tzinfo=UTC)
NEW = datetime(2026, 6, 1, tzinfo=UTC)
BEFORE = "2026-01-01"


def decision(i: int) -> DecisionMade:
    return DecisionMade(
        decision_id=f"d{i}",
        device_id="dev-1",
        source="api",
        workload="gemm",
        size=512,
        config=CONFIG,
        choice="THREADS_UP",
        confidence=0.9,
        mode="auto",
        reasons=["telemetry"],
        model_version="v1",
    )


def session(session_id: str, finished: bool) -> list[Any]:
    events: list[Any] = [
        SessionStarted(
            session_id=session_id, device_id="dev-1", workload="gemm", size=64, start=CONFIG
        ),
        ApprovalRequested(
            approval_id=f"a-{session_id}",
            session_id=session_id,
            decision_id="d0",
            device_id="dev-1",
            workload="gemm",
            size=64,
            config=CONFIG,
            move="TILE_UP",
            confidence=0.6,
            mode="confirm",
        ),
        ApprovalDecided(
            approval_id=f"a-{session_id}",
            session_id=session_id,
            decision_id="d0",
            approved=True,
            by="alice",
            role="engineer",
        ),
    ]
    if finished:
        events.append(SessionFinished(session_id=session_id, reason="stop", real_runs=2))
    return events


def year(prefix: str) -> list[Envelope]:
    """Devices and tokens, old decisions and sessions (one finished, one still open), a
    measurement; then, after the cut, newer decisions."""
    old: list[Any] = [
        DeviceRegistered(device_id="dev-1", hostname="node1", fingerprint={"cores": 2}),
        TokenCreated(token_id="t1", holder="alice", role="engineer", sha256="a" * 64),
        *[decision(i) for i in range(6)],
        *session("s-done", finished=True),
        *session("s-open", finished=False),
        MeasurementRecorded(
            measurement_id="m1",
            device_id="dev-1",
            workload="gemm",
            size=256,
            config=CONFIG,
            status="ok",
            runtime_s=0.01,
            throughput=10.0,
            throughput_unit="GFLOP/s",
        ),
        decision(6),
    ]
    new: list[Any] = [decision(i) for i in range(7, 10)]
    made = [envelope(e, actor="test", source="test", prefix=prefix) for e in old + new]
    times = [OLD + timedelta(hours=i) for i in range(len(old))]
    times += [NEW + timedelta(hours=i) for i in range(len(new))]
    return [env.model_copy(update={"time": at}) for env, at in zip(made, times, strict=True)]


def raw(envs: list[Envelope]) -> list[RawEvent]:
    return [RawEvent(i, e.subject, e.to_json()) for i, e in enumerate(envs, start=1)]


def test_the_plan_takes_leaves_and_finished_sessions_before_the_cut() -> None:
    events = raw(year("p"))
    before = datetime.fromisoformat(BEFORE).replace(tzinfo=UTC)
    chosen = plan(events, before, projected_to=len(events))
    first_new = next(e.seq for e in events if b'"d7"' in e.data)
    assert chosen.cut == first_new
    assert chosen.sessions == {"s-done"} and chosen.approvals == {"a-s-done"}
    taken = {e.subject.split(".")[2] for e in events if chosen.takes(e.seq, e.subject)}
    assert taken == {f"d{i}" for i in range(7)} | {"s-done", "a-s-done"}
    # Nothing the projection does not hold yet leaves, whatever its time.
    assert Planner(before, projected_to=3).plan().cut == 4
    assert plan(events, before, projected_to=3).cut == 4


async def test_archive_then_verify_rebuild_backup_and_restore(
    settings: Settings, bus: EventBus, engine: Engine, target: Settings, tmp_path: Path
) -> None:
    envs = year(settings.subject_prefix)
    await bus.publish_many(envs)
    async with open_stack(settings, ("projector",), "test") as stack:
        await stack.caught_up()
    digest = projection_digest(engine)
    audit_before = settings.audit_path.read_bytes()

    dry = await hpc(settings, "archive", "--before", BEFORE, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["events"] == 7 + 2 + 2  # decisions, s-done, its approval
    assert not folder_of(settings.home).exists()

    done = await hpc(settings, "archive", "--before", BEFORE)
    assert done.returncode == 0, done.stderr
    assert "archived 11 events (1 finished sessions, 1 approvals" in done.stdout
    (segment,) = segments(folder_of(settings.home))
    assert segment.count == 11
    left = [e.subject.split(".")[2] for e in await _live(bus)]
    assert "s-done" not in left and "a-s-done" not in left and "d0" not in left
    assert {"dev-1", "t1", "m1", "s-open", "a-s-open", "d7", "d8", "d9"} <= set(left)
    again = await hpc(settings, "archive", "--before", BEFORE)
    assert again.returncode == 0 and "nothing to archive" in again.stdout

    verified = await hpc(settings, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "intact" in verified.stdout
    rebuilt = await hpc(settings, "projection", "rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert projection_digest(engine) == digest
    assert settings.audit_path.read_bytes() == audit_before

    saved = await hpc(settings, "backup", str(tmp_path / "backup"))
    assert saved.returncode == 0, saved.stderr
    loaded = await hpc(target, "restore", str(tmp_path / "backup"))
    assert loaded.returncode == 0, loaded.stderr
    assert target.database_url
    restored = make_engine(target.database_url, pool_size=1)
    try:
        assert projection_digest(restored) == digest
    finally:
        restored.dispose()
    assert (target.home / "audit.jsonl").read_bytes() == audit_before
    assert (await hpc(target, "audit", "verify")).returncode == 0


async def test_a_tampered_removed_or_replaced_segment_fails_verification(
    settings: Settings, bus: EventBus, engine: Engine
) -> None:
    await bus.publish_many(year(settings.subject_prefix))
    async with open_stack(settings, ("projector",), "test") as stack:
        await stack.caught_up()
    assert (await hpc(settings, "archive", "--before", BEFORE)).returncode == 0
    (segment,) = segments(folder_of(settings.home))
    original = segment.events.read_bytes()

    # An archived decision edited, with the segment's SHA-256 recomputed to match.
    lines = gzip.decompress(original).splitlines()
    record = orjson.loads(lines[0])
    event = orjson.loads(base64.b64decode(record["data"]))
    event["data"]["confidence"] = 0.1
    record["data"] = base64.b64encode(orjson.dumps(event)).decode()
    lines[0] = orjson.dumps(record)
    segment.events.write_bytes(gzip.compress(b"\n".join(lines) + b"\n", mtime=0))
    info = json.loads(segment.manifest.read_text())
    info["sha256"] = hashlib.sha256(segment.events.read_bytes()).hexdigest()
    segment.manifest.write_text(json.dumps(info))
    edited = await verify(settings, bus, engine)
    assert not edited.intact
    assert "differs from the event in the log" in str(edited.problem)

    # Edited without recomputing: the manifest's SHA-256 catches it first.
    info["sha256"] = hashlib.sha256(original).hexdigest()
    segment.manifest.write_text(json.dumps(info))
    damaged = await verify(settings, bus, engine)
    assert not damaged.intact
    assert "does not match the SHA-256" in str(damaged.problem)

    # The segment removed: the log's chain no longer reaches the audit file's lines.
    segment.events.write_bytes(original)
    assert (await verify(settings, bus, engine)).intact
    segment.manifest.rename(segment.manifest.with_suffix(".gone"))
    removed = await verify(settings, bus, engine)
    assert not removed.intact
    assert "seq" in str(removed.problem)  # the log's chain no longer meets the file's lines

    # A segment replaced by another run's: the chain of manifests breaks.
    segment.manifest.with_suffix(".gone").rename(segment.manifest)
    info["previous"] = "f" * 64
    segment.manifest.write_text(json.dumps(info))
    replaced = await verify(settings, bus, engine)
    assert not replaced.intact
    assert "removed, replaced or reordered" in str(replaced.problem)


async def verify(settings: Settings, bus: EventBus, engine: Engine) -> Verdict:
    """`audit verify`'s check, in this process."""

    def checkpoint() -> int:
        with engine.connect() as conn:
            return int(conn.execute(select(tables.checkpoints.c.last_seq)).scalar() or 0)

    return await against_log(
        bus,
        settings.audit_path,
        lambda: asyncio.to_thread(checkpoint),
        folder_of(settings.home),
    )


async def _live(bus: EventBus) -> list[RawEvent]:
    found: list[RawEvent] = []
    async for chunk in bus.replay(1):
        found += chunk
    return found
