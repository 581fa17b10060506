"""Backup and restore of what cannot be rebuilt: the event log and the model artifacts.

A backup is one folder:

    manifest.json   format, when, source stream and subject prefix, counts, SHA-256 of each file
    events.jsonl    every message of the event stream in order: seq, subject, headers, data
    objects/        the model bucket's objects (model artifacts every machine reads)
    models/         $HPC_DS1_HOME/models/ (this machine's model files)

The Postgres projection and the audit file are not in it: they are folds of the log, and a
restore rebuilds them by replaying the restored log. A restore keeps every stream sequence:
the events are appended in order into an empty stream, and a sequence the source stream no
longer held (a deleted message) is recreated as a gap."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from sqlalchemy import Engine, func, select

from ..db import tables
from ..eventlog.bus import EventBus
from ..models_store import models_bucket
from ..settings import Settings

FORMAT = "hpc-ds1-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
OBJECTS = "objects"
MODELS = "models"
ARCHIVE = "archive"  # the home's archive segments (hpc_ds1.operations.archive), copied as they are
# Headers JetStream checks at append time: they held when the event was first appended, and a
# replay into an empty stream must not check them again (a deleted message changes the answer).
# Also the atomic batch an event came in: sent again alone, it would be taken for part of an
# open batch and never stored.
_CHECK_HEADERS = ("Nats-Expected-", "Nats-Batch-")
_GAP_SUBJECT = "_restore.gap"


class BackupError(Exception):
    """A backup that cannot be written or read, or a target that cannot take a restore."""


@dataclass(frozen=True)
class Summary:
    path: Path
    events: int
    first_seq: int
    last_seq: int
    gaps: int
    objects: int
    model_files: int
    last_event: int  # the sequence of the last message held (last_seq may have been deleted)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat()


# --- reading the stream ---------------------------------------------------------------------


async def stored_messages(bus: EventBus, stop_at: int, batch: int = 1000) -> AsyncIterator[Msg]:
    """Every message from the first up to `stop_at`, in order, with its headers."""
    sub = await bus.js.pull_subscribe(
        f"{bus.prefix}.>",
        durable=None,
        stream=bus.stream,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
        ),
    )
    try:
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=1.0)
            except (NatsTimeout, TimeoutError):
                info = await sub.consumer_info()
                if info.num_pending == 0:
                    return
                continue
            for msg in msgs:
                if msg.metadata.sequence.stream > stop_at:
                    return
                yield msg
            if msgs[-1].metadata.sequence.stream >= stop_at:
                return
    finally:
        await sub.unsubscribe()


# --- backup ---------------------------------------------------------------------------------


def _prepare_target(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise BackupError(f"{path} already exists and is not an empty folder; name a new one")
    (path / OBJECTS).mkdir(parents=True, exist_ok=True)


async def backup(bus: EventBus, settings: Settings, path: Path) -> Summary:
    """Write the event log (up to its last sequence now) and the model artifacts to `path`,
    a new or empty folder. Appends that arrive meanwhile are not in this backup."""
    _prepare_target(path)
    try:
        info = await bus.js.stream_info(bus.stream)
    except NotFoundError:
        raise BackupError(f"no stream {bus.stream!r} on this NATS: nothing to back up") from None
    last = int(info.state.last_seq)
    count = 0
    first = held = 0
    gaps: list[list[int]] = []
    expected = 1
    with (path / EVENTS).open("w", encoding="utf-8") as out:
        async for msg in stored_messages(bus, last):
            seq = int(msg.metadata.sequence.stream)
            first = first or seq
            if seq != expected:
                gaps.append([expected, seq - 1])
            expected = seq + 1
            held = seq
            record = {
                "seq": seq,
                "subject": msg.subject,
                "headers": dict(msg.headers or {}),
                "data": base64.b64encode(msg.data).decode("ascii"),
            }
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
            count += 1
    if expected <= last:
        gaps.append([expected, last])
    objects = await _backup_objects(bus, settings, path / OBJECTS)
    model_files = await asyncio.to_thread(_copy_tree, settings.models_dir, path / MODELS)
    archive_files = await asyncio.to_thread(_copy_tree, settings.home / ARCHIVE, path / ARCHIVE)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_at": _now(),
        "source": {
            "stream": bus.stream,
            "subject_prefix": bus.prefix,
            "home": str(settings.home),
        },
        "events": {
            "file": EVENTS,
            "count": count,
            "first_seq": first,
            "last_seq": last,
            # Sequences the stream no longer held (deleted or purged messages), first to last;
            # a restore recreates them as gaps.
            "gaps": gaps,
            "sha256": await asyncio.to_thread(_sha256_file, path / EVENTS),
        },
        "objects": objects,
        "models": model_files,
        # The archived events: the stream's gaps below are partly these (hpc-ds1 archive).
        "archive": archive_files,
    }
    _write_json(path / MANIFEST, manifest)
    return Summary(path, count, first, last, len(gaps), len(objects), len(model_files), held)


async def _backup_objects(bus: EventBus, settings: Settings, folder: Path) -> list[dict[str, Any]]:
    store = await models_bucket(bus.js, settings, create=False)
    if store is None:
        return []
    try:
        listing = await store.list()
    except NotFoundError:  # an empty bucket answers "no objects found"
        return []
    found = []
    for index, info in enumerate(sorted(listing, key=lambda i: str(i.name))):
        if info.deleted:
            continue
        result = await store.get(str(info.name))
        data = result.data or b""
        file = f"{index:06d}.bin"
        await asyncio.to_thread((folder / file).write_bytes, data)
        found.append(
            {
                "name": info.name,
                "file": f"{OBJECTS}/{file}",
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "description": info.description,
            }
        )
    return found


def _walk(root: Path) -> Iterator[Path]:
    if root.is_dir():
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.name.endswith(".tmp"):
                yield path


def _copy_tree(source: Path, target: Path) -> list[dict[str, Any]]:
    files = []
    for path in _walk(source):
        relative = path.relative_to(source)
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)
        files.append(
            {
                "path": relative.as_posix(),
                "size": destination.stat().st_size,
                "sha256": _sha256_file(destination),
            }
        )
    return files


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(tmp, path)


# --- comparing projections ------------------------------------------------------------------


def projection_digest(engine: Engine) -> dict[str, str]:
    """SHA-256 of every read-model table (and the checkpoint), rows in primary-key order:
    two databases that folded the same log give the same digests."""
    found = {}
    with engine.connect() as conn:
        for table in (*tables.READ_MODELS, tables.checkpoints):
            digest = hashlib.sha256()
            query = select(table).order_by(*table.primary_key.columns)
            for row in conn.execute(query):
                line = json.dumps(list(row), sort_keys=True, default=str, separators=(",", ":"))
                digest.update(line.encode() + b"\n")
            found[table.name] = digest.hexdigest()
    return found


# --- restore --------------------------------------------------------------------------------


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the backup at `path`, after checking every file against its SHA-256."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise BackupError(f"{path} is not a backup: no {MANIFEST} (made by `hpc-ds1 backup`)")
    try:
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as error:
        raise BackupError(f"{manifest_path} is not valid JSON: {error}") from None
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise BackupError(
            f"{manifest_path}: format {manifest.get('format')!r} version "
            f"{manifest.get('format_version')!r}; this version reads {FORMAT!r} version "
            f"{FORMAT_VERSION}"
        )
    checks = [(path / EVENTS, manifest["events"]["sha256"])]
    checks += [(path / o["file"], o["sha256"]) for o in manifest["objects"]]
    checks += [(path / MODELS / m["path"], m["sha256"]) for m in manifest["models"]]
    checks += [(path / ARCHIVE / a["path"], a["sha256"]) for a in manifest.get("archive", [])]
    for file, digest in checks:
        if not file.is_file():
            raise BackupError(f"the backup is incomplete: {file} is missing")
        if _sha256_file(file) != digest:
            raise BackupError(f"the backup is damaged: {file} does not match its SHA-256")
    return manifest


def check_prefix(manifest: dict[str, Any], prefix: str) -> None:
    """The events' subjects start with the source's prefix: the target must use the same."""
    source = manifest["source"]["subject_prefix"]
    if source != prefix:
        raise BackupError(
            f"the backup's events use subject prefix {source!r}, this target {prefix!r}: "
            f"set HPC_DS1_SUBJECT_PREFIX={source}"
        )


async def check_empty(bus: EventBus, settings: Settings, engine: Engine) -> None:
    """A restore goes only into an empty target: no event in the stream, no model in the
    bucket or the home's models folder, nothing projected."""
    problems = []
    info = await bus.js.stream_info(bus.stream)
    if int(info.state.last_seq) > 0:
        problems.append(f"stream {bus.stream!r} holds {info.state.messages} events")
    store = await models_bucket(bus.js, settings, create=False)
    if store is not None:
        try:
            if [o for o in await store.list() if not o.deleted]:
                problems.append(f"the model bucket of stream {bus.stream!r} holds models")
        except NotFoundError:
            pass
    if any(_walk(settings.models_dir)):
        problems.append(f"{settings.models_dir} holds files")
    if any(_walk(settings.home / ARCHIVE)):
        problems.append(f"{settings.home / ARCHIVE} holds archive segments")

    def projected() -> int:
        with engine.connect() as conn:
            value = conn.execute(select(func.max(tables.checkpoints.c.last_seq))).scalar()
            rows = conn.execute(select(func.count()).select_from(tables.events)).scalar()
        return int(value or 0) + int(rows or 0)

    if await asyncio.to_thread(projected):
        problems.append("the database already holds a projection")
    if problems:
        raise BackupError(
            "restore needs an empty target, but "
            + "; ".join(problems)
            + ": restore into a new HPC_DS1_HOME (or a new HPC_DS1_STREAM and database)"
        )


def _events(path: Path) -> Iterator[dict[str, Any]]:
    with (path / EVENTS).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            try:
                yield json.loads(line)
            except json.JSONDecodeError as error:
                raise BackupError(f"{path / EVENTS} line {number}: {error}") from None


def _republished_headers(headers: dict[str, str], seen_ids: set[str]) -> dict[str, str]:
    kept = {k: v for k, v in headers.items() if not k.startswith(_CHECK_HEADERS)}
    msg_id = kept.get("Nats-Msg-Id")
    if msg_id is not None:
        if msg_id in seen_ids:
            # The same id appended twice, further apart than the duplicate window: a replay
            # inside the window would drop the second one and shift every later sequence.
            kept.pop("Nats-Msg-Id")
            kept["Hpc-Restored-Msg-Id"] = msg_id
        seen_ids.add(msg_id)
    return kept


async def restore(
    bus: EventBus,
    settings: Settings,
    path: Path,
    progress: Callable[[int, int], None] | None = None,
    window: int = 256,
) -> Summary:
    """Append every event of the backup at `path` into the (empty) stream with its original
    sequence, and put the model artifacts back into the bucket and the home's models folder.
    The caller checks the target is empty first (check_empty) and rebuilds the projection."""
    manifest = await asyncio.to_thread(read_manifest, path)
    events = manifest["events"]
    check_prefix(manifest, bus.prefix)
    total = int(events["count"])
    js = bus.js
    next_seq = 1
    held = 0
    fillers: list[int] = []
    seen_ids: set[str] = set()
    done = 0

    async def flush(chunk: list[dict[str, Any]]) -> None:
        acks = await asyncio.gather(
            *(
                js.publish(
                    r["subject"],
                    base64.b64decode(r["data"]),
                    stream=bus.stream,
                    headers=r["headers"] or None,
                )
                for r in chunk
            )
        )
        for record, ack in zip(chunk, acks, strict=True):
            if int(ack.seq) != record["seq"]:
                raise BackupError(
                    f"event {record['seq']} was stored at sequence {ack.seq}: another writer "
                    f"is appending to stream {bus.stream!r}; stop it and restore into a new one"
                )

    chunk: list[dict[str, Any]] = []
    for record in _events(path):
        seq = int(record["seq"])
        if seq < next_seq:
            raise BackupError(f"{path / EVENTS}: sequence {seq} is out of order")
        if seq > next_seq:
            await flush(chunk)
            chunk = []
            next_seq = await _skip(bus, next_seq, seq, fillers)
        record["headers"] = _republished_headers(record.get("headers") or {}, seen_ids)
        chunk.append(record)
        next_seq = seq + 1
        held = seq
        if len(chunk) >= window:
            await flush(chunk)
            done += len(chunk)
            chunk = []
            if progress is not None:
                progress(done, total)
    await flush(chunk)
    done += len(chunk)
    if progress is not None:
        progress(done, total)
    last = int(events["last_seq"])
    if last >= next_seq:  # the source's last messages were deleted: keep its last sequence
        next_seq = await _skip(bus, next_seq, last + 1, fillers)
    for seq in fillers:
        await js.delete_msg(bus.stream, seq)
    objects = await _restore_objects(bus, settings, path, manifest["objects"])
    await asyncio.to_thread(_restore_models, path / MODELS, settings.models_dir, manifest["models"])
    await asyncio.to_thread(
        _restore_models, path / ARCHIVE, settings.home / ARCHIVE, manifest.get("archive", [])
    )
    info = await js.stream_info(bus.stream)
    if int(info.state.last_seq) != last or int(info.state.messages) != total:
        raise BackupError(
            f"after the restore stream {bus.stream!r} holds {info.state.messages} events up to "
            f"sequence {info.state.last_seq}; the backup has {total} up to {last}"
        )
    return Summary(
        path,
        total,
        int(events["first_seq"]),
        last,
        len(events["gaps"]),
        objects,
        len(manifest["models"]),
        held,
    )


async def _skip(bus: EventBus, next_seq: int, target: int, fillers: list[int]) -> int:
    """Make the next append land at `target`: from an empty stream by a purge that moves its
    first sequence, otherwise with placeholder messages deleted at the end of the restore."""
    info = await bus.js.stream_info(bus.stream)
    if int(info.state.last_seq) == 0:
        await bus.js.purge_stream(bus.stream, seq=target)
        return target
    subject = f"{bus.prefix}.{_GAP_SUBJECT}"
    for seq in range(next_seq, target):
        ack = await bus.js.publish(subject, b"", stream=bus.stream)
        if int(ack.seq) != seq:
            raise BackupError(
                f"a placeholder for deleted sequence {seq} landed at {ack.seq}: another writer "
                f"is appending to stream {bus.stream!r}"
            )
        fillers.append(seq)
    return target


async def _restore_objects(
    bus: EventBus, settings: Settings, path: Path, objects: list[dict[str, Any]]
) -> int:
    if not objects:
        return 0
    store = await models_bucket(bus.js, settings)
    assert store is not None
    for item in objects:
        data = await asyncio.to_thread((path / item["file"]).read_bytes)
        await store.put(str(item["name"]), data)
    return len(objects)


def _restore_models(source: Path, target: Path, files: list[dict[str, Any]]) -> None:
    for item in files:
        destination = target / item["path"]
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / item["path"], destination)
