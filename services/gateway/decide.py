"""POST /v1/decide: a NATS request to the decision service."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, HTTPException

from hpc_ds1.bus import EventBus
from hpc_ds1.requests import DecideRequest
from hpc_ds1.settings import Settings
from hpc_ds1.subjects import decide_subject
from hpc_ds1.tokens import Principal

from .auth import optional_principal

# With telemetry the answer is one forward pass; without it the job runs first, for real.
FORWARD_PASS_TIMEOUT_S = 10.0
REAL_RUN_TIMEOUT_S = 900.0


async def request_decision(
    bus: EventBus, settings: Settings, body: DecideRequest, actor: str
) -> dict[str, Any]:
    timeout = FORWARD_PASS_TIMEOUT_S if body.telemetry else REAL_RUN_TIMEOUT_S
    try:
        reply = await bus.nc.request(
            decide_subject(settings),
            body.model_dump_json().encode(),
            timeout=timeout,
            headers={"Hpc-Actor": actor},
        )
    except Exception as error:
        raise HTTPException(503, f"the decision service did not answer: {error!r}") from None
    answer = orjson.loads(reply.data)
    if not answer.get("ok"):
        raise HTTPException(int(answer.get("status", 500)), answer.get("error"))
    decision: dict[str, Any] = answer["decision"]
    return decision


def decide_router(settings: Settings, bus: EventBus) -> APIRouter:
    router = APIRouter(tags=["decisions"])

    @router.post("/v1/decide")
    async def decide(
        body: DecideRequest, who: Annotated[Principal, Depends(optional_principal)]
    ) -> dict[str, Any]:
        """The model's next move for a job: choice, confidence, mode (auto / confirm /
        escalate) and the reasons it is not auto. Without `telemetry` the job is first run
        for real on the device; with it, the answer is one forward pass and nothing runs."""
        return await request_decision(bus, settings, body, who.name)

    return router
