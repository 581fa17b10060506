"""One training: measurements from the projection → model → artifact → model event."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import orjson
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.events import ModelPublished, envelope
from hpc_ds1.log import get_logger
from hpc_ds1.models_store import models_bucket, save_local
from hpc_ds1.runtime import ServiceContext

log = get_logger("trainer")


def load_measurements(engine: Engine, device_id: str) -> list[dict[str, Any]]:
    t = tables.measurements
    with engine.connect() as conn:
        rows = conn.execute(select(t).where(t.c.device_id == device_id).order_by(t.c.seq))
        return [dict(r._mapping) for r in rows]


def load_fingerprint(engine: Engine, device_id: str) -> dict[str, Any] | None:
    t = tables.devices
    with engine.connect() as conn:
        row = conn.execute(select(t.c.fingerprint).where(t.c.device_id == device_id)).first()
    return None if row is None else dict(row[0])


class Trainer:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self._lock = asyncio.Lock()

    async def handle(self, msg: Any) -> None:
        try:
            device_id = str(orjson.loads(msg.data)["device_id"])
            async with self._lock:
                reply = await self.train(device_id)
        except Exception as error:
            log.error("training_failed", error=repr(error))
            reply = {"ok": False, "error": str(error)}
        await msg.respond(orjson.dumps(reply))

    async def train(self, device_id: str) -> dict[str, Any]:
        from hpc_ds1.hardware import Fingerprint
        from hpc_ds1.model import Measurement, train

        rows = await asyncio.to_thread(load_measurements, self.ctx.engine, device_id)
        raw_fingerprint = await asyncio.to_thread(load_fingerprint, self.ctx.engine, device_id)
        if raw_fingerprint is None:
            return {"ok": False, "error": f"device {device_id} has not registered"}
        usable = [Measurement.model_validate(r) for r in _measurement_fields(rows)]
        if not [m for m in usable if m.status == "ok" and not m.held_out]:
            return {
                "ok": False,
                "error": f"no measurements of device {device_id}: run hpc-ds1 setup",
            }
        fingerprint = Fingerprint.model_validate(raw_fingerprint)
        settings = self.ctx.settings
        trained = await asyncio.to_thread(
            train,
            usable,
            fingerprint,
            calibrate_on=settings.calibration_target,
            runtime_selection=settings.runtime_selection,
        )
        data = trained.to_onnx()
        digest = hashlib.sha256(data).hexdigest()
        version = trained.version
        key = f"{device_id}/{version}.onnx"
        store = await self._bucket()
        await store.put(key, data)
        path = await asyncio.to_thread(
            save_local, self.ctx.settings.models_dir, version, device_id, data
        )
        metrics = orjson.loads(orjson.dumps(trained.metrics, default=str))
        event = ModelPublished(
            model_version=version,
            device_id=device_id,
            artifact=key,
            sha256=digest,
            metrics=metrics,
            trained_on=len([m for m in usable if not m.held_out]),
        )
        await self.ctx.bus.publish(
            envelope(
                event, actor="trainer", source="trainer", prefix=self.ctx.settings.subject_prefix
            )
        )
        log.info("model_published", device_id=device_id, version=version, path=str(path))
        return {"ok": True, "version": version, "path": str(path), "metrics": metrics}

    async def _bucket(self) -> Any:
        return await models_bucket(self.ctx.bus.js, self.ctx.settings)


def _measurement_fields(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keep = ("workload", "size", "config", "status", "runtime_s", "spread", "throughput", "held_out")
    return [{k: r[k] for k in keep} for r in rows]
