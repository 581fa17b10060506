"""`hpc-ds1 backup` and `hpc-ds1 restore` as a user runs them (the console script in a
subprocess): a log with devices, tokens, measurements, a model, decisions and an approved
session, one message deleted from it; restored into a new stream, database and home, the
rebuilt projection, the audit file, every sequence and the model artifacts are the same."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from hpc_ds1.cli import main
from hpc_ds1.db import make_engine
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import (
    ApprovalDecided,
    ApprovalRequested,
    DecisionMade,
    DeviceRegistered,
    Envelope,
    MeasurementRecorded,
    ModelPublished,
    SessionFinished,
    SessionStarted,
    TokenCreated,
    TokenRevoked,
    envelope,
)
from hpc_ds1.models_store import bucket_name, models_bucket, save_local
from hpc_ds1.operations.backup import EVENTS, backup, projection_digest, restore
from hpc_ds1.settings import Settings
from hpc_ds1.stack import open_stack
from tests.support.commands import cli_env, hpc
from tests.support.streams import messages


def story(prefix: str) -> list[Envelope]:
    config = {"ranks": 1, "threads": 2, "tile": 64}
    events: list[Any] = [
        DeviceRegistered(device_id="dev-1", hostname="node1", fingerprint={"cores": 2}),
        TokenCreated(token_id="t1", holder="alice", role="engineer", sha256="a" * 64),
        TokenCreated(token_id="t2", holder="bob", role="viewer", sha256="b" * 64),
    ]
    events += [
        MeasurementRecorded(
            measurement_id=f"m{i}",
            device_id="dev-1",
            workload="gemm",
            size=256 + i,
            config=config,
            status="ok",
            runtime_s=0.01 * (i + 1),
            throughput=10.0 + i,
            throughput_unit="GFLOP/s",
            held_out=i % 5 == 0,
        )
        for i in range(20)
    ]
    events.append(
        ModelPublished(
            model_version="v1",
            device_id="dev-1",
            artifact="dev-1/v1.onnx",
            sha256="c" * 64,
            metrics={"rmse": 0.1},
            trained_on=16,
        )
    )
    events += [
        DecisionMade(
            decision_id=f"d{i}",
            device_id="dev-1",
            source="api",
            workload="gemm",
            size=512,
            config=config,
            choice="THREADS_UP",
            confidence=0.9,
            mode="auto",
            reasons=["telemetry"],
            model_version="v1",
        )
        for i in range(10)
    ]
    events += [
        SessionStarted(session_id="s1", device_id="dev-1", workload="gemm", size=64, start=config),
        ApprovalRequested(
            approval_id="a1",
            session_id="s1",
            decision_id="d0",
            device_id="dev-1",
            workload="gemm",
            size=64,
            config=config,
            move="TILE_UP",
            confidence=0.6,
            mode="confirm",
        ),
        ApprovalDecided(
            approval_id="a1",
            session_id="s1",
            decision_id="d0",
            approved=True,
            by="alice",
            role="engineer",
        ),
        SessionFinished(session_id="s1", reason="stop", real_runs=2),
        TokenRevoked(token_id="t2"),
    ]
    return [envelope(e, actor="test", source="test", prefix=prefix) for e in events]


@pytest.fixture
async def source_bucket(bus: EventBus, settings: Settings) -> AsyncIterator[None]:
    yield
    try:
        await bus.js.delete_stream(f"OBJ_{bucket_name(settings)}")
    except Exception:
        pass


async def test_restore_gives_the_same_log_models_and_projection(
    settings: Settings,
    bus: EventBus,
    engine: Engine,
    target: Settings,
    source_bucket: None,
    tmp_path: Path,
) -> None:
    sequences = await bus.publish_many(story(settings.subject_prefix))
    # A message deleted from the log (an operator's purge): the restore keeps the gap.
    await bus.js.delete_msg(settings.stream, sequences[7])
    store = await models_bucket(bus.js, settings)
    assert store is not None
    await store.put("dev-1/v1.onnx", b"onnx bytes")
    save_local(settings.models_dir, "v1", "dev-1", b"onnx bytes")
    async with open_stack(settings, ("projector",), "test") as stack:
        await stack.caught_up()
    source_digest = projection_digest(engine)

    path = tmp_path / "backup"
    saved = await hpc(settings, "backup", str(path))
    assert saved.returncode == 0, saved.stderr
    assert f"backed up {len(sequences) - 1} events" in saved.stdout
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["events"]["gaps"] == [[sequences[7], sequences[7]]]
    assert [o["name"] for o in manifest["objects"]] == ["dev-1/v1.onnx"]

    loaded = await hpc(target, "restore", str(path))
    assert loaded.returncode == 0, loaded.stderr
    assert target.database_url
    restored_engine = make_engine(target.database_url, pool_size=1)
    try:
        assert projection_digest(restored_engine) == source_digest
    finally:
        restored_engine.dispose()
    assert target.nats_url
    restored = await EventBus.connect(target, target.nats_url, "test")
    try:
        assert await messages(restored, target.stream) == await messages(bus, settings.stream)
        restored_store = await models_bucket(restored.js, target, create=False)
        assert restored_store is not None
        assert (await restored_store.get("dev-1/v1.onnx")).data == b"onnx bytes"
    finally:
        await restored.close()
    assert (target.home / "audit.jsonl").read_text() == settings.audit_path.read_text()
    for name in ("v1.onnx", "latest.onnx", "latest.json"):
        assert (target.models_dir / name).read_bytes() == (settings.models_dir / name).read_bytes()

    # The target now holds a log: a second restore into it is refused and changes nothing.
    again = await hpc(target, "restore", str(path))
    assert again.returncode == 2
    assert "restore needs an empty target" in again.stderr
    assert f"stream {target.stream!r} holds {len(sequences) - 1} events" in again.stderr


async def test_a_damaged_or_foreign_backup_is_refused(
    settings: Settings,
    bus: EventBus,
    target: Settings,
    source_bucket: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In this process (each refusal comes before anything starts): exit status 2 and one line
    saying what is wrong."""

    async def run(env_of: Settings, *args: str) -> tuple[int, str]:
        with monkeypatch.context() as patch:
            for key in [k for k in os.environ if k.startswith("HPC_DS1_")]:
                patch.delenv(key)
            for key, value in cli_env(env_of).items():
                if key.startswith("HPC_DS1_"):
                    patch.setenv(key, value)
            status = await asyncio.to_thread(main, list(args))
        return status, capsys.readouterr().err

    await bus.publish_many(story(settings.subject_prefix)[:3])
    path = tmp_path / "backup"
    assert (await run(settings, "backup", str(path)))[0] == 0

    status, err = await run(settings, "backup", str(path))
    assert status == 2
    assert "is not an empty folder" in err

    foreign = target.model_copy(update={"subject_prefix": "other"})
    status, err = await run(foreign, "restore", str(path))
    assert status == 2
    assert f"HPC_DS1_SUBJECT_PREFIX={settings.subject_prefix}" in err

    lines = (path / EVENTS).read_text().splitlines(keepends=True)
    (path / EVENTS).write_text("".join(lines[:-1]))
    status, err = await run(target, "restore", str(path))
    assert status == 2
    assert "does not match its SHA-256" in err
    assert not target.home.exists()  # refused before anything started

    status, err = await run(target, "restore", str(tmp_path / "nowhere"))
    assert status == 2
    assert "is not a backup" in err


async def test_deleted_messages_at_both_ends_keep_every_sequence(
    settings: Settings, bus: EventBus, target: Settings, source_bucket: None, tmp_path: Path
) -> None:
    """Deleted first and last messages: the restored stream starts and ends at the same
    sequences, and holds the same messages in between."""
    sequences = await bus.publish_many(story(settings.subject_prefix)[:8])
    for seq in (sequences[0], sequences[1], sequences[4], sequences[-1]):
        await bus.js.delete_msg(settings.stream, seq)
    summary = await backup(bus, settings, tmp_path / "backup")
    assert (summary.events, summary.first_seq, summary.last_seq) == (4, 3, 8)
    assert summary.last_event == 7
    manifest = json.loads((tmp_path / "backup" / "manifest.json").read_text())
    assert manifest["events"]["gaps"] == [[1, 2], [5, 5], [8, 8]]
    assert target.nats_url
    restored = await EventBus.connect(target, target.nats_url, "test")
    try:
        again = await restore(restored, target, tmp_path / "backup")
        assert (again.events, again.first_seq, again.last_seq, again.last_event) == (4, 3, 8, 7)
        assert again.gaps == 3
        info = await restored.js.stream_info(target.stream)
        assert (info.state.first_seq, info.state.last_seq, info.state.messages) == (3, 8, 4)
        assert await messages(restored, target.stream) == await messages(bus, settings.stream)
    finally:
        await restored.close()
