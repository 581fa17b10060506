"""Runs a requested job for real on this device (queued behind the device lock) and records it."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from pydantic import ValidationError

from hpc_ds1.devicelock import device_lock
from hpc_ds1.events import envelope
from hpc_ds1.log import get_logger
from hpc_ds1.measure import measurement_event
from hpc_ds1.requests import RunRequest
from hpc_ds1.runner import InvalidJob, RunResult, run
from hpc_ds1.runtime import ServiceContext
from hpc_ds1.space import Config, ConfigSpace

log = get_logger("agent")


class JobRunner:
    def __init__(self, ctx: ServiceContext, device_id: str) -> None:
        self.ctx = ctx
        self.device_id = device_id

    async def handle(self, msg: Any) -> None:
        try:
            request = RunRequest.model_validate_json(msg.data)
            result, measurement_id = await self.execute(request)
        except (ValidationError, InvalidJob, ValueError, LookupError) as error:
            await msg.respond(orjson.dumps({"ok": False, "error": str(error)}))
            return
        body = {
            "ok": True,
            "result": result.model_dump(mode="json"),
            "measurement_id": measurement_id,
        }
        await msg.respond(orjson.dumps(body))

    async def execute(self, request: RunRequest) -> tuple[RunResult, str]:
        config = Config.model_validate(request.config)
        home = self.ctx.settings.home

        space = ConfigSpace.for_device(workload=request.workload)
        if request.purpose == "decide":
            # A decision starts from the user's own configuration, which may oversubscribe.
            space = space.runnable()

        def measure() -> RunResult:
            with device_lock(home):
                return run(
                    request.workload, request.size, config, repeats=request.repeats, space=space
                )

        result = await asyncio.to_thread(measure)
        event = measurement_event(result, self.device_id, request.purpose)
        await self.ctx.bus.publish(
            envelope(
                event, actor=request.actor, source="agent", prefix=self.ctx.settings.subject_prefix
            )
        )
        log.info(
            "job_run",
            workload=request.workload,
            size=request.size,
            config=config.label(),
            status=result.status.value,
            runtime_s=result.runtime_s,
        )
        return result, event.measurement_id
