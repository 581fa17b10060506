"""AuditFile.append writes each line as the chain defines it: the canonical text of the record
with `prev`, hashed with the previous hash, the hash appended as the last member."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_ds1.eventlog.audit import GENESIS, AuditFile, audit_record, canonical, verify

TEXT = st.text(max_size=8)
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), TEXT)


def lines_of(path: Path) -> list[str]:
    """Split on newlines only (str.splitlines also splits on U+0085, U+2028, ...)."""
    return path.read_bytes().decode("utf-8").split("\n")[:-1]


def expected_lines(records: list[dict[str, Any]]) -> list[str]:
    prev, lines = GENESIS, []
    for record in records:
        body = {k: v for k, v in record.items() if k not in ("prev", "hash")}
        body["prev"] = prev
        text = canonical(body)
        prev = hashlib.sha256((prev + text).encode()).hexdigest()
        lines.append(f'{text[:-1]},"hash":"{prev}"}}')
    return lines


@settings(max_examples=60, deadline=None)
@given(
    bodies=st.lists(st.dictionaries(TEXT, VALUES, max_size=4), min_size=1, max_size=6),
    own_chain=st.booleans(),
)
def test_lines_are_the_chain_of_canonical_texts(
    tmp_path_factory: Any, bodies: list[dict[str, Any]], own_chain: bool
) -> None:
    records = []
    for seq, body in enumerate(bodies, start=1):
        record = {**body, "seq": seq}
        if own_chain:  # a record may not bring its own prev or hash into the chain
            record.update(prev="forged", hash="forged")
        records.append(record)
    path = Path(tmp_path_factory.mktemp("audit")) / "audit.jsonl"
    audit = AuditFile(path)
    assert audit.append(records[:2]) == len(records[:2])
    assert audit.append(records) == len(records) - len(records[:2])  # the first two skipped
    assert lines_of(path) == expected_lines(records)
    assert verify(path).intact
    assert audit.last_seq == len(records) and audit.lines == len(records)
    reopened = AuditFile(path)
    assert (reopened.last_seq, reopened.last_hash) == (audit.last_seq, audit.last_hash)


def test_an_event_record_with_unicode_and_big_numbers(tmp_path: Path) -> None:
    data = json.dumps(
        {
            "id": "e1",
            "type": "x.y",
            "version": 1,
            "subject": "p.x.y",
            "time": "2026-01-01T00:00:00Z",
            "actor": "é\u2028😀",
            "source": "s",
            "data": {"n": 2**63 - 1, "f": 0.1, "s": 'a\nb"c'},
        }
    ).encode()
    records = [audit_record(1, "p.x.y", data), audit_record(2, "p.x.y", b"\xff not json")]
    audit = AuditFile(tmp_path / "a.jsonl")
    audit.append(records)
    assert lines_of(tmp_path / "a.jsonl") == expected_lines(records)
    assert audit.last_type is None  # the last record is a malformed one
