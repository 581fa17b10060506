"""Model artifacts on disk: $HPC_DS1_HOME/models/<version>.onnx and latest.onnx for this machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

MODELS_BUCKET = "MODELS"


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
