"""The block as the model sees it, on a hand-made stencil landscape (no noise, no runs): the
temporal block pays from 160^3 up and costs below, as the measured kernel does on this kind of
machine (docs/kernels.md). A model trained on it must carry the block through its column, its
moves and its System 1 pick."""

from __future__ import annotations

import math

import pytest

from hpc_ds1.machine.hardware import Fingerprint, fingerprint
from hpc_ds1.model import Measurement, Model, State, train
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import get_workload

STENCIL = get_workload("stencil")
BLOCK_INDEX = {0: 0, 2: 1, 4: 2}


def best_block(size: int) -> int:
    return 0 if size < 140 else 4


def runtime(size: int, c: Config, cpus: int) -> float:
    base = STENCIL.work(size).bytes_moved / 1e10
    workers = c.ranks * c.threads
    speed = min(workers, cpus) ** 0.9 / (1.1 if workers > cpus else 1.0)
    tile = 1.0 + 0.05 * abs(math.log2(c.tile / 16))
    block = 1.0 + 0.25 * abs(BLOCK_INDEX[c.block] - BLOCK_INDEX[best_block(size)])
    return base / speed * tile * block


@pytest.fixture(scope="module")
def fp() -> Fingerprint:
    return fingerprint()


@pytest.fixture(scope="module")
def model(fp: Fingerprint) -> Model:
    space = ConfigSpace.for_device(fp, STENCIL)
    assert space.blocks == (0, 2, 4)
    rows = [
        Measurement(
            workload="stencil",
            size=size,
            config=c.model_dump(),
            status="ok",
            runtime_s=runtime(size, c, fp.cpus),
            spread=0.01,
        )
        for size in STENCIL.sizes
        for c in space.configs()
    ]
    trained = train(
        rows,
        fp,
        seed=0,
        candidates=["logistic+sigmoid"],
        runtime_candidates=["ridge_poly2_relative"],
    )
    return Model.from_onnx(trained.to_onnx())


def test_the_file_knows_the_block(model: Model) -> None:
    assert "log2_block" in model.metadata["features"]
    assert model.metadata["workloads"]["stencil"]["blocks"] == [0, 2, 4]
    assert {"BLOCK_UP", "BLOCK_DOWN"} <= set(model.metadata["classes"])


@pytest.mark.parametrize("size", [104, 256, 336])
def test_system_1_picks_the_block_of_the_sizes_around(model: Model, size: int) -> None:
    rec = model.recommend("stencil", size)
    assert rec.config.block == best_block(size), rec.alternatives


def test_a_job_without_the_block_is_moved_to_it_where_it_pays(
    model: Model, fp: Fingerprint
) -> None:
    threads = max(ConfigSpace.for_device(fp, STENCIL).threads)
    start = Config(ranks=1, threads=threads, tile=16, block=0)
    state = State(
        workload="stencil", size=256, config=start, runtime_s=runtime(256, start, fp.cpus)
    )
    decision = model.decide(state)
    assert decision.choice == "BLOCK_UP", decision
