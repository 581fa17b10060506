"""`hpc-ds1 archive --before DATE`: old events out of the live stream into hash-chained,
compressed archive segments, without losing the audit trail (`hpc_ds1.operations.archive`)."""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import asdict
from datetime import UTC, datetime

from sqlalchemy import select

from ..db import tables
from ..operations.archive import ArchiveError, Outcome, archive_before, folder_of
from ..settings import Settings
from ..stack import open_stack
from . import UsageError
from .common import add_home_argument, add_json_argument, emit, load_settings

DATE_RULE = "a date or an ISO 8601 time, e.g. 2026-01-01 or 2026-01-01T00:00:00+00:00"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "archive",
        help="move old decisions, run heartbeats and finished sessions out of the live stream",
        description="Move the events from before DATE that no service folds again into its "
        "live state (decisions, run heartbeats, finished tuning sessions with their approvals) "
        "into a new compressed, hash-chained segment of $HPC_DS1_HOME/archive/, then remove "
        "them from the stream. Only events the projection already holds leave; Postgres keeps "
        "its rows and the audit file every line. `hpc-ds1 audit verify`, `projection rebuild`, "
        "`backup` and `restore` read the archive with the stream. Works while `hpc-ds1 serve` "
        "runs. Idempotency keys of archived decisions are forgotten: archive only what no "
        "client will retry.",
    )
    parser.add_argument("--before", required=True, help=f"archive events before this: {DATE_RULE}")
    parser.add_argument(
        "--dry-run", action="store_true", help="say what would move, and move nothing"
    )
    add_json_argument(parser, "what was archived")
    add_home_argument(parser)
    parser.set_defaults(handler=handle_archive)


def parse_before(text: str) -> datetime:
    """DATE as an aware time (a date, or a time without a zone, is taken as UTC)."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--before {text!r}: not a date; accepted: {DATE_RULE}") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def handle_archive(args: argparse.Namespace) -> int:
    before = parse_before(args.before)
    settings = load_settings(quiet=True, home=args.home)
    started = time.perf_counter()
    try:
        outcome = asyncio.run(_archive(settings, before, args.dry_run))
    except ArchiveError as error:
        raise UsageError(f"the archive in {folder_of(settings.home)} is damaged: {error}") from None
    took = time.perf_counter() - started
    emit(
        args,
        {**asdict(outcome), "dry_run": args.dry_run, "seconds": took},
        _describe(outcome, args.dry_run, took),
    )
    return 0


def _describe(outcome: Outcome, dry_run: bool, took: float) -> str:
    what = (
        f"{outcome.events} events ({outcome.sessions} finished sessions, {outcome.approvals} "
        f"approvals, and the decisions and run heartbeats) before seq {outcome.cut}"
    )
    if dry_run:
        return f"would archive {what}"
    if outcome.segment is None:
        return f"nothing to archive before seq {outcome.cut}"
    return (
        f"archived {what} into {outcome.segment} (seqs {outcome.first_seq}..{outcome.last_seq}), "
        f"in {took:.2f} s; check with: hpc-ds1 audit verify"
    )


async def _archive(settings: Settings, before: datetime, dry_run: bool) -> Outcome:
    async with open_stack(settings, (), "archive") as stack:

        def projected() -> int:
            with stack.engine.connect() as conn:
                return int(conn.execute(select(tables.checkpoints.c.last_seq)).scalar() or 0)

        checkpoint = await asyncio.to_thread(projected)
        return await archive_before(
            stack.bus, settings.home, settings.audit_path, before, checkpoint, dry_run
        )
