"""The gateway: HTTP API and console, served by uvicorn inside the service runner."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.infra.tls import uvicorn_options as tls_options
from hpc_ds1.log import get_logger
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.security.credentials import register_cli_token, register_join_token

from .agents.routes import close_agent_polls
from .app import Check, create_app

__all__ = ["create_app", "run"]

log = get_logger("gateway")
REPLICA_HEADER = "hpc-replica"


class _EmbeddedServer(uvicorn.Server):
    """The runner owns SIGINT/SIGTERM; uvicorn must not install its own handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP listener whose accepted sockets asyncio marks TCP_NODELAY: it does so only when the
    socket's protocol is IPPROTO_TCP, which socket.create_server leaves at 0 (Nagle's delay with
    the client's delayed ACK then costs ~40 ms per keep-alive request)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        listener.bind(address)
        listener.listen(2048)
    except OSError:
        listener.close()
        raise
    return listener


def proxy_headers(forwarded_allow_ips: str) -> dict[str, Any]:
    """uvicorn's options for forwarded headers: believed only from the proxies named (settings'
    forwarded_allow_ips). uvicorn's own default believes X-Forwarded-For and X-Forwarded-Proto
    from loopback (any local process could then pose as any address); none named: off."""
    if not forwarded_allow_ips:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": forwarded_allow_ips}


async def _register_credentials(ctx: ServiceContext, app: FastAPI) -> None:
    """The home's CLI credential (credentials/cli.token) as an admin token of the home's owner,
    then the fleet's join token (made on the first start). /readyz says ready only once both are
    active, so nothing told "ready" meets a refused CLI token; tried again until they are.
    Logged, never raised."""
    settings = ctx.settings
    join = functools.partial(
        register_join_token, ttl_s=settings.join_token_ttl_s, uses=settings.join_token_uses
    )
    pending: dict[str, Callable[[EventBus, Engine, Path], Awaitable[bool]]] = {
        "CLI": register_cli_token,
        "join": join,
    }
    while pending:
        problems: list[str] = []
        for what, register in list(pending.items()):
            try:
                if await register(ctx.bus, ctx.engine, ctx.settings.home):
                    del pending[what]
                    continue
                problems.append(f"the {what} token is not active yet (is the projector running?)")
            except Exception as error:
                log.error(
                    f"{what.lower()}_token_not_registered",
                    error=f"{type(error).__name__}: {error}",
                )
                problems.append(f"the {what} token could not be registered: {type(error).__name__}")
        app.state.credentials = Check(ok=not problems, problem="; ".join(problems) or None)
        if pending:
            await asyncio.sleep(1.0)


async def run(ctx: ServiceContext) -> None:
    await _serve(ctx)


async def _serve(ctx: ServiceContext) -> None:
    app = create_app(ctx.settings, ctx.bus, ctx.engine)
    app.state.credentials = Check(ok=False, problem="registering the home's CLI and join tokens")
    registering = asyncio.create_task(_register_credentials(ctx, app))
    config = uvicorn.Config(
        app,
        host=ctx.settings.host,
        port=ctx.settings.port,
        log_config=None,
        access_log=False,
        # Without a bound, shutdown waits on every open request, and a console's /v1/stream
        # never ends by itself: the process outlives its stop grace and is killed.
        timeout_graceful_shutdown=ctx.settings.shutdown_grace_s,
        # Which replica answered (a container's hostname, then the pid).
        headers=[(REPLICA_HEADER, f"{socket.gethostname()}/{os.getpid()}")],
        **proxy_headers(ctx.settings.forwarded_allow_ips),
        # Issue 45: HTTPS for every connection not made to loopback when a certificate is set.
        **tls_options(ctx.settings),
    )
    server = _EmbeddedServer(config)
    # Binding here turns a busy port into a clear error instead of uvicorn's sys.exit.
    try:
        listener = _listen(ctx.settings.host, ctx.settings.port, ctx.settings.reuse_port)
    except OSError as error:
        raise RuntimeError(
            f"the gateway cannot listen on {ctx.settings.host}:{ctx.settings.port}: "
            f"{error.strerror} (set --port or HPC_DS1_PORT)"
        ) from None
    try:
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        stopping = asyncio.create_task(ctx.stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        # Agents' long-polls end now: the server waits for every request in flight to finish.
        await close_agent_polls(app)
        await serving
        stopping.cancel()
    finally:
        registering.cancel()
        listener.close()
