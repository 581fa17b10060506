"""The agent transport: what a remote device's agent does, over HTTP only, outbound from the
device (it needs no open port; NATS stays private to the coordinator).

Every call carries the device's own credential (a token of role "agent"); the device is always
the credential's holder, never a field of the body: a device acts only as itself.

- GET  /v1/agent/work?wait=S           long-poll for the next WorkItem of this device (204 after
                                       S seconds with none); refreshes the heartbeat meanwhile.
- POST /v1/agent/heartbeat             what it runs (its own task only) and holds (liveness KV,
                                       server time).
- POST /v1/agent/tasks/{id}/started    the current attempt started.
- POST /v1/agent/tasks/{id}/result     the attempt's result: a measurement (purpose "task") and
                                       task.finished or task.run_failed.
- POST /v1/agent/measurements          its own measurements (≤ 5000 per call), de-duplicated;
                                       runtimes that cannot be true refused (fleet/plausible).
- POST /v1/agent/model                 its own model (raw ONNX), stored in the model bucket.

The long-poll bridges to the device's durable pull consumer on the work stream (fleet/work.py):
one subscription per device and gateway process, made on the first poll and reused. A waiting
poll holds no database connection and no thread: it awaits the consumer's fetch. An item whose
task is no longer placed at that attempt on this device is acked and skipped; one whose row the
projector has not written yet is waited for (up to LAG_WAIT_S), then put back for a moment.

What the agent reports is appended with deterministic envelope ids (`started-<task>-<attempt>`,
`finished-…`, `runfailed-…`, `measurement-<id>`, `model-<device>-<version>`): the log stores a
repeated report once, and the task's row (or the measurement already projected) tells a late
repeat that it was recorded before."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Annotated, Any, Final

import orjson
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Query, Request, Response
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NoStreamResponseError
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import PUBLISH_RETRY_S, EventBus
from hpc_ds1.events import (
    Envelope,
    Event,
    MeasurementRecorded,
    ModelPublished,
    TaskStarted,
)
from hpc_ds1.events.base import subject_for
from hpc_ds1.fleet.execute import TaskResult, measurement_id_for, task_events
from hpc_ds1.fleet.work import WorkItem
from hpc_ds1.log import get_logger
from hpc_ds1.models_store import models_bucket
from hpc_ds1.requests import (
    SAFE_ID,
    SAFE_ID_PATTERN,
)
from hpc_ds1.security.tokens import Principal
from hpc_ds1.settings import Settings

from ..api.tasks import TaskId, task_state
from ..deps import BusDep, EngineDep, SettingsDep
from ..edge.auth import require
from ..schemas import (
    E404,
    E409,
    E413,
    WRITE_ERRORS,
    AgentResultOut,
    MeasurementsUploaded,
    ModelUploaded,
    RefusedMeasurement,
)
from .bodies import (
    MEASUREMENTS_PATH,
    MODEL_PATH,
    HeartbeatBody,
    MeasurementIn,
    MeasurementsBody,
    ResultBody,
    StartedBody,
)
from .bridge import LAG_WAIT_S, AgentBridge
from .plausibility import Claimed, refusals

log = get_logger("gateway.agent")

MAX_METRICS_BYTES: Final = 16 << 10
_DONE: Final = frozenset({"finished", "failed"})
_ACTIVE: Final = frozenset({"placed", "running"})


# --- appending -----------------------------------------------------------------------------


def _envelope(
    settings: Settings, event: Event, env_id: str, actor: str, correlation_id: str | None = None
) -> Envelope:
    return Envelope(
        id=env_id,
        type=event.event_type(),
        version=event.version,
        subject=subject_for(settings.subject_prefix, event),
        actor=actor,
        source="gateway",
        correlation_id=correlation_id or env_id,
        data=event.model_dump(mode="json"),
    )


async def append(bus: EventBus, env: Envelope) -> bool:
    """Append `env` (its id as Nats-Msg-Id); False when the log already held that id (within
    its de-duplication window). An unanswered append is sent again, as bus.publish does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PUBLISH_RETRY_S
    while True:
        try:
            ack = await bus.js.publish(
                env.subject, env.to_json(), stream=bus.stream, headers={"Nats-Msg-Id": env.id}
            )
        except (NatsTimeout, NoStreamResponseError) as error:
            if loop.time() >= deadline:
                raise
            log.warning("publish_retry", subject=env.subject, error=repr(error))
            await asyncio.sleep(0.25)
            continue
        return not ack.duplicate


def _known_measurements(engine: Engine, ids: list[str]) -> set[str]:
    t = tables.measurements
    found: set[str] = set()
    with engine.connect() as conn:
        for start in range(0, len(ids), 1000):
            chunk = ids[start : start + 1000]
            query = select(t.c.measurement_id).where(t.c.measurement_id.in_(chunk))
            found.update(conn.execute(query).scalars())
    return found


def _measured_by(engine: Engine, measurement_id: str) -> str | None:
    """The device of a measurement already projected, or None."""
    t = tables.measurements
    with engine.connect() as conn:
        query = select(t.c.device_id).where(t.c.measurement_id == measurement_id)
        found = conn.execute(query).scalar()
    return str(found) if found is not None else None


def _model_row(engine: Engine, version: str) -> dict[str, Any] | None:
    t = tables.models
    with engine.connect() as conn:
        row = conn.execute(select(t).where(t.c.model_version == version)).mappings().first()
    return dict(row) if row is not None else None


def _model_refused(data: bytes, settings: Settings) -> str | None:
    """Why model.vetting refuses the upload (its static check, then a child process under a
    memory and time cap loads and runs it), in our words; None: accepted. The gateway never
    builds a session from an upload itself (issue 41: a 156-byte model took it to 2.35 GB; a
    model's external data made it read a file, and onnxruntime's error told of it)."""
    # imported on the first upload, in this thread: onnx and onnxruntime take a second
    from hpc_ds1.model.vetting import UnsafeModel, vet

    try:
        vet(
            data,
            settings.max_model_bytes,
            settings.model_vet_memory_mb,
            settings.model_vet_timeout_s,
        )
    except UnsafeModel as error:
        return str(error)
    return None


async def device_of(principal: Annotated[Principal, Depends(require("agent"))]) -> str:
    """The caller's device: the holder of its agent token, never a field of the request."""
    if not SAFE_ID.match(principal.name):
        raise HTTPException(403, f"the agent token's holder {principal.name!r} is not a device id")
    return principal.name


Device = Annotated[str, Depends(device_of)]


# --- the task reports ----------------------------------------------------------------------


async def _current_task(
    engine: Engine, task_id: str, attempt: int, device: str
) -> tuple[dict[str, Any], str | None]:
    """The task's row once it shows `attempt` (waiting up to LAG_WAIT_S for the projector),
    and None, or a reason the attempt is over ('done'). Raises 404, 409 or 403."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LAG_WAIT_S
    while True:
        row = await asyncio.to_thread(task_state, engine, task_id)
        if (row is not None and row["attempt"] >= attempt) or loop.time() >= deadline:
            break
        await asyncio.sleep(0.05)
    if row is None:
        raise HTTPException(404, f"no task {task_id}")
    where = row["device_id"] or "no device"
    if row["attempt"] != attempt:
        raise HTTPException(
            409,
            f"attempt {attempt} of task {task_id} is not current: the task is at attempt "
            f"{row['attempt']} ({row['status']}, on {where})",
        )
    if row["device_id"] != device:
        raise HTTPException(
            403, f"{device} may not report on task {task_id}: attempt {attempt} is on {where}"
        )
    if row["status"] in _DONE:
        return row, f"task {task_id} is already {row['status']}"
    if row["status"] not in _ACTIVE:
        raise HTTPException(
            409,
            f"attempt {attempt} of task {task_id} is no longer current: the task is "
            f"{row['status']}, to be placed again",
        )
    return row, None


async def _check_running(engine: Engine, device: str, task_id: str) -> None:
    """A heartbeat speaks only for the device's own task: one whose current attempt is placed
    on this device (placed, running, or just ended there: a beat sent as the run ended). Raises
    403 otherwise. The device got the task only once its row showed it placed here, so a row
    that does not is waited for (up to LAG_WAIT_S: a projection being rebuilt) only to be sure."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LAG_WAIT_S
    while True:
        row = await asyncio.to_thread(task_state, engine, task_id)
        if row is not None and row["device_id"] == device:
            return
        if loop.time() >= deadline:
            break
        await asyncio.sleep(0.05)
    if row is None:
        why = "there is no such task"
    else:
        why = f"attempt {row['attempt']} is on {row['device_id'] or 'no device'} ({row['status']})"
    raise HTTPException(403, f"{device} may not report running task {task_id}: {why}")


def install_agent_api(app: FastAPI, settings: Settings, bus: EventBus, engine: Engine) -> None:
    """Add the /v1/agent/* routes with their long-poll bridge (app.state.agent_bridge);
    `close_agent_polls(app)` ends their open polls (call it when the gateway stops, before the
    server waits for the requests in flight). Wire edge.BodyLimit with `body_limits(settings)`
    as its exemptions so model and measurement uploads get their own limits."""
    bridge = AgentBridge(settings, bus, engine)
    app.state.agent_bridge = bridge
    app.router.on_shutdown.append(bridge.close)
    app.include_router(router)


def agent_bridge(request: Request) -> AgentBridge:
    bridge: AgentBridge = request.app.state.agent_bridge
    return bridge


BridgeDep = Annotated[AgentBridge, Depends(agent_bridge)]


async def close_agent_polls(app: FastAPI) -> None:
    bridge = getattr(app.state, "agent_bridge", None)
    if isinstance(bridge, AgentBridge):
        await bridge.close()


router = APIRouter(tags=["agent"])


@router.get(
    "/v1/agent/work",
    response_model=WorkItem,
    responses={**WRITE_ERRORS, 204: {"description": "No work came within `wait`."}},
)
async def work(
    settings: SettingsDep,
    bridge: BridgeDep,
    request: Request,
    device: Device,
    wait: float | None = Query(
        None,
        gt=0,
        description="Seconds to wait for work; default and at most: the server's long-poll "
        "time (HPC_DS1_LONG_POLL_S, the join answer's long_poll_s).",
    ),
) -> Any:
    """The device's next task attempt (long-poll): 200 with the WorkItem as soon as one is
    there, 204 after `wait` seconds without one. Also keeps its heartbeat fresh."""
    longest = settings.long_poll_s
    if wait is not None and wait > longest:
        raise _invalid(f"wait {wait:g}: at most {longest:g} seconds (the server's long poll)")
    item = await bridge.poll(device, longest if wait is None else wait, _hung_up(request))
    if item is None:
        return Response(status_code=204)
    return item


@router.post("/v1/agent/heartbeat", status_code=204, responses=WRITE_ERRORS)
async def heartbeat(
    engine: EngineDep, bridge: BridgeDep, body: HeartbeatBody, device: Device
) -> Response:
    """What the device runs and holds; stored with the server's time (liveness bucket).
    `running` must be its own task (placed on it): another's is refused (403)."""
    known = bridge._reported.get(device)
    if body.running is not None and (known is None or known.running != body.running):
        await _check_running(engine, device, body.running)  # checked once per task
    await bridge.report(device, body)
    return Response(status_code=204)


@router.post(
    "/v1/agent/tasks/{task_id}/started",
    status_code=204,
    responses={**WRITE_ERRORS, **E404, **E409},
)
async def started(
    settings: SettingsDep,
    bus: BusDep,
    engine: EngineDep,
    bridge: BridgeDep,
    task_id: TaskId,
    body: StartedBody,
    device: Device,
) -> Response:
    """The device started the attempt (409 when the attempt is not current, 403 when it is
    another device's)."""
    row, done = await _current_task(engine, task_id, body.attempt, device)
    if done is not None:
        raise HTTPException(409, f"{done}: it cannot start again")
    if row["status"] == "placed":
        event = TaskStarted(task_id=task_id, attempt=body.attempt, device_id=device)
        env_id = f"started-{task_id}-{body.attempt}"
        await append(bus, _envelope(settings, event, env_id, device, task_id))
        await bridge.running(device, task_id)
    return Response(status_code=204)


@router.post(
    "/v1/agent/tasks/{task_id}/result",
    responses={**WRITE_ERRORS, **E404, **E409},
)
async def result(
    settings: SettingsDep,
    bus: BusDep,
    engine: EngineDep,
    bridge: BridgeDep,
    task_id: TaskId,
    body: ResultBody,
    device: Device,
) -> AgentResultOut:
    """The attempt's result, recorded once: the run's measurement (purpose "task", when it
    ran: status ok, or `repeats` given) and task.finished, or task.run_failed when it did
    not run to a correct end. A repeat answers `recorded: false` with why."""
    measurement_id = measurement_id_for(task_id, body.attempt)
    before = f"the result of attempt {body.attempt} of task {task_id} was recorded before"
    recorded_by = await asyncio.to_thread(_measured_by, engine, measurement_id)
    if recorded_by is not None and recorded_by != device:
        raise HTTPException(
            403,
            f"{device} may not report on task {task_id}: attempt {body.attempt} ran on "
            f"{recorded_by}",
        )
    if recorded_by is not None:
        return AgentResultOut(recorded=False, measurement_id=measurement_id, why=before)
    row, done = await _current_task(engine, task_id, body.attempt, device)
    if done is not None:
        return AgentResultOut(recorded=False, why=done)
    if len(row["failures"] or []) >= body.attempt:
        return AgentResultOut(recorded=False, why=before)  # this attempt's failure is in
    result = TaskResult.model_validate(body.model_dump(mode="json"))
    why: str | None = None
    if body.status == "ok" and body.runtime_s is not None:
        claim = Claimed(row["workload"], row["size"], body.runtime_s, result.config)
        (why,) = await asyncio.to_thread(refusals, engine, device, [claim])
        if why is not None:
            # Not a measurement anyone may use: the attempt failed (the coordinator
            # requeues the task elsewhere), and the device is told why.
            error = f"its reported runtime is refused: {why}"
            result = TaskResult(
                attempt=body.attempt, status="failed", config=result.config, error=error
            )
    # The device's own estimate (placement may have counted an unverified one higher).
    placement = row["placement"] if isinstance(row["placement"], dict) else {}
    claimed_s = placement.get("claimed_s")
    own_estimate = claimed_s if isinstance(claimed_s, int | float) else row["expected_s"]
    measured, outcome = _split(
        task_events(
            task_id,
            device,
            result,
            workload=row["workload"],
            size=row["size"],
            expected_s=own_estimate,
            actor=device,
            source="gateway",
            prefix=settings.subject_prefix,
        )
    )
    fresh = await append(bus, measured) if measured is not None else False
    # Appended even when the measurement was a repeat: a report cut off between the two
    # appends completes on its retry, and a complete one is stored once either way.
    fresh = await append(bus, outcome) or fresh
    await bridge.running(device, None, finished=task_id)
    if why is not None:
        log.warning("task_result_refused", device_id=device, task_id=task_id, why=why)
        raise HTTPException(
            422,
            f"the result of attempt {body.attempt} of task {task_id} is refused: {why}; "
            "it is recorded as a failed run",
        )
    kept = measurement_id if result.ran else None
    if not fresh:
        return AgentResultOut(recorded=False, measurement_id=kept, why=before)
    log.info("task_result", device_id=device, task_id=task_id, status=body.status, ran=result.ran)
    return AgentResultOut(recorded=True, measurement_id=kept)


@router.post(MEASUREMENTS_PATH, responses=WRITE_ERRORS)
async def measurements(
    settings: SettingsDep, bus: BusDep, engine: EngineDep, body: MeasurementsBody, device: Device
) -> MeasurementsUploaded:
    """The device's own measurements (at most 5000 a call), recorded under its identity:
    one already recorded (by measurement_id) is counted as known, not appended again. A
    runtime that cannot be true (faster than the device's claimed hardware, or far ahead of
    the fleet's verified runtimes of the job) is refused: listed with why, not recorded;
    the others are."""
    unique: dict[str, MeasurementIn] = {}
    given: dict[str, str] = {}  # our id -> the device's own
    for m in body.measurements:
        # A home's ids (setup:<hardware id>:...) are the same on identical machines: each
        # device's are its own, so one device can neither shadow nor squat another's.
        own = f"{device}:{m.measurement_id}"
        given.setdefault(own, m.measurement_id)
        unique.setdefault(own, m.model_copy(update={"measurement_id": own}))
    known = await asyncio.to_thread(_known_measurements, engine, list(unique))
    fresh = [m for m in unique.values() if m.measurement_id not in known]
    timed = [m for m in fresh if m.status == "ok" and m.runtime_s is not None]
    claims = [
        Claimed(m.workload, m.size, float(m.runtime_s or 0.0), m.config.model_dump()) for m in timed
    ]
    whys = await asyncio.to_thread(refusals, engine, device, claims)
    refused = {m.measurement_id: why for m, why in zip(timed, whys, strict=True) if why}
    envs = [
        _envelope(
            settings,
            MeasurementRecorded(device_id=device, **m.model_dump()),
            f"measurement-{m.measurement_id}",
            device,
        )
        for m in fresh
        if m.measurement_id not in refused
    ]
    accepted = 0
    for start in range(0, len(envs), 256):
        chunk = envs[start : start + 256]
        accepted += sum(await asyncio.gather(*(append(bus, e) for e in chunk)))
    listed = [RefusedMeasurement(measurement_id=given[k], why=v) for k, v in refused.items()]
    in_body = sum(1 for m in body.measurements if f"{device}:{m.measurement_id}" in refused)
    if refused:
        log.warning(
            "measurements_refused", device_id=device, refused=len(refused), first=listed[0].why
        )
    log.info("measurements_uploaded", device_id=device, accepted=accepted)
    return MeasurementsUploaded(
        accepted=accepted,
        known=len(body.measurements) - accepted - in_body,
        refused=listed,
    )


@router.post(
    MODEL_PATH,
    status_code=201,
    responses={**WRITE_ERRORS, **E409, **E413},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def model(
    settings: SettingsDep,
    bus: BusDep,
    engine: EngineDep,
    request: Request,
    device: Device,
    version: str = Query(pattern=SAFE_ID_PATTERN, description="The model's version."),
    sha256: str = Query(pattern=r"^[0-9a-fA-F]{64}$", description="SHA-256 of the body."),
    trained_on: int = Query(ge=0, le=1 << 40, description="Measurements it was trained on."),
    x_model_metrics: str | None = Header(
        None, max_length=MAX_METRICS_BYTES, description="Its metrics, a JSON object."
    ),
) -> ModelUploaded:
    """The device's own model: the ONNX file as the body. Checked (SHA-256; vetted by
    hpc_ds1.model.vetting before anything runs it, 422 saying what was wrong), stored in the
    model bucket as `<device>/<version>.onnx` and published as model version
    `<device>:<version>`. The same version again is accepted once more, with the same bytes
    only."""
    metrics = _metrics(x_model_metrics)
    data = await request.body()
    if not data:
        raise _invalid("the body must be the model's ONNX bytes (application/octet-stream)")
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256.lower():
        raise _invalid(f"the body's SHA-256 is {digest}, not the sha256 given ({sha256})")
    model_version = f"{device}:{version}"
    known = await asyncio.to_thread(_model_row, engine, model_version)
    if known is not None and known["sha256"] != digest:
        raise HTTPException(
            409,
            f"model {model_version} is already published with other bytes: use a new version",
        )
    refused = await asyncio.to_thread(_model_refused, data, settings)
    if refused is not None:
        raise _invalid(f"the body is not an hpc_ds1 ONNX model we accept: {refused}")
    artifact = f"{device}/{version}.onnx"
    store = await models_bucket(bus.js, settings)
    assert store is not None
    await store.put(artifact, data)
    event = ModelPublished(
        model_version=model_version,
        device_id=device,
        artifact=artifact,
        sha256=digest,
        metrics=metrics,
        trained_on=trained_on,
    )
    await append(bus, _envelope(settings, event, f"model-{device}-{version}", device))
    log.info("model_uploaded", device_id=device, model_version=model_version, bytes=len(data))
    return ModelUploaded(model_version=model_version)


def _split(envs: list[Envelope]) -> tuple[Envelope | None, Envelope]:
    """task_events' answer: (the run's measurement, when it ran; task.finished or run_failed)."""
    return (envs[0] if len(envs) == 2 else None), envs[-1]


async def _hung_up(request: Request) -> None:
    """Completes when the caller closes its connection (an ASGI http.disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _invalid(message: str) -> HTTPException:
    return HTTPException(422, message)


def _metrics(header: str | None) -> dict[str, Any]:
    if header is None:
        return {}
    try:
        value = orjson.loads(header)
    except orjson.JSONDecodeError:
        raise _invalid("the X-Model-Metrics header must be a JSON object") from None
    if not isinstance(value, dict):
        raise _invalid("the X-Model-Metrics header must be a JSON object")
    return value


__all__ = [
    "AgentBridge",
    "append",
    "close_agent_polls",
    "install_agent_api",
    "router",
]
