"""The fleet simulation's small mode: a tiny landscape measured for real (gemm, two sizes,
unpinned and pinned to one CPU), 80 tasks at 50 % and 90 % load. Asserted: what holds for any
landscape (every policy finishes every task, never beats the lower bounds, the report's
shape); the targets are the benchmark's to print."""

from __future__ import annotations

import itertools

from benchmarks.bench_fleet_sim import (
    KINDS,
    POLICIES,
    fleet_kinds,
    make_tasks,
    measure,
    report,
    run_load,
)


def test_a_small_fleet_simulation_on_a_measured_landscape() -> None:
    landscape, took = measure({"gemm": (64, 96)}, repeats=2)
    assert took > 0 and set(landscape) == set(KINDS)
    for costs in landscape.values():
        assert set(costs) == {("gemm", 64), ("gemm", 96)}
        for cost in costs.values():
            assert cost.runtime_s > 0 and len(cost.samples) == 2
            assert cost.config["ranks"] * cost.config["threads"] <= 2
    kinds = fleet_kinds(4)
    assert kinds.count("pinned") == kinds.count("unpinned") == 2
    tasks, rate = make_tasks(landscape, 80, 0.5, kinds, seed=1)
    assert rate > 0 and len(tasks) == 80
    assert all(a.arrival < b.arrival for a, b in itertools.pairwise(tasks))

    results = [run_load(landscape, kinds, 80, load, seed=1) for load in (0.5, 0.9)]
    for result in results:
        assert set(result.outcomes) == set(POLICIES)
        for outcome in result.outcomes.values():
            assert sum(outcome.placed_on.values()) == 80
            assert outcome.makespan_s >= result.makespan_bound * (1 - 1e-9)
            assert outcome.mean_completion_s >= result.completion_bound * (1 - 1e-9)
        assert result.makespan_ratio >= 1 - 1e-9
    text = report(results, 80, kinds)
    print(text)
    assert text.count("targets: makespan") == 2
    assert "fleet: 2 unpinned + 2 pinned devices, 80 tasks" in text
