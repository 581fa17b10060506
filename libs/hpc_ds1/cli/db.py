"""`hpc-ds1 db upgrade`: apply the alembic migrations to the projection database."""

from __future__ import annotations

import argparse

from ..db import make_engine, upgrade
from ..db.migrate import current
from ..infra.home import use_home
from .common import add_home_argument, add_json_argument, emit, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("db", help="projection database maintenance")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    up = actions.add_parser("upgrade", help="apply every migration up to the newest")
    add_json_argument(up, "the database's revision")
    add_home_argument(up)
    up.set_defaults(handler=handle_upgrade)


def handle_upgrade(args: argparse.Namespace) -> int:
    settings = load_settings(home=args.home)
    with use_home(settings) as ends:
        engine = make_engine(ends.app_database_url(), pool_size=1)
        try:
            upgrade(engine)
            revision = current(engine)
            emit(args, {"revision": revision}, f"database at revision {revision}")
        finally:
            engine.dispose()
    return 0
