"""The gateway stops within its shutdown grace while a request never ends by itself (a console's
live stream, /v1/stream): a stop must not wait on it past the deployment's grace period
(docker-compose.yml gives 30 s, then SIGKILL)."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.infra.ports import free_port
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.services import gateway
from hpc_ds1.settings import Settings
from tests.support.gateway import as_role, fold, role_token_events


async def test_an_open_stream_does_not_hold_the_gateway_past_its_grace(
    settings: Settings, bus: EventBus, engine: Engine
) -> None:
    await fold(settings, bus, engine, *role_token_events())
    grace = 1
    here = settings.model_copy(
        update={"host": "127.0.0.1", "port": free_port(), "shutdown_grace_s": grace}
    )
    assert here.database_url and here.nats_url
    stop = asyncio.Event()
    ctx = ServiceContext("gateway", here, here.nats_url, here.database_url, bus, engine, stop)
    serving = asyncio.create_task(gateway.run(ctx))
    base = f"http://127.0.0.1:{here.port}"
    connected = asyncio.Event()
    ended = asyncio.Event()

    async def read_stream(http: httpx.AsyncClient) -> None:
        try:
            async with http.stream("GET", "/v1/stream", headers=as_role("viewer")) as reply:
                assert reply.status_code == 200
                async for chunk in reply.aiter_text():
                    if ": connected" in chunk:
                        connected.set()
        except httpx.HTTPError:
            pass  # the server closing the stream under it is what a stop does
        finally:
            ended.set()

    async with httpx.AsyncClient(base_url=base, timeout=None) as http:
        for _ in range(500):
            try:
                if (await http.get("/healthz")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert not serving.done(), serving
            await asyncio.sleep(0.02)
        reader = asyncio.create_task(read_stream(http))
        await asyncio.wait_for(connected.wait(), 10)
        stop.set()
        # Before the bound, this waited forever on the stream (the test's own limit is generous:
        # it tells "stops" from "never stops", not how fast).
        await asyncio.wait_for(serving, grace + 30)
        await asyncio.wait_for(ended.wait(), 10)
        await reader
    assert serving.exception() is None
