"""The familiarity guard: measured size ranges, distance from the training data, hardware."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

DISTANCE_PERCENTILE = 99.0
DISTANCE_MARGIN = 1.5


@dataclass(frozen=True)
class DistanceGuard:
    """Nearest-neighbour distance in standardized feature space, threshold from the training
    data's own leave-one-out nearest-neighbour distances (a high percentile, with a margin)."""

    mean: npt.NDArray[np.float32]
    inv_scale: npt.NDArray[np.float32]
    matrix: npt.NDArray[np.float32]  # standardized unique training rows
    threshold: float
    loo_distances: npt.NDArray[np.float64]

    @classmethod
    def fit(cls, X: npt.NDArray[Any]) -> DistanceGuard:
        X = np.unique(np.asarray(X, dtype=np.float64), axis=0)
        mean = X.mean(axis=0)
        scale = X.std(axis=0)
        scale = np.where(scale > 1e-9, scale, 1.0)
        Z = (X - mean) / scale
        if len(Z) >= 2:
            d2 = ((Z[:, None, :] - Z[None, :, :]) ** 2).sum(axis=2)
            np.fill_diagonal(d2, np.inf)
            loo = np.sqrt(d2.min(axis=1))
            threshold = float(np.percentile(loo, DISTANCE_PERCENTILE) * DISTANCE_MARGIN)
        else:
            loo, threshold = np.zeros(len(Z)), 1.0
        return cls(
            mean=mean.astype(np.float32),
            inv_scale=(1.0 / scale).astype(np.float32),
            matrix=Z.astype(np.float32),
            threshold=max(threshold, 1e-6),
            loo_distances=loo,
        )

    def distance(self, X: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
        """The same computation as the ONNX graph, in numpy."""
        Z = (np.asarray(X, dtype=np.float32) - self.mean) * self.inv_scale
        d2 = ((Z[:, None, :] - self.matrix[None, :, :]) ** 2).sum(axis=2)
        return np.sqrt(d2.min(axis=1)).astype(np.float64)


def size_reason(workload: str, size: int, ranges: dict[str, tuple[int, int]]) -> str | None:
    if workload not in ranges:
        return f"workload {workload!r} was never measured on this machine"
    lo, hi = ranges[workload]
    if not lo <= size <= hi:
        return f"size {size} is outside the measured range {lo}–{hi} for {workload}"  # noqa: RUF001
    return None


def distance_reason(distance: float, threshold: float) -> str | None:
    if distance > threshold:
        return (
            f"this job is far from what the model was trained on (distance {distance:.2f} "
            f"> threshold {threshold:.2f} in standardized feature space)"
        )
    return None


def _gib(value: Any) -> int:
    return round(int(value) / 2**30)


def fingerprint_differences(trained: dict[str, Any], other: Any) -> list[str]:
    """What differs between the training device and `other` (a Fingerprint or dict), in words."""
    now = other if isinstance(other, dict) else other.model_dump(mode="json")
    out: list[str] = []
    labels = (
        ("cpu_model", "cpu model"),
        ("architecture", "architecture"),
        ("sockets", "sockets"),
        ("physical_cores", "cores"),
        ("logical_cpus", "logical cpus"),
    )
    for key, label in labels:
        if trained.get(key) != now.get(key):
            out.append(f"{label} {now.get(key)!r} (trained on {trained.get(key)!r})")
    if _gib(trained.get("memory_bytes", 0)) != _gib(now.get("memory_bytes", 0)):
        out.append(
            f"memory {_gib(now.get('memory_bytes', 0))} GiB "
            f"(trained on {_gib(trained.get('memory_bytes', 0))} GiB)"
        )
    if tuple(trained.get("simd", ())) != tuple(now.get("simd", ())):
        out.append(f"SIMD {list(now.get('simd', ()))} (trained on {list(trained.get('simd', ()))})")
    if tuple(trained.get("caches", {}).items()) != tuple(now.get("caches", {}).items()):
        out.append(f"caches {now.get('caches')} (trained on {trained.get('caches')})")

    def gpu_names(fp: dict[str, Any]) -> list[str]:
        return [g.get("name", "?") if isinstance(g, dict) else str(g) for g in fp.get("gpus", ())]

    if gpu_names(trained) != gpu_names(now):
        out.append(f"GPUs {gpu_names(now)} (trained on {gpu_names(trained)})")
    return out


def hardware_reason(trained: dict[str, Any], other: Any) -> str | None:
    now_id = other.get("device_id") if isinstance(other, dict) else other.device_id
    if now_id == trained.get("device_id"):
        return None
    diffs = fingerprint_differences(trained, other) or [
        f"device id {now_id} (trained on {trained.get('device_id')})"
    ]
    return "this machine differs from the one the model was trained on: " + "; ".join(diffs)
