"""A workload's own knobs in the model: feature columns, the transfer table of the model file,
move classes and their representatives, and a trained model that decides over them."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from hpc_ds1.knobs import Knob
from hpc_ds1.model import Measurement, Model, State, Thresholds, train
from hpc_ds1.model import features as ft
from hpc_ds1.model.transfer import from_metadata, to_metadata
from hpc_ds1.space import (
    KNOB_DOWN,
    KNOB_SET,
    KNOB_UP,
    STOP,
    Config,
    ConfigSpace,
    action_class,
    is_move_name,
    neighbours,
    representatives,
)
from hpc_ds1.workloads import Work, command_workload
from hpc_ds1.workloads.registry import preserved, register

KNOBS = (Knob("nb", "int", (8, 16, 32), 8), Knob("algo", "category", ("fast", "slow"), "slow"))


def _config(ranks: int, nb: int, algo: str) -> Config:
    return Config(ranks=ranks, threads=1, tile=1, knobs={"nb": nb, "algo": algo})


def test_own_knob_columns_encode_values_without_the_knob_definitions() -> None:
    fast = ft.own_knob_vector(_config(1, 16, "fast"))
    slow = ft.own_knob_vector(_config(1, 16, "slow"))
    assert len(fast) == len(ft.OWN_KNOB_FEATURES)
    # knobs by name: algo, nb; a number as log2(1 + |v|) with its sign; a word as a stable
    # code in [0, 1)
    assert fast[1] == slow[1] == math.log2(17) and fast[0] != slow[0]
    assert 0 <= fast[0] < 1 and fast[2:] == [0.0] * (len(fast) - 2)
    assert ft.own_knob_vector(Config(ranks=1, threads=1, tile=4)) == [0.0] * len(fast)
    flags = Config(ranks=1, threads=1, tile=1, knobs={"pad": True, "x": -3, "y": 0, "z": 1})
    assert ft.own_knob_vector(flags)[:4] == [1.0, -2.0, 0.0, 1.0]  # a 0/1 switch stays apart


def test_the_transfer_table_keeps_own_knobs_and_reads_a_file_from_before_them() -> None:
    table = {"app": {64: {_config(1, 8, "fast"): -0.1, _config(1, 8, "slow"): 0.2}}}
    assert from_metadata(to_metadata(table)) == table
    old = {"gemm": {"64": [[1, 2, 32, 0, 0.1], [2, 1, 32, 0, -0.1, 4]]}}
    read = from_metadata(old)
    assert set(read["gemm"][64]) == {
        Config(ranks=1, threads=2, tile=32),
        Config(ranks=2, threads=1, tile=32, block=4),
    }


def test_move_classes_and_their_representatives() -> None:
    assert action_class("RANKS_UP") == "RANKS_UP" and action_class(STOP) == STOP
    assert [action_class(m) for m in ("nb+", "nb-", "algo=fast")] == [KNOB_UP, KNOB_DOWN, KNOB_SET]
    assert all(is_move_name(m) for m in ("nb+", "algo=fast", "THREADS_UP", STOP))
    assert not any(is_move_name(m) for m in ("KNOB_UP", "nb", "a b+", "x=1;rm"))
    chosen = representatives({"nb+": -0.1, "bx+": -0.3, "algo=fast": 0.2, "RANKS_UP": 0.1})
    assert chosen == {KNOB_UP: "bx+", KNOB_SET: "algo=fast", "RANKS_UP": "RANKS_UP"}


def test_a_model_trained_on_own_knobs_decides_over_them() -> None:
    """A landscape where `algo=fast` is 8x faster and larger blocks help: the model learns the
    knobs (their columns are trained on) and a decision from a slow configuration offers the
    knob moves with their predicted runtimes."""

    space = ConfigSpace.for_cpus(2, (1,), knobs=KNOBS)
    app = command_workload("app", "{python} app.py {size}", sizes=(64, 128, 256))
    app = replace(app, knobs=KNOBS, work=lambda n: Work(n**3, n**2, n**2, n))
    with preserved():
        register(app)
        _trained_and_decided(space)


def _trained_and_decided(space: ConfigSpace) -> None:
    from hpc_ds1.machine.hardware import fingerprint

    rows = []
    for size in (64, 128, 256):
        for c in space.configs():
            runtime = size * 1e-4 * (8.0 if c.knob("algo") == "slow" else 1.0)
            runtime *= 1.0 + 0.5 / math.log2(int(c.knob("nb") or 1)) + 0.1 * c.ranks
            rows.append(
                Measurement(
                    workload="app",
                    size=size,
                    config=c.model_dump(),
                    status="ok",
                    runtime_s=runtime,
                    spread=0.01,
                )
            )
    trained = train(rows, fingerprint(), space_for=lambda _: space)
    assert trained.metadata["features"][-3:] == list(ft.TELEMETRY_FEATURES)
    assert set(ft.OWN_KNOB_FEATURES) <= set(trained.metadata["features"])
    found = trained.metrics["move_model"]["discrimination"]  # issue 43's report is there
    assert found["decisions"] > 0 and found["brier"]["uncertainty"] >= 0
    model = Model.from_onnx(trained.to_onnx())
    start = _config(1, 8, "slow")
    state = State(workload="app", size=128, config=start, runtime_s=128e-4 * 8 * 1.7)
    decision = model.decide(state, space=space, thresholds=Thresholds())
    assert set(decision.alternatives) == {*neighbours(start, space), STOP}
    runtimes = decision.predicted_runtimes_s
    assert runtimes["algo=fast"] < runtimes[STOP] / 2
    assert np.isclose(sum(decision.alternatives.values()), 1.0)
    assert is_move_name(decision.choice)
