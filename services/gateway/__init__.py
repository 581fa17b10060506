"""The gateway: HTTP API and console, served by uvicorn inside the service runner."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn

from hpc_ds1.credentials import register_cli_token, register_join_token
from hpc_ds1.log import get_logger
from hpc_ds1.runtime import ServiceContext

from .agent_api import close_agent_polls
from .app import create_app

__all__ = ["create_app", "run"]

log = get_logger("gateway")


class _EmbeddedServer(uvicorn.Server):
    """The runner owns SIGINT/SIGTERM; uvicorn must not install its own handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listen(host: str, port: int) -> socket.socket:
    """A TCP listener whose accepted sockets asyncio marks TCP_NODELAY: it does so only when the
    socket's protocol is IPPROTO_TCP, which socket.create_server leaves at 0 (Nagle's delay with
    the client's delayed ACK then costs ~40 ms per keep-alive request)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(address)
        listener.listen(2048)
    except OSError:
        listener.close()
        raise
    return listener


async def _register_cli_token(ctx: ServiceContext) -> None:
    """The home's CLI credential (credentials/cli.token) as an admin token of the home's owner,
    then the fleet's join token; logged, never raised: the API serves either way."""
    try:
        await register_cli_token(ctx.bus, ctx.engine, ctx.settings.home)
    except Exception as error:
        log.error("cli_token_not_registered", error=f"{type(error).__name__}: {error}")
    # The fleet's join token (credentials/join.token), made on the first start; the same way.
    try:
        await register_join_token(ctx.bus, ctx.engine, ctx.settings.home)
    except Exception as error:
        log.error("join_token_not_registered", error=f"{type(error).__name__}: {error}")


async def run(ctx: ServiceContext) -> None:
    registering = asyncio.create_task(_register_cli_token(ctx))
    try:
        await _serve(ctx)
    finally:
        registering.cancel()


async def _serve(ctx: ServiceContext) -> None:
    app = create_app(ctx.settings, ctx.bus, ctx.engine)
    config = uvicorn.Config(
        app, host=ctx.settings.host, port=ctx.settings.port, log_config=None, access_log=False
    )
    server = _EmbeddedServer(config)
    # Binding here turns a busy port into a clear error instead of uvicorn's sys.exit.
    try:
        listener = _listen(ctx.settings.host, ctx.settings.port)
    except OSError as error:
        raise RuntimeError(
            f"the gateway cannot listen on {ctx.settings.host}:{ctx.settings.port}: "
            f"{error.strerror} (set --port or HPC_DS1_PORT)"
        ) from None
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    stopping = asyncio.create_task(ctx.stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    # Agents' long-polls end now: the server waits for every request in flight to finish.
    await close_agent_polls(app)
    await serving
    stopping.cancel()
    listener.close()
