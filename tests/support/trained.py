"""A model trained on synthetic gemm runtimes, once per device and test process: for the tests
that need a model file to exist, not a measured machine (no real runs)."""

from __future__ import annotations

import math
from pathlib import Path

from hpc_ds1.machine.hardware import Fingerprint
from hpc_ds1.model import Measurement, train
from hpc_ds1.models_store import save_local
from hpc_ds1.space import ConfigSpace

SIZES = (48, 64, 96)


def synthetic(fp: Fingerprint) -> list[Measurement]:
    """Runtimes with a clear best configuration (no real runs: the model only has to exist)."""
    out = []
    for config in ConfigSpace.for_device(fp, "gemm").configs():
        for size in SIZES:
            work = size**3 / 1e9
            speed = min(config.ranks * config.threads, fp.cpus) * (1 + math.log2(config.tile) / 10)
            runtime = work / speed + 1e-3 * config.ranks
            out.append(
                Measurement(
                    workload="gemm",
                    size=size,
                    config=config.model_dump(),
                    status="ok",
                    runtime_s=runtime,
                    throughput=2 * size**3 / runtime / 1e9,
                )
            )
    return out


TRAINED: dict[str, tuple[str, bytes]] = {}


def trained_on(fp: Fingerprint) -> tuple[str, bytes]:
    """One training per device for the whole module (training is the slow part)."""
    if fp.device_id not in TRAINED:
        trained = train(synthetic(fp), fp, seed=0, candidates=["logistic"])  # the quickest
        TRAINED[fp.device_id] = (trained.version, trained.to_onnx())
    return TRAINED[fp.device_id]


def home_with_model(home: Path, fp: Fingerprint) -> str:
    version, data = trained_on(fp)
    save_local(home / "models", version, fp.device_id, data)
    return version
