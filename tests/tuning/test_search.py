"""hpc_ds1.tuning.search on the 36-configuration recorded fixtures (tests/tuning/data/README.md):
the A6000 cut is the device; the A100 cut of the same kernel is its sibling (the prior)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hpc_ds1.knobs import Knob, KnobSpace
from hpc_ds1.tuning import search
from hpc_ds1.workloads.recorded_space import RecordedDevice, RecordedSpace

DATA = Path(__file__).parent / "data"
KERNEL = DATA / "convolution_milo_cut.json"


@pytest.fixture(scope="module")
def a6000() -> RecordedSpace:
    return RecordedSpace.load(DATA / "convolution_milo_A6000_cut.json", kernel=KERNEL)


@pytest.fixture(scope="module")
def a100() -> RecordedSpace:
    return RecordedSpace.load(DATA / "convolution_milo_A100_cut.json", kernel=KERNEL)


def _prior(sibling: RecordedSpace, seed: int = 0) -> search.Prior:
    device = RecordedDevice(sibling, seed)
    return [{c: device.run(c).seconds for c in sibling.records}]


class Counting:
    """A recorded device that counts what is sent to it."""

    def __init__(self, space: RecordedSpace, seed: int) -> None:
        self.device, self.sent = RecordedDevice(space, seed), 0

    def run(self, config):  # type: ignore[no-untyped-def]
        self.sent += 1
        return self.device.run(config)


@pytest.mark.parametrize("budget", [1, 5, 12, 36, 60])
def test_every_run_counts_and_none_is_repeated_but_a_race(a6000, budget) -> None:  # type: ignore[no-untyped-def]
    device = Counting(a6000, seed=3)
    trace = search.tune(a6000.space, device, budget, seed=3)
    assert len(trace.steps) == device.sent <= budget
    assert device.sent == budget or budget > 36  # stops early only when it ran out of space
    firsts = [s.config for s in trace.steps if s.kind != "race"]
    assert len(firsts) == len(set(firsts))  # a configuration runs once, but for a race's re-runs
    races = [s.config for s in trace.steps if s.kind == "race"]
    assert set(races) <= set(firsts)
    assert all(a6000.space.contains(c) for c in trace.configs)  # constraints respected
    failures = a6000.failures()
    for step in trace.steps:  # a recorded failure is sent, fails and counts
        assert (step.seconds is None) == (step.config in failures)
    if budget >= 12:
        assert any(s.config in failures for s in trace.steps)


def test_finds_the_optimum_within_the_space_size(a6000) -> None:  # type: ignore[no-untyped-def]
    optimum, _ = a6000.optimum()
    for seed in range(4):
        trace = search.tune(a6000.space, RecordedDevice(a6000, seed), 36, seed=seed)
        assert optimum in trace.configs, seed


def test_same_seed_same_trace_and_a_budget_is_a_prefix(a6000) -> None:  # type: ignore[no-untyped-def]
    one = search.tune(a6000.space, RecordedDevice(a6000, 7), 30, seed=7)
    two = search.tune(a6000.space, RecordedDevice(a6000, 7), 30, seed=7)
    assert one == two
    short = search.tune(a6000.space, RecordedDevice(a6000, 7), 11, seed=7)
    assert short.steps == one.steps[:11]  # no decision reads the budget
    other = search.tune(a6000.space, RecordedDevice(a6000, 8), 30, seed=8)
    assert other.configs != one.configs


def test_the_steps_are_setup_then_picks_moves_and_learning(a6000) -> None:  # type: ignore[no-untyped-def]
    settings = search.Settings()
    trace = search.tune(a6000.space, RecordedDevice(a6000, 1), 30, seed=1)
    kinds = [s.kind for s in trace.steps]
    assert kinds[: settings.start] == ["setup"] * settings.start
    assert kinds[settings.start : settings.start + settings.learn] == ["learn"] * settings.learn
    assert "pick" in kinds and set(kinds) <= {"setup", "learn", "pick", "move", "race"}
    assert trace.best in trace.configs and trace.best not in a6000.failures()


def test_a_warm_start_runs_the_fleets_best_first(a6000, a100) -> None:  # type: ignore[no-untyped-def]
    prior = _prior(a100)
    sibling_best = min((s, c) for c, s in prior[0].items() if s is not None)[1]
    device = Counting(a6000, seed=0)
    trace = search.tune(a6000.space, device, 10, seed=0, prior=prior)
    assert trace.steps[0].config == sibling_best and trace.steps[0].kind == "prior"
    assert device.sent == len(trace.steps) == 10  # the prior costs this device nothing
    cold = search.tune(a6000.space, RecordedDevice(a6000, 0), 10, seed=0)
    assert cold.configs != trace.configs


def test_prior_start_spreads_over_the_top_of_the_consensus() -> None:
    # two siblings; rows 0-2 one region (near copies), row 3 another, row 4 far but poor
    columns = np.array([[-1.0, -1.2], [-0.9, -1.0], [-1.0, -0.9], [-0.8, -0.6], [1.0, 1.0]])
    positions = np.array([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [1.0, 1.0], [1.0, 0.0]])
    # the consensus best first, then the farthest of the top 4 (not row 4: outside the pool)
    assert search.prior_start(columns, positions, 2, pool=4) == [0, 3]
    # then the farthest from both, ties to the better in consensus (row 1 before row 2)
    assert search.prior_start(columns, positions, 3, pool=4) == [0, 3, 1]
    assert search.prior_start(columns, positions, 3, pool=5) == [0, 3, 4]
    assert search.prior_start(columns, positions, 9, pool=2) == [0, 1]  # no more than the pool
    assert search.prior_start(columns, positions, 0, pool=4) == []


def test_features_encode_every_kind_of_knob() -> None:
    space = KnobSpace(
        [
            Knob("block", "int", (32, 64, 128), 32),
            Knob("algo", "category", ("a", "b", "c"), "a"),
            Knob("pad", "bool", (False, True), False),
        ],
        ["block * (2 if pad else 1) <= 128"],
    )
    features = search.features_of(space)
    assert features is search.features_of(space)  # worked out once a space
    assert len(features.configs) == space.count() == 15
    row = features.X[features.index[(64, "b", True)]]
    # block: position 1 and log2 64; algo one-hot (0, 1, 0); pad: position 1 and log2(True)=0
    assert list(row[:5]) == [1.0, 6.0, 0.0, 1.0, 0.0]
    assert row[5] == 1.0
    assert features.positions.min() == 0.0 and features.positions.max() == 1.0


def test_spread_is_valid_distinct_and_reaches_far(a6000) -> None:  # type: ignore[no-untyped-def]
    features = search.features_of(a6000.space)
    rows = search.spread(features.positions, 8, np.random.default_rng(0))
    assert len(rows) == len(set(rows)) == 8
    chosen = features.positions[rows]
    assert (chosen.max(axis=0) - chosen.min(axis=0)).sum() >= 4  # most knobs at both ends


def test_surrogate_follows_scikit_learn_habits_and_its_spread_is_uncertainty() -> None:
    rng = np.random.default_rng(0)
    X = rng.random((40, 3))
    y = 3 * X[:, 0] + 0.1 * rng.random(40)
    model = search.Surrogate(trees=16, seed=1)
    assert model.fit(X, y) is model
    mean, std = model.predict(np.array([[0.1, 0.5, 0.5], [0.9, 0.5, 0.5], [5.0, 5.0, 5.0]]))
    assert mean[0] < mean[1] and (std >= 0).all()
    ei = search.expected_improvement(np.array([0.0, 1.0, 1.0]), np.array([0.0, 0.0, 1.0]), 0.5)
    assert ei[0] == pytest.approx(0.5) and ei[1] == 0.0 and ei[2] > 0.0


def test_budgeted_setup_measures_each_once_within_the_budget(a6000) -> None:  # type: ignore[no-untyped-def]
    device = Counting(a6000, seed=2)
    trace = search.budgeted_setup(a6000.space, device, 12, seed=2, rounds=3)
    assert device.sent == len(trace.steps) == 12
    assert max(Counter(trace.configs).values()) == 1
    pick = search.system1(a6000.space, trace.steps, seed=2)
    assert pick is not None and a6000.space.contains(pick)
    everything = [
        search.Step(c, "setup", (r := RecordedDevice(a6000, 2).run(c)).seconds, r.failure)
        for c in a6000.records
    ]
    # after an exhaustive setup, System 1 is the configuration of the fastest run
    fastest = min((s.seconds, s.config) for s in everything if s.seconds is not None)[1]
    assert search.system1(a6000.space, everything) == fastest


def test_a_warm_budgeted_setup_starts_at_the_top_of_the_consensus(a6000, a100) -> None:  # type: ignore[no-untyped-def]
    prior = _prior(a100)
    ranked = sorted((s, c) for c, s in prior[0].items() if s is not None)
    device = Counting(a6000, seed=2)
    trace = search.budgeted_setup(a6000.space, device, 20, seed=2, rounds=3, prior=prior)
    assert device.sent == len(trace.steps) == 20  # the prior costs this device nothing
    assert max(Counter(trace.configs).values()) == 1
    warm = [s for s in trace.steps if s.kind == "prior"]
    assert len(warm) == search.Settings().prior_runs and trace.steps[0].kind == "prior"
    assert trace.steps[0].config == ranked[0][1]  # the sibling's fastest first
    assert {s.config for s in warm} <= {c for _, c in ranked[: search.Settings().pool]}
    assert all(s.kind == "learn" for s in trace.steps[len(warm) :])
    # no sibling measured anything: a cold start, as without a prior
    cold = search.budgeted_setup(a6000.space, Counting(a6000, 2), 20, seed=2, rounds=3)
    empty = search.budgeted_setup(a6000.space, Counting(a6000, 2), 20, seed=2, rounds=3, prior=[])
    assert empty.configs == cold.configs and cold.steps[0].kind == "setup"
