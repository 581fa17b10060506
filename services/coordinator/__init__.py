"""The coordinator: owns tuning sessions (step, keep/revert, stop, pause for approval); after a
restart it rebuilds every unfinished session from the log and drives it on. It also makes the
fleet's lifecycle decisions (fleet.py): requeue or fail a task whose run failed, device
liveness crossings, and requeueing the tasks of a device that went offline or left."""

from __future__ import annotations

import asyncio

from hpc_ds1.eventlog.subjects import start_session_subject
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.security.cancels import cancel_subject

from .coordinator import Coordinator
from .fleet import FleetLifecycle, facts

__all__ = ["Coordinator", "run"]


async def run(ctx: ServiceContext) -> None:
    coordinator = Coordinator(ctx)
    sub = await ctx.bus.nc.subscribe(
        start_session_subject(ctx.settings), cb=coordinator.handle_start
    )
    # Cancels (issue 44, item 4): a session this coordinator drives stops, its run killed.
    cancels = await ctx.bus.nc.subscribe(
        cancel_subject(ctx.settings.subject_prefix, "*"), cb=coordinator.handle_cancel
    )
    ctx.facts["sessions_driven"] = lambda: len(coordinator.tasks)
    fleet = FleetLifecycle(ctx)
    ctx.facts.update(facts(fleet))
    lifecycle = asyncio.create_task(fleet.run(ctx.stop), name="fleet-lifecycle")
    await coordinator.resume_unfinished()
    try:
        await ctx.stop.wait()
    finally:
        await sub.unsubscribe()
        await cancels.unsubscribe()
        await asyncio.gather(lifecycle, return_exceptions=True)
        tasks = list(coordinator.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
