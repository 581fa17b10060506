"""Tasks over HTTP: submit a job to run once wherever in the fleet it is expected to finish
first, list tasks, read one. Reads come from the projection's `tasks` table; a submission is a
task.submitted event (actor: the caller's credential), which placement takes from there.

A workload must be in the registry (hpc_ds1.workloads) and its size within bounds: at least the
workload's smallest size for one rank, at most the largest whose data fits in
MAX_TASK_MEMORY_BYTES (and never past requests.MAX_SIZE); anything else is a 422 naming what is
accepted.

With `Idempotency-Key` a retried submission is one task: the key (scoped by the caller's token)
is the task's id and its event's, and a retry answers the task submitted first
(hpc_ds1.eventlog.idempotency)."""

from __future__ import annotations

import asyncio
import functools
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.idempotency import HEADER, KeyReused, append_once, request_sha256
from hpc_ds1.events import Envelope, TaskSubmitted, envelope, new_id
from hpc_ds1.requests import MAX_SIZE, SAFE_ID_PATTERN, SafeId, Size, WorkloadName
from hpc_ds1.security.tokens import Principal
from hpc_ds1.workloads import UnknownWorkload, get_workload, list_workloads

from ..deps import BusDep, EngineDep, SettingsDep
from ..edge.auth import require
from ..schemas import (
    E404,
    READ_ERRORS,
    WRITE_ERRORS,
    ErrorBody,
    Issue,
    TaskOut,
    TasksPage,
    WorkloadOut,
    Workloads,
)
from .decide import IDEMPOTENCY_KEY_DOC, idempotency_id

MAX_TASK_MEMORY_BYTES: Final = 256 << 30  # the largest job data a task may need (all ranks)
SUBMIT_VISIBLE_S: Final = 5.0  # how long a submission waits for its row (so a GET finds it)
STATUSES: Final = ("submitted", "waiting", "placed", "running", "finished", "failed")
_STATUS_HELP: Final = ", ".join(STATUSES)
TaskStatus = Literal["submitted", "waiting", "placed", "running", "finished", "failed"]
# The current attempt's placement is shown from placed on; a task waiting again has none.
_PLACED: Final = frozenset({"placed", "running", "finished", "failed"})
_PLACEMENT_FIELDS: Final = (
    "device_id",
    "config",
    "expected_s",
    "queue_s",
    "basis",
    "reason",
    "runner_up",
    "guard_rejected",
    "candidates",
    "attempt",
    "verified",
    "claimed_s",
)

Viewer = Annotated[Principal, Depends(require("viewer"))]
Engineer = Annotated[Principal, Depends(require("engineer"))]
TaskId = Annotated[
    str, Path(pattern=SAFE_ID_PATTERN, description="1 to 64 of letters, digits, '_' or '-'.")
]


class TaskBody(BaseModel):
    """POST /v1/tasks: the job. Who submits it is the caller's credential, not a field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadName = Field(description="A registered workload, e.g. nbody.")
    size: Size = Field(description="Problem size, within the workload's bounds.")


@functools.cache
def size_bounds(workload: str) -> tuple[int, int]:
    """The sizes a task of `workload` may have: (smallest for one rank, largest whose data fits
    in MAX_TASK_MEMORY_BYTES, at most MAX_SIZE). Raises UnknownWorkload."""
    wl = get_workload(workload)
    low = wl.min_size(1)
    if wl.memory(MAX_SIZE, 1) <= MAX_TASK_MEMORY_BYTES:
        return low, MAX_SIZE
    fits, over = low, MAX_SIZE  # memory grows with size: bisect for the last size that fits
    while over - fits > 1:
        middle = (fits + over) // 2
        if wl.memory(middle, 1) <= MAX_TASK_MEMORY_BYTES:
            fits = middle
        else:
            over = middle
    return low, fits


def check_job(workload: str, size: int) -> Issue | None:
    """Why (workload, size) cannot be a task, as a field issue; None when it can."""
    try:
        low, high = size_bounds(workload)
    except UnknownWorkload:
        return Issue(
            loc=["body", "workload"],
            msg=f"unknown workload {workload!r}; known workloads: {', '.join(list_workloads())}",
            type="value_error",
        )
    if not low <= size <= high:
        why = (
            f" (the largest whose data fits in {MAX_TASK_MEMORY_BYTES >> 30} GiB)"
            if high < MAX_SIZE
            else ""
        )
        return Issue(
            loc=["body", "size"],
            msg=f"size {size} is out of bounds for {workload}: {low} to {high}{why}",
            type="value_error",
        )
    return None


def task_state(engine: Engine, task_id: str) -> dict[str, Any] | None:
    """The task's row in the projection, or None when it is not (yet) there."""
    t = tables.tasks
    with engine.connect() as conn:
        row = conn.execute(select(t).where(t.c.task_id == task_id)).mappings().first()
    return dict(row) if row is not None else None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def task_json(row: dict[str, Any]) -> dict[str, Any]:
    """The task as the API shows it (see TaskOut)."""
    status = row["status"]
    placed = row.get("placement") or None
    placement = None
    if placed and status in _PLACED:
        placement = {k: placed.get(k) for k in _PLACEMENT_FIELDS}
        placement["guard_rejected"] = bool(placement["guard_rejected"])
        placement["candidates"] = placement["candidates"] or []
    result = None
    if status == "finished":
        result = {
            "device_id": row["device_id"],
            "config": row["config"],
            "runtime_s": row["runtime_s"],
            "expected_s": row["expected_s"],
            "measurement_id": row["measurement_id"],
            "off_estimate": row.get("off_estimate"),
        }
    return {
        "task_id": row["task_id"],
        "workload": row["workload"],
        "size": row["size"],
        "status": status,
        "submitted_by": row["submitted_by"],
        "submitted_at": _iso(row["submitted_at"]),
        "attempt": row["attempt"],
        "placement": placement,
        "waiting_for": row["reason"] if status == "waiting" else None,
        "result": result,
        "failures": [str(f) for f in row.get("failures") or []],
        "updated_at": _iso(row["updated_at"]),
        "placed_at": _iso(row.get("placed_at")) if placement is not None else None,
        "started_at": _iso(row.get("started_at")) if placement is not None else None,
        "finished_at": _iso(row.get("finished_at")) if status == "finished" else None,
    }


def _list(
    engine: Engine, status: str | None, device: str | None, limit: int, before: datetime | None
) -> list[dict[str, Any]]:
    t = tables.tasks
    query = select(t).order_by(t.c.submitted_at.desc(), t.c.task_id.desc()).limit(limit)
    if status:
        query = query.where(t.c.status == status)
    if device:
        query = query.where(t.c.device_id == device)
    if before is not None:
        query = query.where(t.c.submitted_at < before)
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(query).mappings()]


router = APIRouter(tags=["tasks"])


@router.post(
    "/v1/tasks",
    status_code=201,
    response_model=TaskOut,
    responses=WRITE_ERRORS,
)
async def submit(
    settings: SettingsDep,
    bus: BusDep,
    engine: EngineDep,
    body: TaskBody,
    who: Engineer,
    response: Response,
    idempotency_key: Annotated[
        str | None, Header(alias=HEADER, description=IDEMPOTENCY_KEY_DOC)
    ] = None,
) -> Any:
    """Submit a job (engineer role) to run once, on the device where it is expected to
    finish first; placement picks it up from the log. An unknown workload or a size out of
    bounds is a 422 naming what is accepted. With `Idempotency-Key` a retry is answered with
    the task submitted first (header Idempotent-Replayed: true)."""
    key_id = idempotency_id(idempotency_key, who, "POST /v1/tasks")
    # The first look loads the workload registry (imports): off the event loop.
    issue = await asyncio.to_thread(check_job, body.workload, body.size)
    if issue is not None:
        error = ErrorBody(error=f"invalid task: {issue.msg}", detail=[issue])
        return JSONResponse(error.model_dump(exclude_none=True), status_code=422)
    event = TaskSubmitted(
        task_id=key_id or new_id(),
        workload=body.workload,
        size=body.size,
        submitted_by=who.name,
    )
    env = envelope(
        event,
        actor=who.name,
        source="gateway",
        prefix=settings.subject_prefix,
        event_id=key_id,
    )
    if key_id is None:
        await bus.publish(env)
    else:
        asked = request_sha256(body.model_dump_json().encode())
        try:
            original = await append_once(bus, env, asked)
        except KeyReused as error:
            raise HTTPException(422, str(error)) from None
        response.headers["Idempotent-Replayed"] = "false" if original is None else "true"
        if original is not None:
            event = TaskSubmitted.model_validate(original.envelope["data"])
            env = Envelope.model_validate(original.envelope)
    # Answer with the row once it is projected, so the caller's next GET finds the task.
    deadline = asyncio.get_running_loop().time() + SUBMIT_VISIBLE_S
    while asyncio.get_running_loop().time() < deadline:
        row = await asyncio.to_thread(task_state, engine, event.task_id)
        if row is not None:
            return TaskOut.model_validate(task_json(row))
        await asyncio.sleep(0.05)
    when = env.time.isoformat()
    return TaskOut(
        task_id=event.task_id,
        workload=event.workload,
        size=event.size,
        status="submitted",
        submitted_by=who.name,
        submitted_at=when,
        attempt=0,
        updated_at=when,
    )


@router.get("/v1/tasks", responses=READ_ERRORS)
async def list_tasks(
    engine: EngineDep,
    _: Viewer,
    status: Annotated[TaskStatus | None, Query(description=_STATUS_HELP)] = None,
    device: Annotated[
        SafeId | None, Query(description="The device of the current attempt.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    before: Annotated[
        datetime | None,
        Query(
            description="Only tasks submitted before this time (ISO 8601): the last "
            "page's next_before."
        ),
    ] = None,
) -> TasksPage:
    """Tasks, newest first; page with `before` = the previous page's `next_before`."""
    rows = await asyncio.to_thread(_list, engine, status, device, limit, before)
    tasks = [TaskOut.model_validate(task_json(r)) for r in rows]
    next_before = tasks[-1].submitted_at if len(tasks) == limit else None
    return TasksPage(tasks=tasks, next_before=next_before)


@router.get("/v1/workloads", responses=READ_ERRORS)
async def workloads(_: Viewer) -> Workloads:
    """The registered workloads and the sizes a task of each may have (what POST /v1/tasks
    accepts), for forms that offer them."""

    def bounds() -> list[WorkloadOut]:
        return [
            WorkloadOut(name=name, min_size=low, max_size=high)
            for name in list_workloads()
            for low, high in [size_bounds(name)]
        ]

    return Workloads(workloads=await asyncio.to_thread(bounds))


@router.get("/v1/tasks/{task_id}", responses={**READ_ERRORS, **E404})
async def one_task(engine: EngineDep, task_id: TaskId, _: Viewer) -> TaskOut:
    """One task: where it was placed and why, its result or what it waits for, and the
    reason of every abandoned attempt."""
    row = await asyncio.to_thread(task_state, engine, task_id)
    if row is None:
        raise HTTPException(404, f"no task {task_id}")
    return TaskOut.model_validate(task_json(row))
