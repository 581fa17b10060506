"""GET /v1/model (a device's model: version, what and when it was trained on, its metrics, the
decision thresholds) and GET /v1/measurements/summary (per kernel: the sizes measured, the
correct runs, the familiarity guard's allowed size range; a setup under way). Both read the
projection, default to this machine (the local device) and need `require("viewer")`.

The guard's size range is the one training gives the model: the smallest to the largest size
of the workload among the device's measurements that are not held out (a registered workload's
held-out sizes never count) and were recorded before the model was published, for workloads
with at least one correct run among them."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel
from sqlalchemy import Engine, func, literal, select

from hpc_ds1.db import tables
from hpc_ds1.model.summary import dig, summarize
from hpc_ds1.requests import SAFE_ID_PATTERN
from hpc_ds1.security.tokens import Principal
from hpc_ds1.settings import Settings

from ..deps import EngineDep, SettingsDep
from ..edge.auth import require
from ..schemas import E404, READ_ERRORS

MODEL_NAME = "hpc-ds1-latest"
NO_DEVICE = "no device has joined yet: run `hpc-ds1 setup --quick` (or start an agent)"
NO_MODEL = "no model for this device yet: run `hpc-ds1 setup --quick` (~30 min: measure + train)"
# A setup is reported as running while its last measurement is this recent.
SETUP_ACTIVE_S = 15 * 60

Reader = Annotated[Principal, Depends(require("viewer"))]
DeviceQuery = Annotated[
    str | None,
    Query(pattern=SAFE_ID_PATTERN, description="A device id; default: this machine's device."),
]


class Thresholds(BaseModel):
    auto: float
    escalate: float


class Metric(BaseModel):
    key: str
    label: str
    value: float | int | str


class ModelOut(BaseModel):
    version: str
    published_at: str
    trained_on: int
    workloads: dict[str, int]
    summary: list[Metric]
    metrics: dict[str, Any]


class MachineModel(BaseModel):
    name: str
    device_id: str
    hostname: str
    thresholds: Thresholds
    model: ModelOut | None
    models_published: int
    missing: str | None = None


class KernelRow(BaseModel):
    kernel: str
    sizes: list[int]
    held_out_sizes: list[int]
    runs: int
    correct_runs: int
    guard_range: list[int] | None


class SetupProgress(BaseModel):
    running: bool
    measured: int
    correct: int
    planned: dict[str, int]
    by_kernel: dict[str, int]
    since_model: str | None
    last_at: str


class MeasurementSummary(BaseModel):
    device_id: str
    model_version: str | None
    kernels: list[KernelRow]
    setup: SetupProgress | None


def _device(engine: Engine, device_id: str | None) -> dict[str, Any] | None:
    t = tables.devices
    query = select(t.c.device_id, t.c.hostname, t.c.fingerprint)
    if device_id is None:
        query = query.where(t.c.local.is_(True)).order_by(t.c.seq.desc())
    else:
        query = query.where(t.c.device_id == device_id)
    with engine.connect() as conn:
        row = conn.execute(query.limit(1)).mappings().first()
    return None if row is None else dict(row)


def _latest_model(engine: Engine, device_id: str) -> tuple[dict[str, Any] | None, int]:
    t = tables.models
    with engine.connect() as conn:
        row = (
            conn.execute(
                select(t).where(t.c.device_id == device_id).order_by(t.c.seq.desc()).limit(1)
            )
            .mappings()
            .first()
        )
        count = conn.execute(
            select(func.count()).select_from(t).where(t.c.device_id == device_id)
        ).scalar_one()
    return (None if row is None else dict(row)), int(count)


def query_model(engine: Engine, settings: Settings, device_id: str | None) -> MachineModel | None:
    device = _device(engine, device_id)
    if device is None:
        return None
    row, count = _latest_model(engine, device["device_id"])
    model = None
    if row is not None:
        metrics = dict(row["metrics"] or {})
        workloads = dig(metrics, ("counts", "workloads"))
        model = ModelOut(
            version=row["model_version"],
            published_at=row["published_at"].isoformat(),
            trained_on=row["trained_on"],
            workloads={str(k): int(v) for k, v in (workloads or {}).items()},
            summary=[Metric(**m) for m in summarize(metrics)],
            metrics=metrics,
        )
    return MachineModel(
        name=MODEL_NAME,
        device_id=device["device_id"],
        hostname=device["hostname"],
        thresholds=Thresholds(auto=settings.auto_threshold, escalate=settings.escalate_threshold),
        model=model,
        models_published=count,
        missing=None if model else NO_MODEL,
    )


def _held_out_sizes(workload: str) -> frozenset[int]:
    from hpc_ds1.workloads import UnknownWorkload, get_workload

    try:
        return frozenset(get_workload(workload).held_out)
    except UnknownWorkload:
        return frozenset()


def _planned(fingerprint: dict[str, Any]) -> dict[str, int]:
    """Runs `hpc-ds1 setup --quick` and `hpc-ds1 setup` plan on this device (every workload)."""
    from hpc_ds1.machine.hardware import Fingerprint
    from hpc_ds1.setup.plan import PROFILES, plan_jobs
    from hpc_ds1.space import ConfigSpace
    from hpc_ds1.workloads import get_workload, list_workloads

    try:
        fp = Fingerprint.model_validate(fingerprint)
        workloads = [get_workload(n) for n in list_workloads()]
        spaces = {w.name: ConfigSpace.for_device(fp, w) for w in workloads}
        return {
            name: sum(len(c) for c in plan_jobs(workloads, spaces, PROFILES[name]))
            for name in ("quick", "full")
        }
    except Exception:  # a fingerprint this version cannot read: no plan to compare with
        return {}


def query_summary(engine: Engine, device_id: str | None) -> MeasurementSummary | None:
    device = _device(engine, device_id)
    if device is None:
        return None
    did = device["device_id"]
    model, _ = _latest_model(engine, did)
    model_seq = model["seq"] if model is not None else None
    t = tables.measurements
    before = (t.c.seq < model_seq) if model_seq is not None else literal(False)
    query = (
        select(
            t.c.workload,
            t.c.size,
            t.c.held_out,
            t.c.status,
            before.label("before_model"),
            func.count().label("n"),
        )
        .where(t.c.device_id == did)
        .group_by(t.c.workload, t.c.size, t.c.held_out, t.c.status, before)
    )
    setup_query = select(
        t.c.workload,
        t.c.status,
        func.count().label("n"),
        func.max(t.c.time).label("last"),
    ).where(t.c.device_id == did, t.c.purpose == "setup")
    if model_seq is not None:
        setup_query = setup_query.where(t.c.seq > model_seq)
    setup_query = setup_query.group_by(t.c.workload, t.c.status)
    with engine.connect() as conn:
        groups = conn.execute(query).mappings().all()
        setup_rows = conn.execute(setup_query).mappings().all()

    per: dict[str, dict[str, Any]] = {}
    for g in groups:
        k = per.setdefault(
            g["workload"],
            {"sizes": set(), "held": set(), "runs": 0, "ok": 0, "trained": set(), "ok_before": 0},
        )
        held = bool(g["held_out"]) or g["size"] in _held_out_sizes(g["workload"])
        (k["held"] if held else k["sizes"]).add(int(g["size"]))
        k["runs"] += int(g["n"])
        ok = g["status"] == "ok"
        k["ok"] += int(g["n"]) if ok else 0
        if g["before_model"] and not held:
            k["trained"].add(int(g["size"]))
            k["ok_before"] += int(g["n"]) if ok else 0
    kernels = [
        KernelRow(
            kernel=name,
            sizes=sorted(k["sizes"]),
            held_out_sizes=sorted(k["held"]),
            runs=k["runs"],
            correct_runs=k["ok"],
            guard_range=(
                [min(k["trained"]), max(k["trained"])] if k["trained"] and k["ok_before"] else None
            ),
        )
        for name, k in sorted(per.items())
    ]
    setup = None
    if setup_rows:
        last = max(r["last"] for r in setup_rows)
        by_kernel: dict[str, int] = {}
        for r in setup_rows:
            by_kernel[r["workload"]] = by_kernel.get(r["workload"], 0) + int(r["n"])
        age = (dt.datetime.now(dt.UTC) - last).total_seconds()
        setup = SetupProgress(
            running=age < SETUP_ACTIVE_S,
            measured=sum(by_kernel.values()),
            correct=sum(int(r["n"]) for r in setup_rows if r["status"] == "ok"),
            planned=_planned(device["fingerprint"]),
            by_kernel=dict(sorted(by_kernel.items())),
            since_model=model["model_version"] if model is not None else None,
            last_at=last.isoformat(),
        )
    return MeasurementSummary(
        device_id=did,
        model_version=model["model_version"] if model is not None else None,
        kernels=kernels,
        setup=setup,
    )


router = APIRouter(tags=["machine"])


@router.get("/v1/model", responses={**READ_ERRORS, **E404})
async def machine_model(
    settings: SettingsDep, engine: EngineDep, _: Reader, device_id: DeviceQuery = None
) -> MachineModel:
    """The model decisions use on this machine (or `device_id`): its name, version, when it
    was published, how many measurements it was trained on, its headline metrics (and all
    of them) and the thresholds: auto at or above `auto`, escalate below `escalate`.
    `model` is null, with `missing` saying how to get one, before the first training."""
    found = await asyncio.to_thread(query_model, engine, settings, device_id)
    if found is None:
        raise HTTPException(404, NO_DEVICE if device_id is None else _unknown(device_id))
    return found


@router.get("/v1/measurements/summary", responses={**READ_ERRORS, **E404})
async def measurements_summary(
    engine: EngineDep, _: Reader, device_id: DeviceQuery = None
) -> MeasurementSummary:
    """What was measured on this machine (or `device_id`), per kernel: the sizes (held-out
    sizes apart: they are for evaluation only), the runs and the correct ones, and the size
    range the familiarity guard of the latest model allows (null: not trained on). `setup`:
    the setup measurements recorded since the latest model (null when none), with the runs
    `setup --quick` and `setup` plan on this device; `running` while the last is under 15
    minutes old."""
    found = await asyncio.to_thread(query_summary, engine, device_id)
    if found is None:
        raise HTTPException(404, NO_DEVICE if device_id is None else _unknown(device_id))
    return found


def _unknown(device_id: str) -> str:
    return f"unknown device {device_id}"
