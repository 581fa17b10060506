"""Model artifacts: the JetStream bucket every machine reads, and on disk
$HPC_DS1_HOME/models/<version>.onnx and latest.onnx for this machine."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.errors import NotFoundError

from .eventlog.bus import until_answered

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.object_store import ObjectStore

    from .settings import Settings

MODELS_BUCKET = "MODELS"


def bucket_name(settings: Settings) -> str:
    """The JetStream object store holding every device's model artifacts for this stream."""
    return f"{MODELS_BUCKET}_{settings.stream}"


async def models_bucket(
    js: JetStreamContext, settings: Settings, create: bool = True
) -> ObjectStore | None:
    """The model bucket, created (file storage, `stream_replicas` copies) when missing and
    `create`; None when missing and not `create`."""
    # Each call is asked again while a cluster elects a leader (bus.until_answered).
    name = bucket_name(settings)
    try:
        return await until_answered(functools.partial(js.object_store, name), name)
    except NotFoundError:  # BucketNotFoundError is one
        if not create:
            return None
    config = ObjectStoreConfig(storage=StorageType.FILE, replicas=settings.stream_replicas)
    return await until_answered(
        functools.partial(js.create_object_store, name, config=config), name
    )


def save_local(models_dir: Path, version: str, device_id: str, data: bytes) -> Path:
    models_dir.mkdir(parents=True, exist_ok=True)
    path = models_dir / f"{version}.onnx"
    _atomic_write(path, data)
    _atomic_write(models_dir / "latest.onnx", data)
    _atomic_write(
        models_dir / "latest.json",
        json.dumps({"version": version, "device_id": device_id, "path": path.name}).encode(),
    )
    return path


def latest_path(models_dir: Path) -> Path | None:
    path = models_dir / "latest.onnx"
    return path if path.exists() else None


def _atomic_write(path: Path, data: bytes) -> None:
    # A reader never sees half a model: write aside, then rename over.
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
