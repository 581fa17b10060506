"""The audit file: every event, one JSON object a line, each line chained to the previous one by
its SHA-256 so that an edited, removed or reordered line is detected by `verify`."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

GENESIS = "0" * 64


def canonical(record: dict[str, Any]) -> str:
    """Sorted keys, no spaces: the exact text that is hashed."""
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS, default=str).decode()


def line_hash(prev: str, record: dict[str, Any]) -> str:
    return hashlib.sha256((prev + canonical(record)).encode()).hexdigest()


def _last_line(path: Path) -> bytes | None:
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        end = handle.tell()
        block = b""
        position = end
        while position > 0:
            step = min(4096, position)
            position -= step
            handle.seek(position)
            block = handle.read(step) + block
            lines = block.rstrip(b"\n").split(b"\n")
            if len(lines) > 1 or position == 0:
                return lines[-1] or None
    return None


class AuditFile:
    """Appends records with a `prev`/`hash` chain; knows the last sequence it holds, so a batch
    replayed after a crash is not written twice."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last_seq = 0
        self.last_hash = GENESIS
        if path.exists():
            tail = _last_line(path)
            if tail:
                last = json.loads(tail)
                self.last_seq = int(last.get("seq", 0))
                self.last_hash = str(last["hash"])

    def append(self, records: Iterable[dict[str, Any]]) -> int:
        """Write the records whose `seq` is beyond what the file holds; fsync; return the count."""
        lines = []
        for record in records:
            if int(record["seq"]) <= self.last_seq:
                continue
            body = {k: v for k, v in record.items() if k not in ("prev", "hash")}
            body["prev"] = self.last_hash
            text = canonical(body)
            digest = hashlib.sha256((self.last_hash + text).encode()).hexdigest()
            # The line is the hashed text with the hash appended as its last member.
            lines.append(f'{text[:-1]},"hash":"{digest}"}}')
            self.last_hash, self.last_seq = digest, int(record["seq"])
        if lines:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        return len(lines)


@dataclass(frozen=True)
class Verdict:
    intact: bool
    lines: int
    broken_at: int | None = None
    problem: str | None = None


def verify(path: Path) -> Verdict:
    """Check the whole chain; report the first line (1-based) where it breaks."""
    prev = GENESIS
    count = 0
    if not path.exists():
        return Verdict(False, 0, None, f"{path} does not exist")
    with path.open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            count = number
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                return Verdict(False, number, number, "not a JSON object")
            stated = record.pop("hash", None)
            if record.get("prev") != prev:
                return Verdict(False, number, number, "does not follow the previous line")
            if stated != line_hash(prev, record):
                return Verdict(False, number, number, "content does not match its hash")
            prev = stated
    return Verdict(True, count)
