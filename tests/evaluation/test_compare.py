"""The offline comparison of keep rules and transfer on the same recorded landscape, and the
replayed session's races: deterministic for a seed, nothing measured."""

from __future__ import annotations

import math

import pytest

from hpc_ds1.evaluation import Cell, Point
from hpc_ds1.evaluation.compare import Variant, compare
from hpc_ds1.model import Measurement, Model
from hpc_ds1.model.replay import model_session, rerun
from hpc_ds1.model.transfer import BANDWIDTHS
from hpc_ds1.runner.keep import DEFAULT_RULE, OLD_RULE
from hpc_ds1.space import Config
from tests.support.measured import HELD_OUT


def test_a_rerun_is_seeded_by_the_configuration_and_its_index_alone() -> None:
    c = Config(ranks=1, threads=1, tile=32)
    cell = Cell("gemm", 80, {c: Point(1.0, 0.02, None)}, frozenset())
    assert rerun(cell, c, 1, 0) == rerun(cell, c, 1, 0)
    assert rerun(cell, c, 1, 0) != rerun(cell, c, 2, 0)
    assert rerun(cell, c, 1, 0) != rerun(cell, c, 1, 1)
    assert rerun(cell, Config(ranks=2, threads=1, tile=32), 1, 0) is None


def test_compare_replays_every_variant_on_the_same_cells_and_leaves_the_final_set_out(
    model: Model, measurements: list[Measurement]
) -> None:
    truth = [m for m in measurements if m.held_out]  # a truth pass equal to the observed one
    final = {("stencil", HELD_OUT["stencil"][0])}
    variants = [
        Variant("old", OLD_RULE, False),
        Variant("new", DEFAULT_RULE, False),
        Variant("transfer", DEFAULT_RULE, True),
    ]
    first = compare(model, measurements, truth, final=final, seeds=(3,), variants=variants)
    again = compare(model, measurements, truth, final=final, seeds=(3,), variants=variants)
    assert first == again  # deterministic for its seed
    assert first["cells"] == [f"gemm {HELD_OUT['gemm'][0]}"]
    rows = {r["variant"]: r for r in first["table"][3]}
    starts = {r["sessions"] for r in rows.values()}
    assert len(starts) == 1 and starts.pop() > 0  # every variant, every start
    for r in rows.values():
        assert r["unscored"] == 0 and 0 < r["true_pct_p10"] <= r["true_pct_median"] <= 100
    assert rows["new"]["runs_mean"] >= 1
    diff = first["difference_from_first"][3]["new"]
    assert diff["cells"] == 1 and diff["interval_90"][0] <= diff["mean_difference"]
    assert {r["approach"] for r in first["system1"]} == {
        "model",
        "nearest_trained",
        "interpolated",
    }
    by_weight = first["system1_by_weight"]
    assert [r["weight"] for r in by_weight] == [i / 10 for i in range(11)]
    for r in by_weight:
        assert r["sizes"] == 1 and 0 < r["true_pct_p10"] <= r["true_pct_median"] <= 100
    by_bandwidth = first["system1_by_bandwidth"]
    assert [r["bandwidth"] for r in by_bandwidth] == list(BANDWIDTHS)
    assert all(r["sizes"] == 1 for r in by_bandwidth)
    assert first["transfer_bandwidth"] in BANDWIDTHS


def test_a_replayed_session_races_a_tie_and_counts_every_rerun(model: Model) -> None:
    space = model.space_for("gemm")
    configs = space.configs()
    # a flat landscape, the start its slowest: every move looks a little faster, within the
    # noise, so the new rule races it and never counts a miss
    cell = Cell(
        "gemm",
        80,
        {c: Point(1.0 - 0.002 * i, 0.03, None) for i, c in enumerate(configs)},
        frozenset(),
    )
    start = configs[0]
    new = model_session(model, cell, start, space, model.thresholds, rule=DEFAULT_RULE, seed=0)
    old = model_session(model, cell, start, space, model.thresholds, rule=OLD_RULE, seed=0)
    assert old.finish in ("two_misses", "stop", "no_moves")
    assert new.runs == len(new.ran) and new.finish != "two_misses"
    if new.runs > 1:  # the model moved: that move was raced (a configuration ran again)
        assert len(set(new.ran)) < len(new.ran)
    assert new.final in cell.points


@pytest.mark.parametrize("seed", [0, 1])
def test_a_clear_gain_is_kept_by_both_rules(model: Model, seed: int) -> None:
    space = model.space_for("gemm")
    configs = space.configs()
    best = configs[-1]
    cell = Cell(
        "gemm",
        80,
        {c: Point(0.5 if c == best else 1.0, 0.01, None) for c in configs},
        frozenset(),
    )
    for rule in (OLD_RULE, DEFAULT_RULE):
        o = model_session(model, cell, best, space, model.thresholds, rule=rule, seed=seed)
        assert o.final == best  # nothing is faster than the start: it is never left


def test_simulated_cells_see_the_truth_through_the_chosen_noise_and_skip_unknown_ones() -> None:
    from hpc_ds1.evaluation.compare import simulated_cells
    from hpc_ds1.evaluation.truth import TruePoint

    a, b = Config(ranks=1, threads=1, tile=32), Config(ranks=2, threads=1, tile=32)
    cell = Cell("gemm", 80, {a: Point(1.3, 0.2, 10.0), b: Point(2.0, 0.2, None)}, frozenset())
    half = Cell("gemm", 96, {a: Point(1.0, 0.2, None), b: Point(1.0, 0.2, None)}, frozenset())
    truth = {("gemm", 80): {a: TruePoint(1.0, 0.05), b: TruePoint(2.0, 0.05)}}
    exact = simulated_cells([cell, half], truth, 0.0, seed=0)
    assert [(c.size, c.points) for c in exact] == [
        (80, {a: Point(1.0, 0.0, 13.0), b: Point(2.0, 0.0, None)})  # throughput follows runtime
    ]  # gemm 96 has no truth pass: left out
    noisy = simulated_cells([cell], truth, 0.02, seed=0)[0]
    assert noisy == simulated_cells([cell], truth, 0.02, seed=0)[0]  # seeded
    assert noisy != simulated_cells([cell], truth, 0.02, seed=1)[0]
    for config, point in noisy.points.items():
        true = truth[("gemm", 80)][config].runtime_s
        assert point.spread == 0.02 and point.runtime_s != true
        assert abs(math.log(point.runtime_s / true)) < 0.02 * 6  # a draw within six sigma
