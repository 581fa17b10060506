"""`hpc-ds1 backup PATH` and `hpc-ds1 restore PATH`: the event log and the model artifacts."""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import asdict
from pathlib import Path

from sqlalchemy import select

from ..db import tables
from ..infra.home import running_owner
from ..operations.backup import (
    BackupError,
    Summary,
    backup,
    check_empty,
    check_prefix,
    read_manifest,
    restore,
)
from ..settings import Settings
from ..stack import Stack, open_stack
from . import UsageError
from .common import add_home_argument, add_json_argument, emit, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    saving = subparsers.add_parser(
        "backup",
        help="write the event log and the model artifacts to a new folder",
        description="Write every message of the event stream (in order, with its headers), "
        "the model bucket and the home's models folder to PATH, with a manifest of counts, "
        "sequences and SHA-256s. Works while `hpc-ds1 serve` runs: the backup holds the log up "
        "to its last sequence when it starts.",
    )
    saving.add_argument("path", metavar="PATH", type=Path, help="a new (or empty) folder")
    add_json_argument(saving, "what was backed up")
    add_home_argument(saving)
    saving.set_defaults(handler=handle_backup)

    loading = subparsers.add_parser(
        "restore",
        help="restore a backup into an empty home (stream, model bucket, models folder, "
        "database), then rebuild the projection",
        description="Append every event of the backup, with its original sequence, into the "
        "stream of this home (HPC_DS1_STREAM on HPC_DS1_NATS_URL or the embedded server), put "
        "the model artifacts back, and rebuild the projection and the audit file from the "
        "restored log. Only an empty target is accepted: no event in the stream, no model in "
        "the bucket or in the home's models folder, nothing projected in the database, and no "
        "`hpc-ds1 serve` on the home; HPC_DS1_SUBJECT_PREFIX must be the backup's. A refused "
        "restore changes nothing.",
    )
    loading.add_argument("path", metavar="PATH", type=Path, help="a folder `backup` wrote")
    add_json_argument(loading, "what was restored")
    add_home_argument(loading)
    loading.set_defaults(handler=handle_restore)


def _describe(summary: Summary) -> str:
    span = f"sequences {summary.first_seq}..{summary.last_seq}" if summary.events else "no events"
    gaps = f", {summary.gaps} gap(s) of deleted messages" if summary.gaps else ""
    return (
        f"{summary.events} events ({span}{gaps}), {summary.objects} model artifact(s) in the "
        f"bucket, {summary.model_files} file(s) of the models folder"
    )


def handle_backup(args: argparse.Namespace) -> int:
    settings = load_settings(quiet=True, home=args.home)
    started = time.perf_counter()
    try:
        summary = asyncio.run(_backup(settings, args.path.resolve()))
    except BackupError as error:
        raise UsageError(str(error)) from None
    took = time.perf_counter() - started
    emit(
        args,
        {**asdict(summary), "seconds": took},
        f"backed up {_describe(summary)} to {summary.path}\n"
        f"in {took:.2f} s; restore with: hpc-ds1 restore {args.path}",
    )
    return 0


async def _backup(settings: Settings, path: Path) -> Summary:
    async with open_stack(settings, (), "backup") as stack:
        return await backup(stack.bus, settings, path)


def handle_restore(args: argparse.Namespace) -> int:
    settings = load_settings(quiet=True, home=args.home)
    try:
        # A damaged or foreign backup stops here, before anything starts.
        check_prefix(read_manifest(args.path), settings.subject_prefix)
    except BackupError as error:
        raise UsageError(str(error)) from None
    if running_owner(settings.home) is not None:
        raise UsageError(
            f"{settings.home} is being served (hpc-ds1 serve): a restore needs the home to "
            "itself; stop the server, or restore into a new HPC_DS1_HOME"
        )
    started = time.perf_counter()
    try:
        summary = asyncio.run(_restore(settings, args.path.resolve()))
    except BackupError as error:
        raise UsageError(str(error)) from None
    took = time.perf_counter() - started
    emit(
        args,
        {**asdict(summary), "home": str(settings.home), "stream": settings.stream, "seconds": took},
        f"restored {_describe(summary)} into {settings.home} (stream {settings.stream})\n"
        f"and rebuilt the projection, in {took:.2f} s",
    )
    return 0


async def _restore(settings: Settings, path: Path) -> Summary:
    async with open_stack(settings, (), "restore") as stack:
        await check_empty(stack.bus, settings, stack.engine)
        summary = await restore(stack.bus, settings, path)
    # The projector folds the restored log (read models and audit file) only once it is
    # complete: a placeholder of a deleted message never reaches it.
    async with open_stack(settings, ("projector",), "restore") as stack:
        await _projected(stack, summary.last_event)
    return summary


async def _projected(stack: Stack, last_event: int, within_s: float = 600.0) -> None:
    """Wait until the projection holds the last restored event."""

    def checkpoint() -> int:
        with stack.engine.connect() as conn:
            return int(conn.execute(select(tables.checkpoints.c.last_seq)).scalar() or 0)

    deadline = time.monotonic() + within_s
    while await asyncio.to_thread(checkpoint) < last_event:
        if time.monotonic() > deadline:
            raise BackupError(f"the projection did not reach sequence {last_event} in {within_s} s")
        await asyncio.sleep(0.1)
