"""The decision service: one ONNX forward pass per decision, thresholds and the familiarity
guard; every decision becomes an event in the log."""

from __future__ import annotations

import asyncio

from hpc_ds1.eventlog.subjects import decide_subject
from hpc_ds1.process.runtime import ServiceContext

from .service import DecisionError, DecisionService

__all__ = ["DecisionError", "DecisionService", "run"]


def _warm_up() -> None:
    """Import the model stack (onnxruntime, scikit-learn, the workloads: 2.2 s here) in a
    thread, so the first decision after a start does not block the event loop importing it."""
    import hpc_ds1.model
    import hpc_ds1.workloads  # noqa: F401


async def run(ctx: ServiceContext) -> None:
    service = DecisionService(ctx)
    subs = [
        # A queue group: with replicas, each request is answered by one of them.
        await ctx.bus.nc.subscribe(
            decide_subject(ctx.settings), queue="decision", cb=service.handle
        ),
        # Model events reach core subscribers too: a new model replaces the cached one.
        await ctx.bus.nc.subscribe(
            f"{ctx.settings.subject_prefix}.model.*.published", cb=service.forget_models
        ),
    ]
    ctx.facts["decisions_in_flight"] = service.in_flight
    ctx.facts["answered"] = lambda: service.answered
    # Listening first: readiness says the service answers, so it must. A request that comes
    # while the imports run waits for them without blocking the loop.
    service.warmed = asyncio.ensure_future(asyncio.to_thread(_warm_up))
    try:
        await ctx.stop.wait()
        await service.warmed
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await service.stop()
