"""`hpc-ds1 audit verify`: whether the audit file is intact and whole, against the log."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path

from sqlalchemy import select

from ..db import make_engine, tables
from ..eventlog.audit import LogChain, Verdict, read_chain, verify, verify_against_log
from ..eventlog.bus import EventBus
from ..infra.home import use_home
from ..operations.archive import ArchiveError, check_audit_heads, folder_of, merged
from ..settings import Settings
from .common import add_home_argument, add_json_argument, load_settings, print_json


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("audit", help="check the tamper-evident audit file")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    check = actions.add_parser(
        "verify",
        help="check the file's hash chain, and the file against the log",
        description="Checks every line's hash chain, then compares the file with the event "
        "log: each line must be the log's event at that place, and the file must reach the "
        "projector's last anchor in the log and the projection's checkpoint (so a file cut "
        "short, emptied or rewritten with a recomputed chain is found).",
    )
    check.add_argument("--file", type=Path, help="default: $HPC_DS1_HOME/audit.jsonl")
    check.add_argument(
        "--chain-only",
        action="store_true",
        help="only the hash chain, without the log (does not see a file cut short)",
    )
    add_json_argument(check, "the verdict")
    add_home_argument(check)
    check.set_defaults(handler=handle_verify)


def handle_verify(args: argparse.Namespace) -> int:
    settings = load_settings(home=args.home)
    path: Path = args.file if args.file is not None else settings.audit_path
    if args.chain_only or not path.exists():
        verdict = verify(path)
    else:
        with use_home(settings) as ends:
            nats_url, database_url = ends.nats_url_for("cli"), ends.app_database_url()
            verdict = asyncio.run(_against_log(settings, path, nats_url, database_url))
    if args.json:
        print_json({**asdict(verdict), "path": str(path)})
        return 0 if verdict.intact else 1
    return _report(verdict, path)


def _report(verdict: Verdict, path: Path) -> int:
    if verdict.intact:
        more = f"; {verdict.detail}" if verdict.detail else ""
        print(f"intact: {verdict.lines} lines ({path}){more}")
        return 0
    if verdict.broken_at is None:
        print(f"not verified: {verdict.problem} ({path})")
    else:
        print(f"broken at line {verdict.broken_at}: {verdict.problem} ({path})")
    return 1


async def _against_log(settings: Settings, path: Path, nats_url: str, database_url: str) -> Verdict:
    # It only reads: it creates no stream (MissingStream when there is none).
    bus = await EventBus.connect(settings, nats_url, "audit-verify", create=False)
    try:
        return await against_log(
            bus,
            path,
            lambda: asyncio.to_thread(_projected_to, database_url),
            folder_of(settings.home),
        )
    finally:
        await bus.close()


async def against_log(
    bus: EventBus,
    path: Path,
    projected_to: Callable[[], Awaitable[int | None]],
    archive: Path | None = None,
) -> Verdict:
    """The file against the live log, while the projector goes on writing both. Each is looked
    at after what it must reach: the checkpoint (the file is written before it), then the log's
    end (its anchors name lines written before them), then the file's length; the log is then
    read up to the later of its end and the file's last line, with the archive's segments
    (`archive`, the home's archive folder) merged in: the chain runs over both."""
    checkpoint = await projected_to()
    log_end = await bus.last_sequence()
    size, file_end = await asyncio.to_thread(_file_now, path)
    chain = LogChain()
    try:
        async for chunk in merged(bus, archive, 1, stop_at=max(log_end, file_end)):
            for raw in chunk:
                chain.feed(raw.seq, raw.subject, raw.data)
    except ArchiveError as error:
        return Verdict(False, 0, None, f"the archive is damaged: {error}")
    verdict = await asyncio.to_thread(verify_against_log, path, chain, checkpoint, size)
    if verdict.intact and archive is not None:
        problem = await asyncio.to_thread(check_audit_heads, archive, dict(chain.entries))
        if problem is not None:
            return Verdict(False, verdict.lines, None, f"the archive differs: {problem}")
    return verdict


def _file_now(path: Path) -> tuple[int, int]:
    """The file's length now, and the seq of its last line within it."""
    size = path.stat().st_size
    _, heads = read_chain(path, size)
    return size, heads[-1][0] if heads else 0


def _projected_to(database_url: str) -> int | None:
    """The projection's checkpoint: the file is written before it, so it reaches it."""
    engine = make_engine(database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            value = conn.execute(select(tables.checkpoints.c.last_seq)).scalar()
        return None if value is None else int(value)
    except Exception:
        return None
    finally:
        engine.dispose()
