"""Asking the decision service: a decide request over NATS, and the starting configurations the
decision tests ask from. Shared by the decision tests (the `decider` fixture is in conftest.py)."""

from __future__ import annotations

from typing import Any

import orjson

from hpc_ds1.eventlog.subjects import decide_subject
from hpc_ds1.requests import DecideRequest
from hpc_ds1.stack import Stack
from hpc_ds1.workloads import get_workload

WAIT_S = 90.0
GEMM = {"ranks": 1, "threads": 1, "tile": get_workload("gemm").default_tile}
MONTECARLO = {"ranks": 1, "threads": 1, "tile": get_workload("montecarlo").default_tile}


async def decide(stack: Stack, body: dict[str, Any], timeout: float = WAIT_S) -> dict[str, Any]:
    request = DecideRequest.model_validate(body)
    reply = await stack.bus.nc.request(
        decide_subject(stack.settings), request.model_dump_json().encode(), timeout=timeout
    )
    answer: dict[str, Any] = orjson.loads(reply.data)
    return answer
