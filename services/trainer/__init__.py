"""The trainer: turns a device's measurements into its ONNX model, stores the artifact in the
Object Store and under $HPC_DS1_HOME/models/, and publishes a model event."""

from __future__ import annotations

from hpc_ds1.eventlog.subjects import train_subject
from hpc_ds1.process.runtime import ServiceContext

from .training import Trainer

__all__ = ["Trainer", "run"]


async def run(ctx: ServiceContext) -> None:
    trainer = Trainer(ctx)
    # A queue group: with replicas, each training request goes to one of them.
    sub = await ctx.bus.nc.subscribe(
        train_subject(ctx.settings), queue="trainer", cb=trainer.handle
    )
    try:
        await ctx.stop.wait()
    finally:
        await sub.unsubscribe()
