"""The audit file: every event, one JSON object a line, each line chained to the previous one by
its SHA-256 so that an edited, removed or reordered line is detected by `verify`.

The chain alone cannot see a file cut short, emptied, or edited with the chain recomputed, so
`verify_against_log` also compares the file with the log it came from: every line must be the
record of the log's event at that place (`audit_record` is a pure function of the stored
message), and the file must reach the last `audit.checkpoint` event the projector appended
(its anchor: a sequence and the head hash there) and the projection's checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..log import get_logger

log = get_logger("audit")

GENESIS = "0" * 64
FILE_MODE = 0o600
# The keys of a stored event envelope: a record made from anything else is kept as raw text,
# so a message can never bring its own `seq`, `prev` or `hash` into the chain.
ENVELOPE_KEYS = frozenset(
    (
        "id",
        "type",
        "version",
        "subject",
        "time",
        "actor",
        "source",
        "correlation_id",
        "causation_id",
        "data",
    )
)
ANCHOR_TYPE = "audit.checkpoint"


def canonical(record: dict[str, Any]) -> str:
    """Sorted keys, no spaces: the exact text that is hashed."""
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS, default=str).decode()


def line_hash(prev: str, record: dict[str, Any]) -> str:
    return hashlib.sha256((prev + canonical(record)).encode()).hexdigest()


# Digits to b"0", anything else to b"x": a run of 20 digits (a number that may be past 64 bits)
# is then a plain substring search, about ten times faster than a regular expression here.
_DIGITS = bytes(48 if 48 <= b <= 57 else 120 for b in range(256))
_TWENTY_DIGITS = b"0" * 20
_U64 = 2**64


def _exact(data: bytes) -> bool:
    """Whether every integer in the JSON text fits the 64 bits orjson keeps exactly."""

    def check(text: str) -> int:
        value = int(text)
        if not -_U64 < value < _U64:
            raise OverflowError(text)
        return value

    try:
        json.loads(data, parse_int=check)
    except (OverflowError, ValueError):
        return False
    return True


def parse_exact(data: bytes) -> Any:
    """The JSON value of a stored message as orjson reads it; None when it is not JSON or holds
    an integer past 64 bits (orjson would turn it into a float). Never raises."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if _TWENTY_DIGITS in data.translate(_DIGITS) and not _exact(data):
        return None
    return parsed


_UNPARSED: Any = object()


def audit_record(seq: int, subject: str, data: bytes, parsed: Any = _UNPARSED) -> dict[str, Any]:
    """The audit record of one stored message, from its bytes alone (never from what Postgres
    made of it), so that `verify_against_log` can recompute it. Never raises. `parsed` is
    `parse_exact(data)` when the caller has it already (the projector parses each event once)."""
    if parsed is _UNPARSED:
        parsed = parse_exact(data)
    if (
        isinstance(parsed, dict)
        and ENVELOPE_KEYS.issuperset(parsed)
        and parsed.get("subject") == subject  # else the line would show a subject it never had
    ):
        # What orjson parsed, orjson writes back (integers past 64 bits were kept out above).
        return {"seq": seq, **parsed}
    return {
        "seq": seq,
        "subject": subject,
        "malformed": True,
        "raw": data.decode("utf-8", errors="replace"),
    }


def _record_of(raw: bytes) -> dict[str, Any] | None:
    if not raw.endswith(b"\n"):
        return None
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or "hash" not in record or "seq" not in record:
        return None
    return record


def _scan(path: Path) -> tuple[int, int, dict[str, Any] | None]:
    """(lines, where a torn last line starts or -1, last readable record) of an audit file.
    Only the last line counts as torn: a bad line further up is left for `verify` to report."""
    count = 0
    torn_at = -1
    last: dict[str, Any] | None = None
    with path.open("rb") as handle:
        offset = 0
        for raw in handle:
            record = _record_of(raw)
            torn_at = offset if record is None else -1
            offset += len(raw)
            if record is not None:
                last = record
                count += 1
    return count, torn_at, last


class AuditFile:
    """Appends records with a `prev`/`hash` chain; knows the last sequence it holds, so a batch
    replayed after a crash is not written twice. A last line torn by a crash mid-write is cut
    off when the file is opened (the projector then writes it again from the log)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last_seq = 0
        self.last_hash = GENESIS
        self.last_type: str | None = None
        self.lines = 0
        self.repaired = 0  # bytes cut off a torn last line when opened
        if path.exists():
            os.chmod(path, FILE_MODE)
            count, torn_at, last = _scan(path)
            if torn_at >= 0:
                size = path.stat().st_size
                with path.open("r+b") as handle:
                    handle.truncate(torn_at)
                    handle.flush()
                    os.fsync(handle.fileno())
                self.repaired = size - torn_at
                log.warning(
                    "audit_torn_line_repaired",
                    path=str(path),
                    kept_lines=count,
                    cut_bytes=self.repaired,
                )
            self.lines = count
            if last is not None:
                self.last_seq = int(last["seq"])
                self.last_hash = str(last["hash"])
                self.last_type = last.get("type") if isinstance(last.get("type"), str) else None

    def append(self, records: Iterable[dict[str, Any]]) -> int:
        """Write the records whose `seq` is beyond what the file holds; fsync; return the count."""
        lines: list[bytes] = []
        last_hash, last_seq = self.last_hash, self.last_seq
        last: dict[str, Any] | None = None
        for record in records:
            seq = int(record["seq"])
            if seq <= last_seq:
                continue
            if "prev" in record or "hash" in record:
                body = {k: v for k, v in record.items() if k not in ("prev", "hash")}
                body["prev"] = last_hash
            else:  # as audit_record makes them
                body = {**record, "prev": last_hash}
            # canonical(body), kept as bytes: hashed and written without a decode and encode.
            text = orjson.dumps(body, option=orjson.OPT_SORT_KEYS, default=str)
            digest = hashlib.sha256(last_hash.encode() + text).hexdigest()
            # The line is the hashed text with the hash appended as its last member.
            lines.append(b'%s,"hash":"%s"}' % (text[:-1], digest.encode()))
            last_hash, last_seq, last = digest, seq, record
        if last is not None:
            self.last_hash, self.last_seq = last_hash, last_seq
            self.last_type = last.get("type") if isinstance(last.get("type"), str) else None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
            with os.fdopen(fd, "wb") as handle:
                handle.write(b"\n".join(lines) + b"\n")
                handle.flush()
                os.fsync(handle.fileno())
            self.lines += len(lines)
        return len(lines)


@dataclass(frozen=True)
class Verdict:
    intact: bool
    lines: int
    broken_at: int | None = None
    problem: str | None = None
    last_seq: int = 0
    detail: str | None = None


def read_chain(path: Path, size: int | None = None) -> tuple[Verdict | None, list[tuple[int, str]]]:
    """Check the chain line by line, in the file's first `size` bytes (default: all of it);
    (a broken verdict or None, [(seq, hash)] per line)."""
    prev = GENESIS
    heads: list[tuple[int, str]] = []
    for number, raw in enumerate(_lines(path, size), start=1):
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            return Verdict(False, number, number, "not a JSON object"), heads
        stated = record.pop("hash", None)
        if record.get("prev") != prev:
            return Verdict(False, number, number, "does not follow the previous line"), heads
        try:
            computed = line_hash(prev, record)
        except TypeError:
            computed = None
        if stated != computed:
            return Verdict(False, number, number, "content does not match its hash"), heads
        seq = record.get("seq")
        if not isinstance(seq, int):
            return Verdict(False, number, number, "has no sequence number"), heads
        heads.append((seq, str(stated)))
        prev = str(stated)
    return None, heads


def _lines(path: Path, size: int | None) -> Iterator[bytes]:
    with path.open("rb") as handle:
        if size is None:
            yield from handle
            return
        left = size
        while left > 0 and (raw := handle.readline(left)):
            left -= len(raw)
            yield raw


def verify(path: Path) -> Verdict:
    """Check the whole chain; report the first line (1-based) where it breaks. This alone does
    not see a file cut short: `verify_against_log` does."""
    if not path.exists():
        return Verdict(False, 0, None, f"{path} does not exist")
    broken, heads = read_chain(path)
    if broken is not None:
        return broken
    return Verdict(True, len(heads), last_seq=heads[-1][0] if heads else 0)


@dataclass
class LogChain:
    """The chain recomputed from the log, fed one stored message at a time, in order."""

    prev: str = GENESIS
    entries: list[tuple[int, str]] = field(default_factory=list)  # (seq, hash) per event
    anchor: tuple[int, int, str] | None = None  # (anchor's own seq, anchored seq, hash)

    def feed(self, seq: int, subject: str, data: bytes) -> None:
        record = audit_record(seq, subject, data)
        body = {**record, "prev": self.prev}
        self.prev = line_hash(self.prev, body)
        self.entries.append((seq, self.prev))
        if record.get("type") == ANCHOR_TYPE and isinstance(record.get("data"), dict):
            anchored = record["data"]
            if isinstance(anchored.get("seq"), int) and isinstance(anchored.get("hash"), str):
                self.anchor = (seq, anchored["seq"], anchored["hash"])


def verify_against_log(
    path: Path, chain: LogChain, projected_to: int | None = None, size: int | None = None
) -> Verdict:
    """The file against the log: its chain intact, each line the record of the log's event at
    that place, and the file reaching the last anchor and `projected_to` (the projection's
    checkpoint, when known). Lines may stop short of the log's end only below both. `size`: the
    file's length when it was looked at, before the log was read (lines written since are not
    judged; default: all of it)."""
    if not path.exists():
        return Verdict(False, 0, None, f"{path} does not exist")
    broken, heads = read_chain(path, size)
    if broken is not None:
        return broken
    for number, ((seq, digest), (log_seq, log_digest)) in enumerate(
        zip(heads, chain.entries, strict=False), start=1
    ):
        if seq != log_seq:
            return Verdict(
                False,
                len(heads),
                number,
                f"holds seq {seq} where the log has seq {log_seq} (a line removed or added, "
                "and the chain recomputed)",
            )
        if digest != log_digest:
            return Verdict(
                False,
                len(heads),
                number,
                f"seq {seq} differs from the event in the log (edited, and the chain recomputed)",
            )
    if len(heads) > len(chain.entries):
        extra = heads[len(chain.entries)][0]
        return Verdict(False, len(heads), len(chain.entries) + 1, f"seq {extra} is not in the log")
    last_seq = heads[-1][0] if heads else 0
    ends = f"the file ends at seq {last_seq} ({len(heads)} lines)" if heads else "the file is empty"
    if chain.anchor is not None:
        anchor_seq, anchored, anchored_hash = chain.anchor
        expected = dict(chain.entries).get(anchored)
        if expected != anchored_hash:
            return Verdict(
                False,
                len(heads),
                None,
                f"the log's anchor at seq {anchor_seq} holds hash {anchored_hash[:12]}… for seq "
                f"{anchored}, but the log's events give {str(expected)[:12]}…: the file the "
                "projector wrote then differed from the log",
                last_seq,
            )
        if last_seq < anchored:
            return Verdict(
                False,
                len(heads),
                None,
                f"truncated: {ends}, but the projector anchored seq {anchored} with hash "
                f"{anchored_hash[:12]}… in the log (event seq {anchor_seq})",
                last_seq,
            )
    if projected_to is not None and last_seq < projected_to:
        return Verdict(
            False,
            len(heads),
            None,
            f"truncated: {ends}, but the projection holds the events up to seq {projected_to}",
            last_seq,
        )
    behind = len(chain.entries) - len(heads)
    detail = f"matches the log up to seq {last_seq}"
    if chain.anchor is not None:
        detail += f"; last anchor seq {chain.anchor[1]}"
    if behind:
        detail += f"; {behind} later event(s) not written yet"
    return Verdict(True, len(heads), last_seq=last_seq, detail=detail)
