"""One training: measurements from the projection → model → artifact → model event."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.db.reads import load_measurements
from hpc_ds1.events import ModelPublished, envelope
from hpc_ds1.log import get_logger
from hpc_ds1.models_store import models_bucket, save_local
from hpc_ds1.process.runtime import ServiceContext

log = get_logger("trainer")

T = TypeVar("T")


async def in_daemon_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on a daemon thread of its own. Training takes minutes and cannot be
    interrupted; on asyncio's default executor a training still running at stop held the
    process past its grace period (asyncio.run joins that executor's threads), and the container
    was killed (137). A daemon thread ends with the process: nothing is written until the
    training returns, so an interrupted one leaves nothing behind and is requested again."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:  # handed to the awaiting coroutine
            _settle_soon(loop, settle, None, error)
        else:
            _settle_soon(loop, settle, result, None)

    threading.Thread(target=work, name=f"trainer-{fn.__name__}", daemon=True).start()
    return await done


def _settle_soon(loop: asyncio.AbstractEventLoop, settle: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(settle, *args)
    except RuntimeError:  # the loop has closed: the process is stopping, nobody awaits
        pass


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
        from hpc_ds1.machine.hardware import Fingerprint
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
        trained = await in_daemon_thread(
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
