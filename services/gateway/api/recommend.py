"""POST /v1/recommend: System 1 for a job (viewer role): the whole configuration before
anything runs, its expected runtime, confidence, mode and the familiarity guard's reasons, from
the device's latest model, with the device's own hardware for the guard. Nothing runs and
nothing is recorded: it is a read of the model (the decisions that move a job are recorded)."""

from __future__ import annotations

import asyncio
import threading
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.db.reads import latest_model
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.models_store import models_bucket
from hpc_ds1.requests import MAX_SIZE, SafeId, Size, WorkloadName
from hpc_ds1.security.tokens import Principal
from hpc_ds1.settings import Settings

from ..deps import EngineDep, SettingsDep
from ..edge.auth import require
from ..schemas import E404, E409, E503, WRITE_ERRORS

NO_DEVICE = "no device has joined yet: run `hpc-ds1 setup --quick` (or start an agent)"
MODELS_KEPT = 8  # loaded models kept, by version (one per device in a small fleet)


class RecommendBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadName = Field(description="A workload name, e.g. gemm.")
    size: Size = Field(description=f"Problem size, 1 to {MAX_SIZE}.")
    device_id: SafeId | None = Field(default=None, description="Default: this machine's device.")


class ConfigOut(BaseModel):
    ranks: int
    threads: int
    tile: int
    block: int = 0
    gpu: bool


class RecommendationOut(BaseModel):
    workload: str
    size: int
    config: ConfigOut
    label: str
    predicted_runtime_s: float = Field(description="Expected runtime of `config`, seconds.")
    confidence: float = Field(description="Estimated probability that `config` is the fastest.")
    mode: str = Field(description="auto, confirm or escalate (from the thresholds and guard).")
    reasons: list[str] = Field(description="Why it is not auto (empty when auto).")
    guard_reasons: list[str] = Field(description="The familiarity guard's reasons alone.")
    familiar: bool
    thresholds: dict[str, float]
    alternatives: dict[str, float] = Field(description="The fastest few, label -> seconds.")
    model_version: str
    trained_on_device: str
    device_id: str | None


def _device(engine: Engine, device_id: str | None) -> tuple[str, dict[str, Any]] | None:
    t = tables.devices
    query = select(t.c.device_id, t.c.fingerprint)
    if device_id is None:
        query = query.where(t.c.local.is_(True)).order_by(t.c.seq.desc())
    else:
        query = query.where(t.c.device_id == device_id)
    with engine.connect() as conn:
        row = conn.execute(query.limit(1)).first()
    return None if row is None else (row[0], dict(row[1]))


class Models:
    """Loaded models by version: a version is its content, so a cached one never goes stale."""

    def __init__(self, settings: Settings, bus: EventBus) -> None:
        self.settings, self.bus = settings, bus
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    async def get(self, version: str, artifact: str) -> Any:
        from hpc_ds1.model import Model

        with self._lock:
            found = self._loaded.get(version)
        if found is not None:
            return found
        local = self.settings.models_dir / f"{version}.onnx"
        if local.exists():
            data = await asyncio.to_thread(local.read_bytes)
        else:
            store = await models_bucket(self.bus.js, self.settings, create=False)
            if store is None:
                raise HTTPException(409, f"model {version} is not in the model store")
            data = (await store.get(artifact)).data or b""
        model = await asyncio.to_thread(Model.from_untrusted, data, self.settings.max_model_bytes)
        with self._lock:
            if len(self._loaded) >= MODELS_KEPT:
                self._loaded.clear()
            self._loaded[version] = model
        return model


def loaded_models(request: Request) -> Models:
    """The app's cache of loaded models, made on the first recommendation."""
    state = request.app.state
    if getattr(state, "recommend_models", None) is None:
        state.recommend_models = Models(state.settings, state.bus)
    models: Models = state.recommend_models
    return models


ModelsDep = Annotated[Models, Depends(loaded_models)]


router = APIRouter(tags=["decisions"])


@router.post("/v1/recommend", responses={**WRITE_ERRORS, **E404, **E409, **E503})
async def recommend(
    settings: SettingsDep,
    engine: EngineDep,
    models: ModelsDep,
    body: RecommendBody,
    _: Annotated[Principal, Depends(require("viewer"))],
) -> RecommendationOut:
    """The configuration to submit a job with (System 1): every feasible configuration of
    the device scored by its model in one forward pass, the fastest returned with its
    expected runtime, the confidence that it is the fastest, the mode (auto at or above the
    auto threshold with a quiet guard, escalate below the escalate threshold or when the
    guard speaks, confirm between) and the reasons. 422 for a workload neither the registry
    nor the model knows, or a size out of range; 409 before the device has a model."""
    from hpc_ds1.machine.hardware import Fingerprint
    from hpc_ds1.model import Thresholds
    from hpc_ds1.recommendation import RecommendError
    from hpc_ds1.recommendation import recommend as system1

    device = await asyncio.to_thread(_device, engine, body.device_id)
    if device is None:
        raise HTTPException(
            404, NO_DEVICE if body.device_id is None else f"unknown device {body.device_id}"
        )
    device_id, raw = device
    latest = await asyncio.to_thread(latest_model, engine, device_id)
    if latest is None:
        raise HTTPException(
            409, f"no model for device {device_id} yet: run `hpc-ds1 setup --quick` on it"
        )
    model = await models.get(*latest)
    thresholds = Thresholds(auto=settings.auto_threshold, escalate=settings.escalate_threshold)
    try:
        fingerprint = Fingerprint.model_validate(raw)
    except ValueError:
        raise HTTPException(
            409, f"device {device_id} has a fingerprint this version cannot read"
        ) from None
    try:
        found = await asyncio.to_thread(
            system1,
            model,
            body.workload,
            body.size,
            fingerprint=fingerprint,
            thresholds=thresholds,
        )
    except RecommendError as error:
        raise HTTPException(422, str(error)) from None
    return RecommendationOut.model_validate(found)
