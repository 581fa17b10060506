"""The decision service: one ONNX forward pass per decision, thresholds, familiarity guard."""

from __future__ import annotations

from hpc_ds1.runtime import ServiceContext


async def run(ctx: ServiceContext) -> None:
    # Reachable over NATS (status requests) from the start; its handlers join as they are built.
    await ctx.stop.wait()
