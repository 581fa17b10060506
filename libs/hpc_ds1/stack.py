"""What a command needs from the log: the coordinator already serving this home, or, when none
runs, the embedded infrastructure and the named services in this process for its duration."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sqlalchemy import Engine, select

from .db import make_engine, tables
from .eventlog.bus import EventBus
from .eventlog.subjects import status_subject
from .infra.home import Endpoints, own_home, running_owner, settings_of_owner
from .infra.secrets import CLI_USER
from .process.runtime import run_services
from .settings import Settings


@dataclass
class Stack:
    settings: Settings
    bus: EventBus
    engine: Engine
    endpoints: Endpoints
    attached: bool  # True: another process (hpc-ds1 serve) owns the home and runs the services

    async def caught_up(self, within_s: float = 30.0) -> None:
        """Wait until the projection holds every event appended so far."""
        target = await self.bus.last_sequence()
        deadline = asyncio.get_running_loop().time() + within_s
        while await asyncio.to_thread(self._checkpoint) < target:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("the projection did not catch up; is the projector running?")
            await asyncio.sleep(0.05)

    async def local_device(self, within_s: float = 60.0) -> str:
        """The id of this machine's device once its agent's registration is projected."""
        t = tables.devices
        deadline = asyncio.get_running_loop().time() + within_s

        def find() -> str | None:
            with self.engine.connect() as conn:
                query = select(t.c.device_id).where(t.c.local.is_(True)).order_by(t.c.seq.desc())
                return conn.execute(query).scalar()

        while (found := await asyncio.to_thread(find)) is None:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("no local agent registered; is the agent running?")
            await asyncio.sleep(0.1)
        return found

    def _checkpoint(self) -> int:
        with self.engine.connect() as conn:
            value = conn.execute(select(tables.checkpoints.c.last_seq)).scalar()
        return int(value or 0)


@contextlib.asynccontextmanager
async def open_stack(
    settings: Settings, services: tuple[str, ...], name: str, *, fleet_device: bool = False
) -> AsyncIterator[Stack]:
    """`fleet_device`: whether the agent it starts (if any) serves the fleet. A command's own
    stack ends with the command, so by default its agent takes no fleet tasks (it would kill
    them) and sends no heartbeats (the device is not there for the fleet after it)."""
    owner = running_owner(settings.home)
    if owner is not None:
        # The owner's stream, prefix and replicas (load_settings took them already, unless
        # the owner started since); one set here to another value: OwnerMismatch.
        settings = settings_of_owner(settings, owner)
        async with _connected(settings, owner, name, attached=True) as stack:
            yield stack
        return
    with own_home(settings) as endpoints:
        stop = asyncio.Event()
        own = settings.model_copy(update={"fleet_device": fleet_device})
        runner = asyncio.create_task(
            run_services(services, own, endpoints.nats_url_for, endpoints.app_database_url(), stop)
        )
        try:
            async with _connected(settings, endpoints, name, attached=False) as stack:
                await _answering(stack, services, runner)
                yield stack
        finally:
            stop.set()
            await runner


async def _answering(stack: Stack, services: tuple[str, ...], runner: asyncio.Task[None]) -> None:
    """Wait until every started service answers its status subject (it has subscribed)."""
    for service in services:
        for _ in range(600):
            if runner.done():
                runner.result()  # a service failed to start: raise its error
            try:
                await stack.bus.nc.request(
                    status_subject(stack.settings, service), b"", timeout=0.5
                )
                break
            except Exception:
                await asyncio.sleep(0.05)
        else:
            raise TimeoutError(f"the {service} service did not start")


@contextlib.asynccontextmanager
async def _connected(
    settings: Settings, endpoints: Endpoints, name: str, attached: bool
) -> AsyncIterator[Stack]:
    # A command of this home connects as the `cli` user; `name` names its connection.
    # Attached, the streams are the server's: it creates them, never a command.
    url = endpoints.nats_url_for(CLI_USER)
    bus = await EventBus.connect(settings, url, name, create=not attached)
    engine = make_engine(endpoints.app_database_url(), pool_size=2)
    try:
        yield Stack(settings, bus, engine, endpoints, attached)
    finally:
        await bus.close()
        engine.dispose()
