"""`hpc-ds1 projection rebuild`: drop the read models and replay the whole log into them."""

from __future__ import annotations

import argparse
import asyncio
import time

from sqlalchemy import func, select

from ..db import make_engine, tables
from ..eventlog.bus import EventBus
from ..infra.home import use_home
from ..operations.archive import folder_of
from ..settings import Settings
from .common import add_home_argument, add_json_argument, emit, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("projection", help="the Postgres projection of the log")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    rebuild = actions.add_parser("rebuild", help="empty the read models and replay the log")
    add_json_argument(rebuild, "how many events were replayed")
    add_home_argument(rebuild)
    rebuild.set_defaults(handler=handle_rebuild)


def handle_rebuild(args: argparse.Namespace) -> int:
    settings = load_settings(home=args.home)
    with use_home(settings) as ends:
        started = time.perf_counter()
        nats_url, database_url = ends.nats_url_for("cli"), ends.app_database_url()
        last, aside = asyncio.run(_rebuild(settings, nats_url, database_url))
        took = time.perf_counter() - started
        text = f"rebuilt the projection from {last} events in {took:.2f} s"
        if aside:
            text += (
                f"\n{aside} event(s) set aside: Postgres refused what they hold; each is in the "
                "projection_set_aside table with its reason"
            )
        emit(args, {"events": last, "set_aside": aside, "seconds": took}, text)
    return 0


async def _rebuild(settings: Settings, nats_url: str, database_url: str) -> tuple[int, int]:
    from hpc_ds1.projection.rebuild import rebuild

    # It reads the log: no stream is created (MissingStream when there is none: rebuilding
    # from no log would only empty the projection).
    bus = await EventBus.connect(settings, nats_url, "rebuild", create=False)
    engine = make_engine(database_url, pool_size=1)
    try:
        last = await rebuild(engine, bus, archive=folder_of(settings.home))
        with engine.connect() as conn:
            aside = conn.execute(select(func.count()).select_from(tables.set_aside)).scalar_one()
        return last, int(aside)
    finally:
        await bus.close()
        engine.dispose()
