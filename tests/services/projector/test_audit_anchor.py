"""The audit file against the log: anchors catch a file cut short, emptied, or rewritten with a
recomputed chain; a torn last line is repaired on start and written again from the log."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from hpc_ds1.cli.audit import against_log
from hpc_ds1.eventlog.audit import AuditFile, LogChain, audit_record, verify, verify_against_log
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.services.projector import Projector, rebuild
from hpc_ds1.settings import Settings

from .events import measurement
from .projection import run_until


async def log_chain(bus: EventBus) -> LogChain:
    chain = LogChain()
    async for chunk in bus.replay():
        for raw in chunk:
            chain.feed(raw.seq, raw.subject, raw.data)
    return chain


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def rewrite(path: Path, lines: list[dict[str, Any]]) -> Path:
    """The records written as a fresh file: a chain recomputed from the first line on."""
    target = path.with_name(f"{path.stem}-{len(lines)}-{id(lines)}.jsonl")
    AuditFile(target).append(
        {k: v for k, v in r.items() if k not in ("prev", "hash")} for r in lines
    )
    return target


async def test_anchors_catch_truncation_and_a_recomputed_chain(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    await bus.publish_many([measurement(bus, i) for i in range(10)])
    projector = Projector(engine, bus, AuditFile(settings.audit_path), anchor_every_s=0.0)
    # The projector anchors the file after the 10 events, then projects its own anchor (11)
    # without anchoring that one again.
    await run_until(projector, engine, 11)
    assert projector.anchors == 1
    assert await bus.last_sequence() == 11
    path = settings.audit_path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = records(path)
    assert [x["seq"] for x in lines] == list(range(1, 12))
    assert lines[10]["type"] == "audit.checkpoint"
    assert lines[10]["data"]["seq"] == 10 and lines[10]["data"]["hash"] == lines[9]["hash"]
    chain = await log_chain(bus)

    whole = verify_against_log(path, chain)
    assert whole.intact, whole
    assert whole.detail and "last anchor seq 10" in whole.detail

    text = path.read_text().splitlines(keepends=True)
    cut = path.with_name("cut.jsonl")
    for kept, ends in ((3, "ends at seq 3 (3 lines)"), (9, "ends at seq 9"), (0, "is empty")):
        cut.write_text("".join(text[:kept]))
        assert verify(cut).intact  # the chain alone sees nothing wrong
        verdict = verify_against_log(cut, chain)
        assert not verdict.intact and verdict.problem
        assert verdict.problem.startswith("truncated: ") and ends in verdict.problem
        assert "anchored seq 10" in verdict.problem
    # Below the anchor only the projection's checkpoint can tell.
    cut.write_text("".join(text[:10]))
    assert verify_against_log(cut, chain).intact
    short = verify_against_log(cut, chain, projected_to=11)
    assert not short.intact and "the projection holds the events up to seq 11" in str(short.problem)

    edited = [dict(r) for r in lines]
    edited[4]["data"] = {**edited[4]["data"], "runtime_s": 0.001}
    recomputed = rewrite(path, edited)
    assert verify(recomputed).intact
    verdict = verify_against_log(recomputed, chain)
    assert not verdict.intact and verdict.broken_at == 5
    assert "differs from the event in the log" in str(verdict.problem)

    removed = rewrite(path, lines[:3] + lines[4:])
    verdict = verify_against_log(removed, chain)
    assert not verdict.intact and verdict.broken_at == 4
    assert "where the log has seq 4" in str(verdict.problem)


async def test_a_torn_last_line_is_cut_and_written_again_from_the_log(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    await bus.publish_many([measurement(bus, i) for i in range(5)])
    path = settings.audit_path
    await run_until(Projector(engine, bus, AuditFile(path), anchor_every_s=3600), engine, 5)
    whole = path.read_bytes()
    # A crash mid-write: the last line half written.
    path.write_bytes(whole[: whole.rindex(b"\n", 0, len(whole) - 1) + 1] + whole[-90:-40])
    path.chmod(0o644)
    assert not verify(path).intact
    reopened = AuditFile(path)  # what `serve` does at start: it no longer exits on this
    assert reopened.repaired == 50 and reopened.last_seq == 4 and reopened.lines == 4
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    last = await bus.publish(measurement(bus, 5))
    await run_until(Projector(engine, bus, reopened, anchor_every_s=3600), engine, last)
    assert [x["seq"] for x in records(path)] == list(range(1, last + 1))
    assert path.read_bytes().startswith(whole)
    assert verify_against_log(path, await log_chain(bus), projected_to=last).intact


async def test_a_file_behind_a_rebuild_is_filled_from_the_log(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    """The live projector writes the events a rebuild (another process) projected past it."""
    await bus.publish_many([measurement(bus, i) for i in range(4)])
    path = settings.audit_path
    await run_until(Projector(engine, bus, AuditFile(path), anchor_every_s=3600), engine, 4)
    last = (await bus.publish_many([measurement(bus, i) for i in range(4, 8)]))[-1]
    assert await rebuild(engine, bus) == last
    assert len(records(path)) == 4
    # The checkpoint is already at the end: the projector writes the file's missing lines.
    projector = Projector(engine, bus, AuditFile(path), anchor_every_s=3600)
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    try:
        for _ in range(400):
            if len(records(path)) == last:
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    assert [x["seq"] for x in records(path)] == list(range(1, last + 1))
    assert verify_against_log(path, await log_chain(bus), projected_to=last).intact


async def test_the_live_check_holds_while_the_projector_writes_on(
    settings: Settings, engine: Engine, bus: EventBus, monkeypatch: Any
) -> None:
    """`audit verify` on a running product: the projector writes lines and moves its checkpoint
    between the check's looks at the log and at the file (seen in CI: 'seq 8 is not in the
    log')."""
    await bus.publish_many([measurement(bus, i) for i in range(5)])
    path = settings.audit_path
    await run_until(Projector(engine, bus, AuditFile(path), anchor_every_s=0.0), engine, 6)
    real_end = bus.last_sequence
    looks: list[int] = []

    async def end_then_the_projector_works_on() -> int:
        seen = await real_end()
        if not looks:  # the check's look; the projector asks too, and gets the real end
            looks.append(seen)
            await bus.publish_many([measurement(bus, i) for i in range(5, 8)])
            projector = Projector(engine, bus, AuditFile(path), anchor_every_s=0.0)
            await run_until(projector, engine, seen + 4)
        return seen

    monkeypatch.setattr(bus, "last_sequence", end_then_the_projector_works_on)

    async def checkpoint_seen_first() -> int:
        return 6

    verdict = await against_log(bus, path, checkpoint_seen_first)
    assert verdict.intact, verdict
    assert looks == [6] and verdict.last_seq == len(records(path)) >= 6 + 4
    # What it must still find: a file cut below the anchor the log held when it looked.
    monkeypatch.setattr(bus, "last_sequence", real_end)
    text = path.read_text().splitlines(keepends=True)
    path.write_text("".join(text[:3]))
    verdict = await against_log(bus, path, checkpoint_seen_first)
    assert not verdict.intact and str(verdict.problem).startswith("truncated: ")


def test_a_message_cannot_bring_its_own_seq_prev_or_hash_into_the_chain(tmp_path: Path) -> None:
    forged = b'{"seq": 99999999, "prev": "0", "hash": "f", "type": "x"}'
    record = audit_record(3, "p.junk.a.x", forged)
    assert record == {
        "seq": 3,
        "subject": "p.junk.a.x",
        "malformed": True,
        "raw": forged.decode(),
    }
    claimed = b'{"id": "a", "subject": "p.device.a.registered", "data": {}}'
    assert audit_record(4, "p.device.b.registered", claimed)["malformed"] is True
    big = b'{"id": "a", "subject": "s", "data": {"size": 100000000000000000000}}'
    assert audit_record(5, "s", big)["raw"] == big.decode()
    fits = b'{"id": "12345678901234567890123", "subject": "s", "data": {"n": 18446744073709551615}}'
    assert audit_record(6, "s", fits) == {
        "seq": 6,
        "id": "12345678901234567890123",
        "subject": "s",
        "data": {"n": 2**64 - 1},
    }
    audit = AuditFile(tmp_path / "a.jsonl")
    audit.append([audit_record(1, "p.junk.a.x", forged), record])
    assert audit.last_seq == 3 and verify(tmp_path / "a.jsonl").intact
