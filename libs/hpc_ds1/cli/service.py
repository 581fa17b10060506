"""`hpc-ds1 service NAME`: one service alone, as each container of docker-compose.yml runs it."""

from __future__ import annotations

import argparse
import asyncio

from ..infra.home import Endpoints, check_nats_credentials, migrate, use_home
from ..process.runtime import SERVICES, NatsUrls, install_stop_signals, run_loop, run_services
from ..process.stuck_exit import exit_if_stuck
from ..settings import Settings
from . import UsageError
from .common import add_home_argument, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("service", help="run one service alone")
    parser.add_argument("name", choices=SERVICES, help="the service to run")
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    settings = load_settings(home=args.home)
    if not settings.nats_url or not settings.database_url:
        # Alone, a service attaches to the home's owner or starts the embedded servers itself.
        try:
            with use_home(settings) as ends:
                # No watchdog here: the embedded servers this process may have started are
                # stopped after its service, and must not be cut short.
                run_loop(
                    _one(
                        args.name,
                        settings,
                        ends.nats_url_for,
                        ends.app_database_url(),
                        watchdog=False,
                    ),
                    settings,
                )
        except RuntimeError as error:
            raise UsageError(str(error)) from None
        return 0
    # External servers (each container of the compose file): refused NATS credentials are one
    # clear line before the service starts (an unreachable server is waited for); the
    # projector brings the schema up to date, and a database that refuses it is one line too.
    try:
        check_nats_credentials(settings.nats_url)
        if args.name == "projector":
            migrate(Endpoints.external(settings))
    except RuntimeError as error:
        raise UsageError(str(error)) from None
    run_loop(
        _one(args.name, settings, settings.nats_url, settings.database_url, watchdog=True),
        settings,
    )
    return 0


async def _one(
    name: str, settings: Settings, nats_url: NatsUrls, db_url: str, *, watchdog: bool
) -> None:
    stop = asyncio.Event()
    install_stop_signals(stop)
    failed = True
    try:
        await run_services((name,), settings, nats_url, db_url, stop)
        failed = False
    finally:
        # The service has stopped; a worker thread blocked in an abandoned call must not keep
        # the process past its stop grace (compose kills it: exit 137).
        if watchdog:
            exit_if_stuck(settings.shutdown_grace_s, 1 if failed else 0)
