"""A tiny real measurement set (real runner, tiny sizes, every config of this machine's space,
one held-out size per workload), measured once per session, and a model trained on it; shared
by the model and evaluation tests (registered in tests/conftest.py)."""

from __future__ import annotations

import pytest

from hpc_ds1.hardware import Fingerprint, fingerprint
from hpc_ds1.model import Measurement, Model, TrainedModel, train
from hpc_ds1.runner import Job, run_many
from hpc_ds1.space import ConfigSpace

TINY = {"gemm": (48, 64, 96), "stencil": (12, 16, 20)}
HELD_OUT = {"gemm": (80,), "stencil": (14,)}


@pytest.fixture(scope="session")
def fp() -> Fingerprint:
    return fingerprint()


@pytest.fixture(scope="session")
def measurements() -> list[Measurement]:
    jobs: list[tuple[Job, bool]] = []
    for name, sizes in TINY.items():
        configs = ConfigSpace.for_device(workload=name).configs()
        for size in sizes:
            jobs += [(Job(workload=name, size=size, config=c, repeats=3), False) for c in configs]
        for size in HELD_OUT.get(name, ()):
            jobs += [(Job(workload=name, size=size, config=c, repeats=3), True) for c in configs]
    results = run_many([job for job, _ in jobs], timeout_s=180)
    return [
        Measurement.from_result(r, held_out=held)
        for r, (_, held) in zip(results, jobs, strict=True)
    ]


@pytest.fixture(scope="session")
def trained(measurements: list[Measurement], fp: Fingerprint) -> TrainedModel:
    return train(measurements, fp, seed=0)


@pytest.fixture(scope="session")
def model(trained: TrainedModel) -> Model:
    return Model.from_onnx(trained.to_onnx())
