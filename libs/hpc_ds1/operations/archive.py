"""Retention without losing the audit trail: `hpc-ds1 archive --before DATE` (issue 46).

Old events leave the live stream for compressed archive segments in `$HPC_DS1_HOME/archive/`,
and everything that reads the whole log reads the segments with it, in sequence order
(`merged`): `audit verify`, `projection rebuild`, the projector catching up, backup and
restore. Postgres keeps its rows; the audit file keeps every line.

Only what no service folds again into its live state leaves: decisions and run heartbeats
older than the cut, and whole finished tuning sessions with their approvals. Devices, tokens,
measurements, models, tasks and audit anchors stay in the stream: the coordinator, placement,
the gateway and the decision service rebuild their state from those at every start (tasks and
measurements are what placement learns a device's speed from).

A segment is two files: `events-NNNNNN.jsonl.gz` (one stored message a line: seq, subject,
headers, data in base64, as a backup holds them) and `events-NNNNNN.json`, its manifest: the
count, first and last sequence, the SHA-256 of the compressed file, the audit chain's hash at
its last event, and the SHA-256 of the previous segment's manifest (`previous`), so that the
segments form a chain of their own: a segment removed, replaced or reordered breaks it. The
content is checked against the audit file by `audit verify`, which recomputes the log's chain
over the segments and the live stream together (the anchors in the stream span the boundary).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import heapq
import json
import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from ..eventlog.audit import GENESIS
from ..eventlog.bus import EventBus, RawEvent

FOLDER = "archive"
FORMAT = "hpc-ds1-archive"
FORMAT_VERSION = 1
LEAF_AGGREGATES = ("decision", "run")  # appended once, never folded again into live state
FILE_MODE = 0o600


class ArchiveError(Exception):
    """An archive segment that is missing, damaged or out of its chain; says which and why."""


@dataclass(frozen=True)
class Segment:
    number: int
    events: Path
    manifest: Path
    info: dict[str, Any]

    @property
    def first_seq(self) -> int:
        return int(self.info["first_seq"])

    @property
    def last_seq(self) -> int:
        return int(self.info["last_seq"])

    @property
    def count(self) -> int:
        return int(self.info["count"])


def folder_of(home: Path) -> Path:
    return home / FOLDER


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def segments(folder: Path, check_files: bool = True) -> list[Segment]:
    """The folder's segments in order, each checked against its manifest and the chain of
    manifests (ArchiveError naming the first that is not). No folder: no segments.
    `check_files=False`: the manifests and their chain only, without hashing the events."""
    if not folder.is_dir():
        return []
    found: list[Segment] = []
    previous = GENESIS
    manifests = sorted(folder.glob("events-*.json"))
    for number, manifest in enumerate(manifests, start=1):
        expected = folder / f"events-{number:06d}.json"
        if manifest != expected:
            raise ArchiveError(
                f"{manifest.name}: expected {expected.name} next: a segment is missing or renamed"
            )
        try:
            text = manifest.read_bytes()
            info = json.loads(text)
        except (OSError, ValueError) as error:
            raise ArchiveError(f"{manifest}: not a readable manifest ({error})") from None
        if info.get("format") != FORMAT:
            raise ArchiveError(f"{manifest}: not an archive manifest (format {FORMAT!r})")
        if info.get("previous") != previous:
            raise ArchiveError(
                f"{manifest.name}: its 'previous' does not match the SHA-256 of the segment "
                "before it: a segment was removed, replaced or reordered"
            )
        events = folder / str(info.get("file", ""))
        if not events.is_file():
            raise ArchiveError(f"{manifest.name}: its events file {events.name} is missing")
        if check_files and _sha256(events) != info.get("sha256"):
            raise ArchiveError(f"{events}: does not match the SHA-256 in {manifest.name}")
        found.append(Segment(number, events, manifest, info))
        previous = hashlib.sha256(text).hexdigest()
    return found


def _read(segment: Segment) -> Iterator[tuple[RawEvent, dict[str, str]]]:
    last = 0
    count = 0
    with gzip.open(segment.events, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                record = orjson.loads(line)
                event = RawEvent(
                    int(record["seq"]), str(record["subject"]), base64.b64decode(record["data"])
                )
                headers = dict(record.get("headers") or {})
            except (ValueError, KeyError, TypeError) as error:
                raise ArchiveError(
                    f"{segment.events}: line {number} is not an event ({error})"
                ) from None
            if event.seq <= last:
                raise ArchiveError(f"{segment.events}: line {number}: sequence out of order")
            last = event.seq
            count += 1
            yield event, headers
    if count != segment.count or (count and last != segment.last_seq):
        raise ArchiveError(
            f"{segment.events}: holds {count} events up to seq {last}; its manifest says "
            f"{segment.count} up to {segment.last_seq}"
        )


def archived(folder: Path, start: int = 1) -> Iterator[RawEvent]:
    """Every archived event at or after `start`, in sequence order over all the segments."""
    streams = [(event for event, _ in _read(s)) for s in segments(folder) if s.last_seq >= start]
    for event in heapq.merge(*streams, key=lambda e: e.seq):
        if event.seq >= start:
            yield event


def last_archived(folder: Path) -> int:
    """The highest sequence any segment holds (0: none)."""
    return max((s.last_seq for s in segments(folder, check_files=False)), default=0)


async def merged(
    bus: EventBus,
    folder: Path | None,
    start: int = 1,
    stop_at: int | None = None,
    batch: int = 2000,
) -> AsyncIterator[list[RawEvent]]:
    """The whole log from `start` to `stop_at` (default: the stream's end now): the archive's
    segments and the live stream merged in sequence order, in chunks of about `batch`."""
    stop_at = await bus.last_sequence() if stop_at is None else stop_at
    old = archived(folder, start) if folder is not None else iter(())
    pending = next(old, None)
    async for chunk in bus.replay(start, stop_at=stop_at, batch=batch):
        out: list[RawEvent] = []
        for event in chunk:
            while pending is not None and pending.seq < event.seq:
                out.append(pending)
                pending = next(old, None)
            if pending is not None and pending.seq == event.seq:
                raise ArchiveError(f"seq {event.seq} is both in the archive and in the live stream")
            out.append(event)
        yield out
    rest: list[RawEvent] = []
    while pending is not None and pending.seq <= stop_at:
        rest.append(pending)
        if len(rest) >= batch:
            yield rest
            rest = []
        pending = next(old, None)
    if rest:
        yield rest


# --- choosing what leaves ------------------------------------------------------------------


@dataclass
class Plan:
    """What an archive run moves: every event below `cut` of the leaf aggregates, and the
    finished sessions (with their approvals), by id."""

    cut: int  # first sequence kept for the leaf aggregates
    sessions: set[str]
    approvals: set[str]

    def takes(self, seq: int, subject: str) -> bool:
        parts = subject.split(".")
        if len(parts) != 4 or seq >= self.cut:
            return False
        aggregate, aggregate_id = parts[1], parts[2]
        if aggregate in LEAF_AGGREGATES:
            return True
        if aggregate == "session":
            return aggregate_id in self.sessions
        if aggregate == "approval":
            return aggregate_id in self.approvals
        return False


class Planner:
    """Builds the `Plan` from the log's events fed in order (pure): the cut is the first event
    at or after `before`, or the projection's checkpoint + 1 when that comes first (an event
    not yet folded into Postgres and the audit file never leaves). A session leaves when it
    finished before the cut; an approval when its session leaves."""

    def __init__(self, before: datetime, projected_to: int) -> None:
        self.before = before
        self.cut = projected_to + 1
        self.finished: set[str] = set()
        self.approvals: dict[str, str] = {}
        self.done = False

    def feed(self, event: RawEvent) -> bool:
        """Take one event; False once the cut is found (nothing after it matters)."""
        if self.done or event.seq >= self.cut:
            self.done = True
            return False
        try:
            envelope = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return True  # a malformed event stays where it is
        if not isinstance(envelope, dict):
            return True
        when = envelope.get("time")
        if isinstance(when, str):
            try:
                at: datetime | None = datetime.fromisoformat(when)
            except ValueError:
                at = None
            if at is not None and at.tzinfo is not None and at >= self.before:
                self.cut, self.done = event.seq, True
                return False
        kind = envelope.get("type")
        data = envelope.get("data")
        if not isinstance(data, dict):
            return True
        if kind == "session.finished" and isinstance(data.get("session_id"), str):
            self.finished.add(data["session_id"])
        elif kind == "approval.requested" and isinstance(data.get("approval_id"), str):
            session = data.get("session_id")
            if isinstance(session, str):
                self.approvals[data["approval_id"]] = session
        return True

    def plan(self) -> Plan:
        leaving = {a for a, s in self.approvals.items() if s in self.finished}
        return Plan(self.cut, set(self.finished), leaving)


def plan(events: Iterable[RawEvent], before: datetime, projected_to: int) -> Plan:
    """The plan over `events` in order (`Planner`)."""
    planner = Planner(before, projected_to)
    for event in events:
        if not planner.feed(event):
            break
    return planner.plan()


# --- writing -------------------------------------------------------------------------------


class SegmentWriter:
    """Writes the next segment one event at a time (a year of events never sits in memory).
    The manifest is written last, after the events file is on disk, so a crash leaves at most
    an events file without a manifest, which the next run overwrites."""

    def __init__(self, folder: Path, before: str) -> None:
        self.existing = segments(folder)
        self.folder, self.before = folder, before
        self.number = len(self.existing) + 1
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        self.events = folder / f"events-{self.number:06d}.jsonl.gz"
        fd = os.open(self.events, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        self._raw = os.fdopen(fd, "wb")
        self._out = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0)
        self.count = self.first = self.last = 0

    def add(self, seq: int, subject: str, headers: dict[str, str], data: bytes) -> None:
        if seq <= self.last:
            raise ArchiveError(f"seq {seq} comes after seq {self.last}: out of order")
        line = {
            "seq": seq,
            "subject": subject,
            "headers": headers,
            "data": base64.b64encode(data).decode("ascii"),
        }
        self._out.write(orjson.dumps(line) + b"\n")
        self.first = self.first or seq
        self.last = seq
        self.count += 1

    def close(self, audit_hash: Callable[[int], str | None]) -> Segment | None:
        """Finish the segment (None, and no file, when nothing was added). `audit_hash`: the
        audit chain's hash at a sequence, recorded at the segment's last event."""
        self._out.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        if not self.count:
            self.events.unlink()
            return None
        previous = (
            hashlib.sha256(self.existing[-1].manifest.read_bytes()).hexdigest()
            if self.existing
            else GENESIS
        )
        info = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "file": self.events.name,
            "before": self.before,
            "count": self.count,
            "first_seq": self.first,
            "last_seq": self.last,
            "sha256": _sha256(self.events),
            "audit_hash": audit_hash(self.last),
            "previous": previous,
        }
        manifest = self.folder / f"events-{self.number:06d}.json"
        tmp = manifest.with_suffix(".json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(info, handle, indent=1, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, manifest)
        return Segment(self.number, self.events, manifest, info)


def check_audit_heads(folder: Path, heads: dict[int, str]) -> str | None:
    """Each segment's recorded audit hash against the chain recomputed over the whole log
    (`heads`: seq -> hash); the first mismatch, described, or None."""
    for segment in segments(folder):
        stated = segment.info.get("audit_hash")
        if stated is None:
            continue
        found = heads.get(segment.last_seq)
        if found != stated:
            return (
                f"{segment.manifest.name}: the audit chain at seq {segment.last_seq} was "
                f"{str(stated)[:12]}… when it was archived; the log now gives "
                f"{str(found)[:12]}…"
            )
    return None


# --- running ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one archive run did (or, dry, would do)."""

    cut: int
    events: int
    sessions: int
    approvals: int
    segment: str | None
    first_seq: int = 0
    last_seq: int = 0
    resumed: bool = False  # the previous run's purge was finished first


def audit_hash_at(path: Path, seq: int) -> str | None:
    """The audit file's chain hash on the line of `seq` (None: no such line)."""
    if not path.exists():
        return None
    with path.open("rb") as handle:
        for raw in handle:
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("seq") == seq:
                found = record.get("hash")
                return found if isinstance(found, str) else None
    return None


def _subjects(bus: EventBus) -> list[str]:
    return [f"{bus.prefix}.{a}.>" for a in (*LEAF_AGGREGATES, "session", "approval")]


async def _purge(bus: EventBus, segment: Segment) -> None:
    """Remove the segment's events from the stream (idempotent: a second purge of the same
    segment removes nothing more). Leaf aggregates by sequence, sessions and approvals by id."""
    leaf_cut: dict[str, int] = {}
    ids: set[tuple[str, str]] = set()
    for event, _ in _read(segment):
        _, aggregate, aggregate_id, _ = event.subject.split(".", 3)
        if aggregate in LEAF_AGGREGATES:
            leaf_cut[aggregate] = max(leaf_cut.get(aggregate, 0), event.seq + 1)
        else:
            ids.add((aggregate, aggregate_id))
    for aggregate, cut in sorted(leaf_cut.items()):
        await bus.js.purge_stream(bus.stream, seq=cut, subject=f"{bus.prefix}.{aggregate}.>")
    for aggregate, aggregate_id in sorted(ids):
        await bus.js.purge_stream(
            bus.stream, subject=bus.aggregate_subjects(aggregate, aggregate_id)
        )


async def archive_before(
    bus: EventBus,
    home: Path,
    audit_path: Path,
    before: datetime,
    projected_to: int,
    dry_run: bool = False,
) -> Outcome:
    """Move what may leave (see the module) from before `before` into a new segment, then
    purge it from the stream. `projected_to`: the projection's checkpoint."""
    from .backup import stored_messages

    folder = folder_of(home)
    existing = segments(folder)  # a damaged archive stops the run before anything moves
    resumed = False
    if existing and not dry_run:
        # A run stopped between writing its segment and purging the stream leaves the events
        # in both places: finish that purge first.
        await _purge(bus, existing[-1])
        resumed = True
    planner = Planner(before, projected_to)
    async for chunk in bus.replay(1, stop_at=projected_to, batch=2000):
        if not all(planner.feed(event) for event in chunk):
            break
    chosen = planner.plan()
    if dry_run:
        count = 0
        async for chunk in bus.replay(1, _subjects(bus), stop_at=chosen.cut - 1):
            count += sum(chosen.takes(e.seq, e.subject) for e in chunk)
        return Outcome(chosen.cut, count, len(chosen.sessions), len(chosen.approvals), None)
    writer = SegmentWriter(folder, before.isoformat())
    try:
        if chosen.cut > 1:
            async for msg in stored_messages(bus, chosen.cut - 1):
                seq = int(msg.metadata.sequence.stream)
                if chosen.takes(seq, msg.subject):
                    writer.add(seq, msg.subject, dict(msg.headers or {}), msg.data)
    finally:
        segment = writer.close(lambda seq: audit_hash_at(audit_path, seq))
    if segment is None:
        return Outcome(chosen.cut, 0, 0, 0, None, resumed=resumed)
    segments(folder)  # read back: the new segment is whole and in the chain before the purge
    await _purge(bus, segment)
    return Outcome(
        chosen.cut,
        segment.count,
        len(chosen.sessions),
        len(chosen.approvals),
        segment.events.name,
        segment.first_seq,
        segment.last_seq,
        resumed,
    )


__all__ = [
    "FOLDER",
    "ArchiveError",
    "Outcome",
    "Plan",
    "Planner",
    "Segment",
    "SegmentWriter",
    "archive_before",
    "archived",
    "audit_hash_at",
    "check_audit_heads",
    "folder_of",
    "last_archived",
    "merged",
    "plan",
    "segments",
]
