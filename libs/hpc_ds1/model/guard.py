"""The familiarity guard: measured size ranges, distance from the training data, hardware."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

DISTANCE_PERCENTILE = 99.0
DISTANCE_MARGIN = 1.5
# The guard keeps at most this many training rows (a seeded sample of the unique ones): its
# distances are computed against every one of them for every configuration System 1 scores,
# and a recorded GPU space of 11,130 configurations had asked 25.8 GiB of its full pairwise
# differences at training.
GUARD_MAX_ROWS = 4096
BLOCK_ROWS = 512  # rows per block of a distance computation: at most BLOCK_ROWS x n at once


@dataclass(frozen=True)
class DistanceGuard:
    """Nearest-neighbour distance in standardized feature space, threshold from the training
    data's own leave-one-out nearest-neighbour distances (a high percentile, with a margin).
    Distances are |z|^2 + |m|^2 - 2 z.m (one matrix product, as in the ONNX graph), clipped at
    0, in blocks of rows."""

    mean: npt.NDArray[np.float32]
    inv_scale: npt.NDArray[np.float32]
    matrix: npt.NDArray[np.float32]  # standardized unique training rows (at most GUARD_MAX_ROWS)
    threshold: float
    loo_distances: npt.NDArray[np.float64]

    @classmethod
    def fit(cls, X: npt.NDArray[Any]) -> DistanceGuard:
        X = np.unique(np.asarray(X, dtype=np.float64), axis=0)
        mean = X.mean(axis=0)
        scale = X.std(axis=0)
        scale = np.where(scale > 1e-9, scale, 1.0)
        Z = ((X - mean) / scale).astype(np.float32)
        kept = np.arange(len(Z))
        if len(Z) > GUARD_MAX_ROWS:
            kept = np.sort(np.random.default_rng(0).choice(len(Z), GUARD_MAX_ROWS, replace=False))
        matrix = Z[kept]
        if len(Z) >= 2:
            self_column = np.full(len(Z), -1)
            self_column[kept] = np.arange(len(kept))
            loo = _nearest(Z, matrix, self_column)
            threshold = float(np.percentile(loo, DISTANCE_PERCENTILE) * DISTANCE_MARGIN)
        else:
            loo, threshold = np.zeros(len(Z)), 1.0
        return cls(
            mean=mean.astype(np.float32),
            inv_scale=(1.0 / scale).astype(np.float32),
            matrix=matrix,
            threshold=max(threshold, 1e-6),
            loo_distances=loo,
        )

    def distance(self, X: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
        """The same computation as the ONNX graph, in numpy."""
        Z = (np.asarray(X, dtype=np.float32) - self.mean) * self.inv_scale
        return _nearest(Z, self.matrix)


def _nearest(
    Z: npt.NDArray[np.float32],
    matrix: npt.NDArray[np.float32],
    self_column: npt.NDArray[np.int64] | None = None,
) -> npt.NDArray[np.float64]:
    """Each row of Z's distance to its nearest row of `matrix` (leaving out, where
    `self_column` gives one, the row's own column)."""
    norms = (matrix.astype(np.float32) ** 2).sum(axis=1)[None, :]
    out = np.empty(len(Z), dtype=np.float64)
    for start in range(0, len(Z), BLOCK_ROWS):
        block = Z[start : start + BLOCK_ROWS].astype(np.float32)
        d2 = (block**2).sum(axis=1, keepdims=True) + norms - np.float32(2.0) * (block @ matrix.T)
        if self_column is not None:
            rows = np.arange(len(block))
            columns = self_column[start : start + BLOCK_ROWS]
            own = columns >= 0
            d2[rows[own], columns[own]] = np.inf
        out[start : start + len(block)] = np.sqrt(np.maximum(d2, 0.0).min(axis=1))
    return out


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
