"""GET /v1/measurements: what the fleet measured of a workload at a size, per device, for a new
device's warm start (`hpc-ds1 setup --budget N --warm --server URL`, issue 42 item 5). Every
joined device's measurements reach the coordinator's projection; a device that sets up from
them starts at the top of its siblings' consensus instead of from scratch."""

from __future__ import annotations

import asyncio
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel

from hpc_ds1.db.reads import sibling_runs
from hpc_ds1.requests import MAX_SIZE, SAFE_ID_PATTERN, WORKLOAD_NAME_PATTERN
from hpc_ds1.security.tokens import Principal

from ..deps import EngineDep
from ..edge.auth import require
from ..schemas import READ_ERRORS

Reader = Annotated[Principal, Depends(require("viewer"))]
WORKLOAD_NAME = re.compile(WORKLOAD_NAME_PATTERN)
MAX_WORKLOADS = 16


class Run(BaseModel):
    config: dict[str, Any]
    status: str
    runtime_s: float | None


class Sibling(BaseModel):
    device_id: str
    workload: str
    runs: list[Run]


class Siblings(BaseModel):
    size: int
    siblings: list[Sibling]


router = APIRouter(tags=["machine"])


@router.get("/v1/measurements", responses=READ_ERRORS)
async def measurements(
    engine: EngineDep,
    _: Reader,
    workload: Annotated[
        list[str],
        Query(
            min_length=1,
            max_length=MAX_WORKLOADS,
            description="The workload; more names add workloads measured on any device "
            "(recorded GPUs of the same kernel, each a workload of its own).",
        ),
    ],
    size: Annotated[
        int, Query(ge=1, le=MAX_SIZE, description=f"The problem size, 1 to {MAX_SIZE}.")
    ],
    device_id: Annotated[
        str,
        Query(
            pattern=SAFE_ID_PATTERN,
            description="The asking device: its own runs of the first workload are left out.",
        ),
    ] = "",
) -> Siblings:
    """Every run of `workload` at `size` on other devices than `device_id`, and of the
    further workloads on any device: per (device, workload), each run's configuration,
    status and seconds, in log order."""
    bad = [w for w in workload if not WORKLOAD_NAME.fullmatch(w)]
    if bad:
        raise HTTPException(
            422, f"workload {bad[0]!r}: a name of letters, digits, '_', '.' or '-' (≤ 64)"
        )
    found = await asyncio.to_thread(sibling_runs, engine, workload, size, device_id)
    return Siblings(
        size=size,
        siblings=[
            Sibling(
                device_id=device,
                workload=name,
                runs=[Run(config=c, status=s, runtime_s=r) for c, s, r in runs],
            )
            for (device, name), runs in found.items()
        ],
    )
