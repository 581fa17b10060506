"""GET /v1/evaluation (the latest evaluation of a model on held-out sizes, from the projection),
GET /v1/evaluation/plots/{name} (its PNG plots) and GET /v1/evaluation/yardstick (the latest
yardstick on recorded GPU spaces, benchmarks/yardstick.py --home). Reading needs
`require("viewer")`."""

from __future__ import annotations

import asyncio
import re
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, HTTPException, Path, Query
from fastapi.responses import FileResponse
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.requests import SAFE_ID_PATTERN
from hpc_ds1.security.tokens import Principal
from hpc_ds1.settings import Settings

from ..deps import EngineDep, SettingsDep
from ..edge.auth import require
from ..schemas import E404, READ_ERRORS

NO_EVALUATION = "no evaluation yet: run `hpc-ds1 evaluate` (or `hpc-ds1 evaluate --quick`)"
NO_YARDSTICK = (
    "no yardstick on this home: run `python benchmarks/yardstick.py SPACE ... --home HOME` "
    "(docs/yardstick.md)"
)
YARDSTICK_FILE = "yardstick.json"  # under the home's evaluation/ folder
YARDSTICK_MAX_BYTES = 8 * 2**20
PLOT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.png")

# Module level: with postponed annotations FastAPI resolves these names in module globals.
Reader = Annotated[Principal, Depends(require("viewer"))]


def query_latest(
    engine: Engine, device_id: str | None, model_version: str | None
) -> dict[str, Any] | None:
    """The matching evaluation with the highest sequence, or None."""
    t = tables.evaluations
    query = select(t).order_by(t.c.seq.desc()).limit(1)
    if device_id is not None:
        query = query.where(t.c.device_id == device_id)
    if model_version is not None:
        query = query.where(t.c.model_version == model_version)
    with engine.connect() as conn:
        row = conn.execute(query).mappings().first()
    if row is None:
        return None
    return {
        "evaluation_id": row["evaluation_id"],
        "device_id": row["device_id"],
        "model_version": row["model_version"],
        "profile": row["profile"],
        "seed": row["seed"],
        "landscape_runs": row["landscape_runs"],
        "results": row["results"],
        "plots": row["plots"],
        "published_at": row["published_at"].isoformat(),
    }


router = APIRouter(tags=["evaluation"])


@router.get("/v1/evaluation", responses={**READ_ERRORS, **E404})
async def evaluation(
    engine: EngineDep,
    _: Reader,
    device_id: str | None = Query(
        None, pattern=SAFE_ID_PATTERN, description="Only this device's evaluations."
    ),
    model_version: str | None = Query(
        None, pattern=r"^[A-Za-z0-9_.\-]{1,128}$", description="Only this model's evaluations."
    ),
) -> dict[str, Any]:
    """The latest evaluation (hpc-ds1 evaluate): how well the model ranks configurations
    and picks moves on held-out sizes, with its plots (see /v1/evaluation/plots/{name})."""
    found = await asyncio.to_thread(query_latest, engine, device_id, model_version)
    if found is None:
        raise HTTPException(404, NO_EVALUATION)
    return found


@router.get(
    "/v1/evaluation/plots/{name}",
    response_class=FileResponse,
    responses={
        200: {"content": {"image/png": {}}, "description": "The PNG."},
        **READ_ERRORS,
        **E404,
    },
)
async def plot(
    settings: SettingsDep,
    _: Reader,
    name: Annotated[str, Path(pattern=f"^{PLOT_NAME.pattern}$", max_length=128)],
) -> FileResponse:
    """One PNG plot of an evaluation, by the file name listed in its `plots`."""
    path = settings.home / "evaluation" / name
    if not PLOT_NAME.fullmatch(name) or not path.is_file():
        raise HTTPException(404, f"no evaluation plot named {name!r}")
    return FileResponse(path, media_type="image/png")


@router.get("/v1/evaluation/yardstick", responses={**READ_ERRORS, **E404})
async def yardstick(settings: SettingsDep, _: Reader) -> dict[str, Any]:
    """The latest yardstick (benchmarks/yardstick.py): HPC-DS1 against Kernel Tuner's
    strategies, Optuna TPE and random search on recorded GPU spaces, every run counted;
    per space, policy and budget the fraction of the optimum and the methodology score."""
    found = await asyncio.to_thread(read_yardstick, settings)
    if found is None:
        raise HTTPException(404, NO_YARDSTICK)
    return found


def read_yardstick(settings: Settings) -> dict[str, Any] | None:
    """The home's yardstick file, when it is there and a JSON object of a sane size."""
    path = settings.home / "evaluation" / YARDSTICK_FILE
    try:
        if path.stat().st_size > YARDSTICK_MAX_BYTES:
            return None
        found = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return found if isinstance(found, dict) else None
