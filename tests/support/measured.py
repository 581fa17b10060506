"""A tiny real measurement set (real runner, tiny sizes, every config of this machine's space,
one held-out size per workload), measured once per session, and a model trained on it; shared
by the model and evaluation tests (registered in tests/conftest.py).

Under pytest-xdist the workers share one measurement set: the first worker to need it measures
it under a file lock and writes it beside the workers' temp folders, the others wait and read
it. Measuring it twice at once cost each worker about 140 s on two CPUs, and the two sets
differed by their noise."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from hpc_ds1.machine.hardware import Fingerprint, fingerprint
from hpc_ds1.model import Measurement, Model, TrainedModel, train
from hpc_ds1.runner import Job, run_many
from hpc_ds1.space import ConfigSpace

TINY = {"gemm": (48, 64, 96), "stencil": (12, 16, 20)}
HELD_OUT = {"gemm": (80,), "stencil": (14,)}


@pytest.fixture(scope="session")
def fp() -> Fingerprint:
    return fingerprint()


_MEASUREMENTS = TypeAdapter(list[Measurement])


def shared_across_workers(
    root: Path, name: str, produce: Callable[[], list[Measurement]]
) -> list[Measurement]:
    """produce() once for all workers of this run; root is the run's shared temp folder."""
    path = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if path.is_file():
            return _MEASUREMENTS.validate_json(path.read_bytes())
        produced = produce()
        partial = path.with_suffix(".partial")
        partial.write_bytes(_MEASUREMENTS.dump_json(produced))
        partial.replace(path)
        return produced


@pytest.fixture(scope="session")
def measurements(tmp_path_factory: pytest.TempPathFactory) -> list[Measurement]:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return measure_tiny_set()
    # each worker's basetemp is <run root>/popen-gwN; the run root is theirs alone
    root = tmp_path_factory.getbasetemp().parent
    return shared_across_workers(root, "measurements", measure_tiny_set)


def measure_tiny_set() -> list[Measurement]:
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
