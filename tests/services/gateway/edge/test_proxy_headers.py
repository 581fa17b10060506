"""Forwarded headers are believed only from the proxies named in HPC_DS1_FORWARDED_ALLOW_IPS:
the real gateway service (uvicorn on a loopback port) with a request from loopback that says
`X-Forwarded-For: 8.8.8.8`. uvicorn's own default believes it from loopback, so a local process
could pose as any address (a probe's log recorded "client": "8.8.8.8")."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.infra.ports import free_port
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.security.credentials import ensure_join_token
from hpc_ds1.security.tokens import new_token
from hpc_ds1.services import gateway
from hpc_ds1.settings import Settings
from tests.support.gateway import as_role, fold, role_token_events

RELAYED = {"X-Forwarded-For": "8.8.8.8"}


async def as_served(
    settings: Settings, bus: EventBus, engine: Engine, proxies: str
) -> tuple[httpx.Response, httpx.Response]:
    """The gateway service serving `settings` with HPC_DS1_FORWARDED_ALLOW_IPS=`proxies`:
    its answers to an admin asking for the join token (shown to loopback only) and to a wrong
    token, both from loopback with X-Forwarded-For: 8.8.8.8."""
    await fold(settings, bus, engine, *role_token_events())
    ensure_join_token(settings.home)
    here = settings.model_copy(
        update={"host": "127.0.0.1", "port": free_port(), "forwarded_allow_ips": proxies}
    )
    assert here.database_url and here.nats_url
    stop = asyncio.Event()
    ctx = ServiceContext("gateway", here, here.nats_url, here.database_url, bus, engine, stop)
    serving = asyncio.create_task(gateway.run(ctx))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{here.port}") as http:
            for _ in range(500):
                try:
                    if (await http.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert not serving.done(), serving
                await asyncio.sleep(0.02)
            shown = await http.get("/v1/fleet/join-token", headers={**as_role("admin"), **RELAYED})
            wrong = await http.get(
                "/v1/whoami", headers={"Authorization": f"Bearer {new_token()}", **RELAYED}
            )
    finally:
        stop.set()
        await asyncio.wait_for(serving, 30)
    return shown, wrong


def rejected_client(err: str) -> Any:
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    return next(r["client"] for r in logged if r["event"] == "auth_rejected")


async def test_a_forwarded_header_from_loopback_is_ignored_by_default(
    settings: Settings, bus: EventBus, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    assert settings.forwarded_allow_ips == ""
    shown, wrong = await as_served(settings, bus, engine, "")
    # The caller is the socket's peer, 127.0.0.1: the join token is shown to it.
    assert shown.status_code == 200, shown.text
    assert wrong.status_code == 401
    assert rejected_client(capsys.readouterr().err) == "127.0.0.1"


async def test_a_forwarded_header_from_a_named_proxy_is_believed(
    settings: Settings, bus: EventBus, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    shown, wrong = await as_served(settings, bus, engine, "127.0.0.1")
    # The proxy on this machine relays 8.8.8.8: not this machine, no join token for it.
    assert shown.status_code == 403, shown.text
    assert wrong.status_code == 401
    assert rejected_client(capsys.readouterr().err) == "8.8.8.8"
