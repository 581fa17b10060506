"""The agent: one per device; registers it with its hardware fingerprint and runs its jobs for
real, one at a time in the order they were asked for, recording each run as a measurement event.
Its runs are capped (HPC_DS1_MAX_RUN_S) and killed when it stops."""

from __future__ import annotations

import asyncio
import socket

from hpc_ds1.events import DeviceRegistered, envelope
from hpc_ds1.runtime import ServiceContext
from hpc_ds1.subjects import agent_run_subject

from .jobs import JobRunner, sweep_leftovers

__all__ = ["JobRunner", "run", "sweep_leftovers"]


async def run(ctx: ServiceContext) -> None:
    from hpc_ds1.hardware import fingerprint

    hardware = await asyncio.to_thread(fingerprint)
    event = DeviceRegistered(
        device_id=hardware.device_id,
        hostname=socket.gethostname(),
        fingerprint=hardware.model_dump(mode="json"),
        local=True,
    )
    ctx.facts["device_id"] = hardware.device_id
    # A job left running by a previous process of this home (killed with its guard) dies now.
    await asyncio.to_thread(sweep_leftovers, ctx.settings.home)
    jobs = JobRunner(ctx, hardware.device_id)
    ctx.facts["queued_runs"] = jobs.queued
    jobs.start()
    try:
        # Listen before announcing: whoever sees the registration can send work at once.
        sub = await ctx.bus.nc.subscribe(
            agent_run_subject(ctx.settings, hardware.device_id), cb=jobs.handle
        )
        try:
            await ctx.bus.publish(
                envelope(event, actor="agent", source="agent", prefix=ctx.settings.subject_prefix)
            )
            await ctx.stop.wait()
        finally:
            await sub.unsubscribe()
    finally:
        await jobs.stop()  # kills a running job: the process exits within seconds
