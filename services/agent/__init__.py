"""The agent: one per device; registers it with its hardware fingerprint and runs its jobs for
real, one at a time in the order they were asked for, recording each run as a measurement event.
Its runs are capped (HPC_DS1_MAX_RUN_S) and killed when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from hpc_ds1.eventlog.subjects import agent_cancel_subject, agent_run_subject
from hpc_ds1.events import DeviceRegistered, envelope
from hpc_ds1.log import get_logger
from hpc_ds1.process.runtime import ServiceContext

from .fleet import LocalFleet
from .jobs import JobRunner, sweep_leftovers

__all__ = ["JobRunner", "LocalFleet", "run", "sweep_leftovers"]

log = get_logger("agent")
FLEET_STOP_S = 10.0
FLEET_RETRY_S = 5.0


async def run(ctx: ServiceContext) -> None:
    from hpc_ds1.machine.hardware import fingerprint

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
    fleet_task: asyncio.Task[None] | None = None
    try:
        # Listen before announcing: whoever sees the registration can send work at once.
        sub = await ctx.bus.nc.subscribe(
            agent_run_subject(ctx.settings, hardware.device_id), cb=jobs.handle
        )
        # A cancelled session's run is killed (issue 44, item 4): asked by the coordinator.
        cancels = await ctx.bus.nc.subscribe(
            agent_cancel_subject(ctx.settings, hardware.device_id), cb=jobs.handle_cancel
        )
        try:
            await ctx.bus.publish(
                envelope(event, actor="agent", source="agent", prefix=ctx.settings.subject_prefix)
            )
            # This machine is a device of the fleet too: its tasks, its heartbeats (not in a
            # command's own short-lived stack, which would kill a task when it ends).
            if ctx.settings.fleet_device:
                fleet = LocalFleet(ctx, jobs, hardware.device_id)
                ctx.facts["fleet_completed"] = lambda: fleet.completed
                fleet_task = asyncio.create_task(_keep_running(ctx, fleet), name="agent-fleet")
            await ctx.stop.wait()
        finally:
            await sub.unsubscribe()
            await cancels.unsubscribe()
    finally:
        await jobs.stop()  # kills a running job: the process exits within seconds
        if fleet_task is not None:
            # The killed task's result goes out (one try), then the loop ends.
            done, _ = await asyncio.wait({fleet_task}, timeout=FLEET_STOP_S)
            if not done:
                fleet_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await fleet_task


async def _keep_running(ctx: ServiceContext, fleet: LocalFleet) -> None:
    """The fleet loop until the stop; one that fails (its queue cannot be opened while NATS
    reconnects, say) starts again after a pause, while the agent's own runs carry on."""
    while not ctx.stop.is_set():
        try:
            await fleet.run()
        except Exception as error:
            log.error("fleet_loop_failed", error=repr(error), retry_in_s=FLEET_RETRY_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.stop.wait(), FLEET_RETRY_S)
