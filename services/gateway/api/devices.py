"""The fleet's devices: GET /v1/devices, GET /v1/devices/{id} (viewer), POST
/v1/devices/{id}/drain and POST /v1/devices/{id}/revoke (admin).

A device's status, first that applies: `left` (revoked or gone), `draining` (takes no new
tasks), `offline` (no heartbeat within settings.offline_after_s in the liveness KV bucket),
`busy` (running a task: its heartbeat says so, or a task of the projection runs on it), `online`.
Read from the projection (devices, measurements, models, tasks) and the liveness bucket, whose
heartbeats are read once per request."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Request
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine, and_, distinct, func, select, true
from sqlalchemy.dialects.postgresql import distinct_on

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import DeviceDraining, DeviceLeft, TokenRevoked, envelope
from hpc_ds1.fleet.liveness import Heartbeat, all_beats, is_online, last_beat, liveness_bucket
from hpc_ds1.log import get_logger
from hpc_ds1.requests import SAFE_ID_PATTERN
from hpc_ds1.security.tokens import Principal
from hpc_ds1.settings import Settings

from ..deps import BusDep, EngineDep
from ..edge.auth import require
from ..schemas import E404, E409, READ_ERRORS, WRITE_ERRORS

log = get_logger("gateway.devices")

# How long drain and revoke wait for the projector to show what they published.
PROJECTED_WAIT_S = 10.0
Status = Literal["online", "busy", "offline", "draining", "left"]

# Module level: with postponed annotations FastAPI resolves these names in module globals.
Viewer = Annotated[Principal, Depends(require("viewer"))]
Admin = Annotated[Principal, Depends(require("admin"))]
DeviceId = Annotated[
    str, Path(pattern=SAFE_ID_PATTERN, description="1 to 64 of letters, digits, '_' or '-'.")
]


class Hardware(BaseModel):
    cpu_model: str | None
    cores: int | None = Field(description="Physical cores.")
    logical_cpus: int | None
    memory_gib: float | None
    gpus: list[str]


class Kernel(BaseModel):
    """What the device has measured of one workload."""

    workload: str
    sizes: list[int]
    runs: int
    correct_runs: int = Field(description="Runs with status ok whose check did not fail.")


class ModelInfo(BaseModel):
    model_version: str
    trained_on: int
    published_at: str


class WorkingOn(BaseModel):
    task_id: str
    workload: str | None
    size: int | None


class Device(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device_id: str
    hostname: str
    local: bool
    status: Status
    status_reason: str | None = Field(description="Why offline, draining or left.")
    draining: bool
    hardware: Hardware
    fingerprint: dict[str, Any]
    measured: list[Kernel]
    model: ModelInfo | None
    working_on: WorkingOn | None
    queued: int = Field(description="Tasks placed on it, not started yet.")
    last_heartbeat_s: float | None = Field(description="Seconds since its last heartbeat.")
    registered_at: str
    off_estimates: int = Field(
        default=0,
        description="Its finished tasks whose runtime was far from its own estimate (more than "
        "hpc_ds1.fleet.plausible.OFF_ESTIMATE_FACTOR times either way).",
    )
    off_estimate: str | None = Field(default=None, description="The last of them: how far off.")


class Devices(BaseModel):
    devices: list[Device]


class DrainBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    draining: bool = Field(
        strict=True, description="true: take no new tasks (running ones finish); false: resume."
    )


class Revoked(BaseModel):
    device_id: str
    status: Status
    revoked_tokens: list[str] = Field(description="Public ids of the credentials revoked now.")


def _hardware(fingerprint: dict[str, Any]) -> Hardware:
    def whole(key: str) -> int | None:
        value = fingerprint.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    memory = whole("memory_bytes")
    gpus = fingerprint.get("gpus") or []
    return Hardware(
        cpu_model=str(fingerprint["cpu_model"]) if fingerprint.get("cpu_model") else None,
        cores=whole("physical_cores"),
        logical_cpus=whole("logical_cpus"),
        memory_gib=round(memory / 2**30, 1) if memory is not None else None,
        gpus=[str(g.get("name", "gpu")) for g in gpus if isinstance(g, dict)],
    )


def _load(engine: Engine, device_id: str | None, running_ids: set[str]) -> dict[str, Any]:
    """Everything the projection knows for the device views. Blocking (DB)."""
    d, m, md, t = tables.devices, tables.measurements, tables.models, tables.tasks

    def only(column: Any) -> Any:
        return column == device_id if device_id is not None else true()

    correct = func.count().filter(and_(m.c.status == "ok", m.c.check_ok.is_not(False)))
    kernels = (
        select(
            m.c.device_id,
            m.c.workload,
            func.array_agg(distinct(m.c.size)).label("sizes"),
            func.count().label("runs"),
            correct.label("correct_runs"),
        )
        .where(only(m.c.device_id))
        .group_by(m.c.device_id, m.c.workload)
        .order_by(m.c.device_id, m.c.workload)
    )
    models = (
        select(md.c.device_id, md.c.model_version, md.c.trained_on, md.c.published_at)
        .where(only(md.c.device_id))
        .ext(distinct_on(md.c.device_id))
        .order_by(md.c.device_id, md.c.published_at.desc(), md.c.seq.desc())
    )
    running = (
        select(t.c.task_id, t.c.device_id, t.c.workload, t.c.size)
        .where(t.c.status == "running", only(t.c.device_id))
        .order_by(t.c.started_at.desc().nulls_last())
    )
    queued = (
        select(t.c.device_id, func.count().label("n"))
        .where(t.c.status == "placed", only(t.c.device_id))
        .group_by(t.c.device_id)
    )
    with engine.connect() as conn:
        devices = conn.execute(
            select(d).where(only(d.c.device_id)).order_by(d.c.registered_at, d.c.device_id)
        ).mappings()
        found: dict[str, Any] = {"devices": [dict(r) for r in devices]}
        found["kernels"] = [dict(r) for r in conn.execute(kernels).mappings()]
        found["models"] = {r.device_id: r for r in conn.execute(models)}
        found["running"] = {}
        for r in conn.execute(running):
            found["running"].setdefault(r.device_id, r)
        found["queued"] = {r.device_id: int(r.n) for r in conn.execute(queued)}
        found["tasks"] = {}
        if running_ids:
            named = select(t.c.task_id, t.c.workload, t.c.size).where(t.c.task_id.in_(running_ids))
            found["tasks"] = {r.task_id: r for r in conn.execute(named)}
    return found


def _view(
    row: dict[str, Any],
    found: dict[str, Any],
    beat: Heartbeat | None,
    settings: Settings,
    now: float,
) -> Device:
    device_id = row["device_id"]
    fingerprint = row["fingerprint"] if isinstance(row["fingerprint"], dict) else {}
    measured = [
        Kernel(
            workload=k["workload"],
            sizes=sorted(int(s) for s in k["sizes"]),
            runs=int(k["runs"]),
            correct_runs=int(k["correct_runs"]),
        )
        for k in found["kernels"]
        if k["device_id"] == device_id
    ]
    model_row = found["models"].get(device_id)
    model = (
        ModelInfo(
            model_version=model_row.model_version,
            trained_on=model_row.trained_on,
            published_at=model_row.published_at.isoformat(),
        )
        if model_row is not None
        else None
    )
    working_on: WorkingOn | None = None
    task = found["running"].get(device_id)
    if task is not None:
        working_on = WorkingOn(task_id=task.task_id, workload=task.workload, size=task.size)
    elif beat is not None and beat.running:
        named = found["tasks"].get(beat.running)
        working_on = WorkingOn(
            task_id=beat.running,
            workload=named.workload if named is not None else None,
            size=named.size if named is not None else None,
        )
    online = is_online(beat, settings, now)
    since = round(max(0.0, now - beat.time), 1) if beat is not None else None
    status: Status
    reason: str | None = None
    if row["status"] == "left":
        status, reason = "left", "revoked or left the fleet"
    elif row["draining"]:
        status, reason = "draining", "takes no new tasks"
    elif not online:
        status = "offline"
        reason = "never heard from" if since is None else f"no heartbeat for {since:.0f} s"
    elif working_on is not None:
        status = "busy"
    else:
        status = "online"
    return Device(
        device_id=device_id,
        hostname=row["hostname"],
        local=row["local"],
        status=status,
        status_reason=reason,
        draining=bool(row["draining"]),
        hardware=_hardware(fingerprint),
        fingerprint=fingerprint,
        measured=measured,
        model=model,
        working_on=working_on,
        queued=found["queued"].get(device_id, 0),
        last_heartbeat_s=since,
        registered_at=row["registered_at"].isoformat(),
        off_estimates=int(row.get("off_estimates") or 0),
        off_estimate=row.get("off_estimate"),
    )


def _device_row(engine: Engine, device_id: str) -> dict[str, Any] | None:
    d = tables.devices
    with engine.connect() as conn:
        row = conn.execute(select(d).where(d.c.device_id == device_id)).mappings().first()
    return dict(row) if row is not None else None


def _agent_tokens(engine: Engine, device_id: str) -> list[str]:
    """The public ids of the device's unrevoked credentials. Blocking (DB)."""
    t = tables.tokens
    query = select(t.c.token_id).where(
        t.c.holder == device_id, t.c.role == "agent", t.c.revoked.is_(False)
    )
    with engine.connect() as conn:
        return [r.token_id for r in conn.execute(query.order_by(t.c.token_id))]


async def _until(check: Any, wait_s: float) -> bool:
    """Poll a blocking check until it holds or `wait_s` passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        if await asyncio.to_thread(check):
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.05)


class DeviceViews:
    """The devices as GET /v1/devices shows them: the projection's rows joined with the
    liveness bucket's heartbeats. One per app (`device_views`): it keeps the bucket and the
    devices the last listing showed."""

    def __init__(self, settings: Settings, bus: EventBus, engine: Engine) -> None:
        self.settings, self.bus, self.engine = settings, bus, engine
        self.bucket: KeyValue | None = None
        # the devices the last listing showed, read by key as well: a key put while the bucket
        # is listed can be missing from the listing and would show a live device as offline
        self.known: set[str] = set()

    async def kv(self) -> KeyValue:
        if self.bucket is None:
            self.bucket = await liveness_bucket(self.bus.js, self.settings)
        return self.bucket

    async def beats(self, device_id: str | None) -> dict[str, Heartbeat]:
        """The heartbeats (all, or one device's); none when the bucket cannot be read."""
        try:
            if device_id is None:
                return await all_beats(await self.kv(), also=tuple(self.known))
            one = await last_beat(await self.kv(), device_id)
            return {device_id: one} if one is not None else {}
        except Exception as error:
            log.warning("liveness_unreadable", error=f"{type(error).__name__}: {error}")
            return {}

    async def views(self, device_id: str | None) -> list[Device]:
        heard = await self.beats(device_id)
        running = {b.running for b in heard.values() if b.running}
        found = await asyncio.to_thread(_load, self.engine, device_id, running)
        now = time.time()
        if device_id is None:
            self.known.clear()
            self.known.update(row["device_id"] for row in found["devices"])
        return [
            _view(row, found, heard.get(row["device_id"]), self.settings, now)
            for row in found["devices"]
        ]

    async def one(self, device_id: str) -> Device:
        found = await self.views(device_id)
        if not found:
            raise HTTPException(404, f"no device {device_id!r}; GET /v1/devices lists them")
        return found[0]


def device_views(request: Request) -> DeviceViews:
    state = request.app.state
    if getattr(state, "device_views", None) is None:
        state.device_views = DeviceViews(state.settings, state.bus, state.engine)
    views: DeviceViews = state.device_views
    return views


Views = Annotated[DeviceViews, Depends(device_views)]


router = APIRouter(tags=["devices"])


@router.get("/v1/devices", responses=READ_ERRORS)
async def list_devices(views: Views, _: Viewer) -> Devices:
    """Every registered device, the coordinator's own included: status, hardware, measured
    kernels, its model, what it works on."""
    return Devices(devices=await views.views(None))


@router.get("/v1/devices/{device_id}", responses={**READ_ERRORS, **E404})
async def get_device(views: Views, device_id: DeviceId, _: Viewer) -> Device:
    """One device (see GET /v1/devices)."""
    return await views.one(device_id)


@router.post("/v1/devices/{device_id}/drain", responses={**WRITE_ERRORS, **E404, **E409})
async def drain(
    bus: BusDep, engine: EngineDep, views: Views, device_id: DeviceId, body: DrainBody, who: Admin
) -> Device:
    """Stop (draining true) or resume (false) sending new tasks to the device; what it runs
    finishes. Answers the device once the projection shows it."""
    row = await asyncio.to_thread(_device_row, engine, device_id)
    if row is None:
        raise HTTPException(404, f"no device {device_id!r}; GET /v1/devices lists them")
    if row["status"] == "left":
        raise HTTPException(409, f"device {device_id!r} has left the fleet")
    if bool(row["draining"]) != body.draining:
        event = DeviceDraining(device_id=device_id, draining=body.draining, by=who.name)
        await bus.publish(envelope(event, actor=who.name, source="gateway", prefix=bus.prefix))

        def shown() -> bool:
            now = _device_row(engine, device_id)
            return now is not None and bool(now["draining"]) == body.draining

        await _until(shown, PROJECTED_WAIT_S)
    log.info("device_draining", device_id=device_id, draining=body.draining, by=who.name)
    return await views.one(device_id)


@router.post("/v1/devices/{device_id}/revoke", responses={**WRITE_ERRORS, **E404, **E409})
async def revoke(bus: BusDep, engine: EngineDep, device_id: DeviceId, who: Admin) -> Revoked:
    """Revoke every credential of the device (its next call gets 401) and mark it left;
    the coordinator places its tasks elsewhere. The coordinator's own device cannot be
    revoked (drain it instead)."""
    row = await asyncio.to_thread(_device_row, engine, device_id)
    if row is None:
        raise HTTPException(404, f"no device {device_id!r}; GET /v1/devices lists them")
    if row["local"]:
        raise HTTPException(409, f"{device_id!r} is the coordinator's own device: drain it instead")
    token_ids = await asyncio.to_thread(_agent_tokens, engine, device_id)
    for token_id in token_ids:
        revoked = TokenRevoked(token_id=token_id, reason=f"device {device_id} revoked")
        await bus.publish(envelope(revoked, actor=who.name, source="gateway", prefix=bus.prefix))
    if row["status"] != "left":
        left = DeviceLeft(device_id=device_id, reason=f"revoked by {who.name}")
        await bus.publish(envelope(left, actor=who.name, source="gateway", prefix=bus.prefix))

    def shown() -> bool:
        now = _device_row(engine, device_id)
        gone = now is not None and now["status"] == "left"
        return gone and not _agent_tokens(engine, device_id)

    done = await _until(shown, PROJECTED_WAIT_S)
    log.info("device_revoked", device_id=device_id, tokens=token_ids, by=who.name, done=done)
    return Revoked(device_id=device_id, status="left", revoked_tokens=token_ids)
