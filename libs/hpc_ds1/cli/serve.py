"""`hpc-ds1 serve`: the coordinator with every service, on embedded or external infrastructure."""

from __future__ import annotations

import argparse
import asyncio
import time

from ..credentials import cli_token_path, new_login_token
from ..infra.home import Endpoints, own_home
from ..runtime import SERVICES, install_stop_signals, run_services
from ..settings import Settings
from . import UsageError
from .common import add_home_argument, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "serve", help="run the coordinator, every service and the console"
    )
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="HTTP port (default 8765)")
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    settings = load_settings(host=args.host, port=args.port, home=args.home)
    return serve(settings, SERVICES)


def serve(settings: Settings, services: tuple[str, ...]) -> int:
    started = time.monotonic()
    shown_host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    url = f"http://{shown_host}:{settings.port}/"
    try:
        with own_home(settings, gateway_url=url if "gateway" in services else None) as ends:
            print(f"HPC-DS1 home {settings.home}", flush=True)
            print(f"  NATS      {ends.nats_url}{' (embedded)' if not settings.nats_url else ''}")
            db = "embedded" if not settings.database_url else "external"
            print(f"  Postgres  {db}", flush=True)
            if "gateway" in services:
                print(f"  Console   {url}   (API docs {url}docs)", flush=True)
                # Like Jupyter: a one-time URL trades its token for the console's cookie.
                print(f"  Log in    {url}?token={new_login_token(settings.home)}", flush=True)
                print("            (works once; `hpc-ds1 token login` prints a new one)")
                print(f"  CLI token {cli_token_path(settings.home)}", flush=True)
            asyncio.run(_serve(settings, services, ends, started))
    except RuntimeError as error:
        raise UsageError(str(error)) from None
    return 0


async def _serve(
    settings: Settings, services: tuple[str, ...], ends: Endpoints, started: float
) -> None:
    stop = asyncio.Event()
    install_stop_signals(stop)
    # Each service connects with its own credentials; the database as the application role.
    await run_services(services, settings, ends.nats_url_for, ends.app_database_url(), stop)
    print(f"stopped after {time.monotonic() - started:.1f} s; data kept in {settings.home}")
