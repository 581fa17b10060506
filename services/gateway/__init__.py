"""The gateway: HTTP API and console, served by uvicorn inside the service runner."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn

from hpc_ds1.runtime import ServiceContext

from .app import create_app

__all__ = ["create_app", "run"]


class _EmbeddedServer(uvicorn.Server):
    """The runner owns SIGINT/SIGTERM; uvicorn must not install its own handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def run(ctx: ServiceContext) -> None:
    app = create_app(ctx.settings, ctx.bus, ctx.engine)
    config = uvicorn.Config(
        app, host=ctx.settings.host, port=ctx.settings.port, log_config=None, access_log=False
    )
    server = _EmbeddedServer(config)
    # Binding here turns a busy port into a clear error instead of uvicorn's sys.exit.
    try:
        listener = socket.create_server((ctx.settings.host, ctx.settings.port), reuse_port=False)
    except OSError as error:
        raise RuntimeError(
            f"the gateway cannot listen on {ctx.settings.host}:{ctx.settings.port}: "
            f"{error.strerror} (set --port or HPC_DS1_PORT)"
        ) from None
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    stopping = asyncio.create_task(ctx.stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await serving
    stopping.cancel()
    listener.close()
