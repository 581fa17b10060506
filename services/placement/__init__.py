"""Placement: sends each submitted task to the device expected to finish it first (its queue
plus its own best measured, else predicted, runtime), with why and the runner-up."""

from __future__ import annotations

import asyncio

from hpc_ds1.eventlog.subjects import placement_subject
from hpc_ds1.process.runtime import ServiceContext

from .service import PlacementService, predict, prepare

__all__ = ["PlacementService", "predict", "prepare", "run"]


async def run(ctx: ServiceContext) -> None:
    service = PlacementService(ctx)
    ctx.facts["placed"] = lambda: service.placed
    ctx.facts["waiting"] = lambda: len(service.state.waiting())
    last = await prepare(service)
    sub = await ctx.bus.nc.subscribe(placement_subject(ctx.settings), cb=service.handle_estimate)
    tasks = [
        asyncio.create_task(service.follow(last + 1), name="placement-follow"),
        asyncio.create_task(service.watch_liveness(), name="placement-liveness"),
        asyncio.create_task(service.placer(), name="placement-placer"),
    ]
    stopper = asyncio.create_task(ctx.stop.wait())
    try:
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopper and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        await sub.unsubscribe()
        stopper.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
