"""`hpc-ds1 serve`: the coordinator with every service, on embedded or external infrastructure."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from ..db import make_engine
from ..infra.home import Endpoints, own_home
from ..infra.tls import ServerCertificate, TLSError, ensure_server_cert, local_names
from ..process.children import Child, start_children, watch_children
from ..process.runtime import SERVICES, install_stop_signals, run_loop, run_services
from ..security.credentials import (
    cli_token_path,
    current_join_token,
    ensure_join_token,
    join_command,
    join_pin,
    new_login_token,
    public_server,
    serves_tls,
)
from ..settings import Settings
from . import UsageError, main
from .common import add_home_argument, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "serve", help="run the coordinator, every service and the console"
    )
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="HTTP port (default 8765)")
    parser.add_argument(
        "--tls-cert",
        type=Path,
        metavar="PEM",
        help="the site's server certificate (leaf first) instead of the home's own CA's; "
        "HPC_DS1_TLS_CERT. Off loopback the gateway serves HTTPS either way (HPC_DS1_TLS=off: not)",
    )
    parser.add_argument(
        "--tls-key", type=Path, metavar="PEM", help="its private key (0600); HPC_DS1_TLS_KEY"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--processes",
        dest="mode",
        action="store_const",
        const="processes",
        help="run each service in a process of its own, as `hpc-ds1 service NAME` does "
        "(default where 2 or more CPUs are usable; HPC_DS1_SERVE_MODE)",
    )
    mode.add_argument(
        "--one-process",
        dest="mode",
        action="store_const",
        const="one-process",
        help="run every service in this one process (the default on one CPU)",
    )
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    settings = load_settings(
        attach=False,
        host=args.host,
        port=args.port,
        home=args.home,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )
    return serve(settings, SERVICES, processes=use_processes(args.mode or settings.serve_mode))


def use_processes(mode: str) -> bool:
    """Whether `serve` runs each service in its own process. `auto`: where 2 or more CPUs are
    usable. Measured on 2 cores (`benchmarks/bench_serve_modes.py 1000 --rounds 2`, wrk, load
    1.1-2.5): 484 against 352 requests/s with 8 connections (x1.38), p99 15.2 against 19.9 ms
    with one; on one core the processes would only take turns, so one process there."""
    if mode != "auto":
        return mode == "processes"
    from ..machine.allocation import detect

    return detect().usable >= 2


def serve(settings: Settings, services: tuple[str, ...], processes: bool = False) -> int:
    started = time.monotonic()
    wildcard = settings.host in ("0.0.0.0", "::")
    shown_host = "127.0.0.1" if wildcard else settings.host
    # This machine's own callers (the CLI, the console here) use loopback, which stays plain
    # HTTP; a server bound to one other address has HTTPS only.
    tls_only = not wildcard and serves_tls(settings, configured_only=False)
    url = f"{'https' if tls_only else 'http'}://{shown_host}:{settings.port}/"
    try:
        with own_home(settings, gateway_url=url if "gateway" in services else None) as ends:
            if "gateway" in services:
                settings = with_tls(settings)
            print(f"HPC-DS1 home {settings.home}", flush=True)
            print(f"  NATS      {ends.nats_url}{' (embedded)' if not settings.nats_url else ''}")
            db = "embedded" if not settings.database_url else "external"
            print(f"  Postgres  {db}", flush=True)
            if "gateway" in services:
                print(f"  Console   {url}   (API docs {url}docs)", flush=True)
                # Secrets go to this machine's own terminal only, never into a log or a file
                # that captures stdout (a service manager's journal): there, how to get them.
                shown = sys.stdout.isatty()
                # Like Jupyter: a one-time URL trades its token for the console's cookie. Made
                # on every start, shown or not: a link of an earlier run stops working.
                login = new_login_token(settings.home)
                if shown:
                    print(f"  Log in    {url}?token={login}", flush=True)
                    print("            (works once; `hpc-ds1 token login` prints a new one)")
                else:
                    print(
                        "  Log in    `hpc-ds1 token login` prints a one-time login URL", flush=True
                    )
                print(f"  CLI token {cli_token_path(settings.home)}", flush=True)
                server = public_server(settings)
                pin = join_pin(settings)
                if serves_tls(settings):
                    what = "the site's certificate" if pin is None else f"the home's CA, {pin}"
                    print(f"  TLS       {server} ({what}); loopback stays plain HTTP", flush=True)
                join = _join_token(settings, ends)
                if shown:
                    print(f"  Join      {join_command(server, join, pin)}", flush=True)
                else:
                    print("  Join      `hpc-ds1 token join` prints the command that joins a device")
                    print(
                        "            (tokens are shown on a terminal only, never in a log)",
                        flush=True,
                    )
                if settings.host.startswith("127.") or settings.host in ("localhost", "::1"):
                    print("            (this machine only: `serve --host 0.0.0.0` for others)")
            # Forked here, before this process has an event loop or a thread.
            children = start_children(services, settings, main) if processes else None
            run_loop(_serve(settings, services, ends, started, children), settings)
    except RuntimeError as error:
        raise UsageError(str(error)) from None
    return 0


def with_tls(settings: Settings) -> Settings:
    """The settings the gateway serves with: off loopback (unless HPC_DS1_TLS=off) a
    certificate, the site's when given, else the home's own CA's (made on the first start, and
    its server certificate made again when it no longer names this machine's addresses). The
    services' processes read it from the environment, as `hpc-ds1 service gateway` would."""
    if not serves_tls(settings, configured_only=False):
        return settings
    try:
        if settings.tls_cert is None or settings.tls_key is None:
            extra = [n for n in settings.tls_names.split(",") if n.strip()]
            paths, _ = ensure_server_cert(settings.home, local_names(settings.host, extra))
            settings = settings.model_copy(update={"tls_cert": paths.cert, "tls_key": paths.key})
        else:
            ServerCertificate(settings.tls_cert, settings.tls_key)  # readable, a pair, private
    except TLSError as error:
        raise UsageError(f"TLS: {error}") from None
    os.environ["HPC_DS1_TLS_CERT"] = str(settings.tls_cert)
    os.environ["HPC_DS1_TLS_KEY"] = str(settings.tls_key)
    return settings


def _join_token(settings: Settings, ends: Endpoints) -> str:
    """The home's join token (made on the first start, a new one when it was revoked)."""
    engine = make_engine(ends.app_database_url(), pool_size=1)
    try:
        return current_join_token(settings.home, engine)
    except SQLAlchemyError:  # the gateway replaces a revoked one when it starts
        return ensure_join_token(settings.home)
    finally:
        engine.dispose()


async def _serve(
    settings: Settings,
    services: tuple[str, ...],
    ends: Endpoints,
    started: float,
    children: list[Child] | None,
) -> None:
    stop = asyncio.Event()
    install_stop_signals(stop)
    if children is None:
        # Each service connects with its own credentials; the database as the application role.
        await run_services(services, settings, ends.nats_url_for, ends.app_database_url(), stop)
    else:
        # Each its own process, attached to this home as `hpc-ds1 service NAME` is.
        await watch_children(children, stop)
    print(f"stopped after {time.monotonic() - started:.1f} s; data kept in {settings.home}")
