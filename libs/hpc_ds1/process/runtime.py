"""Runs services: each an asyncio component with its own NATS connection and database engine,
started together by `hpc-ds1 serve` or alone by `hpc-ds1 service NAME`."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sqlalchemy import Engine

from ..db import make_engine
from ..eventlog.bus import EventBus
from ..eventlog.subjects import status_subject
from ..log import get_logger
from ..settings import Settings
from .leader import SINGLE_ACTIVE, Lease, lock_name, single_active, watch

SERVICES: tuple[str, ...] = (
    "projector",
    "coordinator",
    "placement",
    "decision",
    "trainer",
    "agent",
    "gateway",
)


# A NATS URL for every service, or a function giving the URL (with that service's own
# credentials) for a service name, e.g. `Endpoints.nats_url_for` of infra/home.py.
NatsUrls = str | Callable[[str], str]


def nats_url_of(nats_url: NatsUrls, name: str) -> str:
    return nats_url if isinstance(nats_url, str) else nats_url(name)


@dataclass
class ServiceContext:
    """What a service gets: its settings, its own bus connection and engine, and a stop signal.
    `nats_url` and `database_url` carry the service's own credentials."""

    name: str
    settings: Settings
    nats_url: str
    database_url: str
    bus: EventBus
    engine: Engine
    stop: asyncio.Event
    started: float = field(default_factory=time.time)
    facts: dict[str, Any] = field(default_factory=dict)


class ServiceEntry(Protocol):
    def __call__(self, ctx: ServiceContext) -> Awaitable[None]: ...


def entry_point(name: str) -> ServiceEntry:
    if name not in SERVICES:
        raise ValueError(f"unknown service {name!r}; the services are: {', '.join(SERVICES)}")
    module = importlib.import_module(f"hpc_ds1.services.{name}")
    run: ServiceEntry = module.run
    return run


async def _answer_status(ctx: ServiceContext) -> Callable[[], Awaitable[None]]:
    """Every service answers a status request, so readiness can see it is alive."""

    async def reply(msg: Any) -> None:
        facts = {k: (v() if callable(v) else v) for k, v in ctx.facts.items()}
        # pid and host tell replicas apart: each answers a status request sent to all.
        body = {
            "service": ctx.name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "uptime_s": round(time.time() - ctx.started, 3),
            **facts,
        }
        await msg.respond(json.dumps(body).encode())

    sub = await ctx.bus.nc.subscribe(status_subject(ctx.settings, ctx.name), cb=reply)
    return sub.unsubscribe


async def run_service(
    name: str, settings: Settings, nats_url: NatsUrls, database_url: str, stop: asyncio.Event
) -> None:
    """Run service `name` until `stop`. `nats_url`: a URL, or a function giving the URL with
    the credentials of a service name (`Endpoints.nats_url_for`); `database_url`: the
    application role's URL (`Endpoints.app_database_url()`). A single-active service
    (leader.SINGLE_ACTIVE) first takes its lock, waiting as a standby while another copy
    holds it."""
    if name not in SINGLE_ACTIVE:
        await _run_active(name, settings, nats_url, database_url, stop, None)
        return
    device_id = await asyncio.to_thread(_device_id) if name == "agent" else None
    lock = lock_name(settings, name, device_id)
    async with single_active(name, lock, database_url, stop) as lease:
        if lease is not None:
            await _run_active(name, settings, nats_url, database_url, stop, lease)


def _device_id() -> str:
    """An agent is its device: one active agent per device (hardware.fingerprint is cached,
    so the agent's own fingerprint costs nothing more)."""
    from ..machine.hardware import fingerprint

    return fingerprint().device_id


async def _run_active(
    name: str,
    settings: Settings,
    nats_url: NatsUrls,
    database_url: str,
    stop: asyncio.Event,
    lease: Lease | None,
) -> None:
    log = get_logger(name)
    run = entry_point(name)
    nats_url = nats_url_of(nats_url, name)
    bus = await EventBus.connect(settings, nats_url, name)
    engine = make_engine(database_url, pool_size=3)
    ctx = ServiceContext(name, settings, nats_url, database_url, bus, engine, stop)
    unsubscribe = await _answer_status(ctx)
    log.info("service_started")
    watcher = asyncio.create_task(watch(lease, stop)) if lease is not None else None
    work: asyncio.Future[None] = asyncio.ensure_future(run(ctx))
    try:
        if watcher is None:
            await work
        else:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if watcher.done() and watcher.exception() is not None:
                stop.set()  # this copy is no longer the active one: it stops now
                await asyncio.gather(work, return_exceptions=True)
                raise watcher.exception()  # type: ignore[misc]
            await work
    finally:
        if not work.done():  # this coroutine was cancelled: so is the service
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        await unsubscribe()
        await bus.close()
        engine.dispose()
        log.info("service_stopped")


async def run_services(
    names: tuple[str, ...],
    settings: Settings,
    nats_url: NatsUrls,
    database_url: str,
    stop: asyncio.Event,
) -> None:
    """Run the services until `stop`; if one fails, stop the others and re-raise. Each connects
    to NATS as itself when `nats_url` is a function of the service name (see run_service)."""
    tasks = {
        asyncio.create_task(run_service(n, settings, nats_url, database_url, stop), name=n)
        for n in names
    }
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait(tasks | {stopper}, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    failed = [t for t in done if t is not stopper and t.exception() is not None]
    await asyncio.gather(*tasks, return_exceptions=True)
    stopper.cancel()
    if failed:
        raise failed[0].exception()  # type: ignore[misc]


T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T], settings: Settings) -> T:
    """Run a process's services to the end on the event loop the settings choose: uvloop's
    (libuv: its socket writes and callbacks cost less CPU per request, docs/performance.md)
    where installed, else asyncio's own."""
    choice = settings.event_loop
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                main.close()
                raise RuntimeError(
                    "HPC_DS1_EVENT_LOOP=uvloop but uvloop is not installed: "
                    "pip install uvloop, or set it to auto or asyncio"
                ) from None
        else:
            return uvloop.run(main)
    return asyncio.run(main)


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
