"""benchmarks/yardstick.py on the 36-configuration fixture (tests/tuning/data/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import yardstick

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "tuning" / "data"

BUDGETS = (5, 10, 50)  # 50 >= the 36 valid configurations


@pytest.fixture(scope="module")
def space():  # type: ignore[no-untyped-def]
    return yardstick.RecordedSpace.load(
        DATA / "convolution_milo_A6000_cut.json", kernel=DATA / "convolution_milo_cut.json"
    )


def test_baselines_count_runs_and_score_recorded_configurations(space) -> None:  # type: ignore[no-untyped-def]
    policies = ["random", "optuna_tpe"]
    try:
        import kernel_tuner  # noqa: F401

        policies += ["kt:greedy_ils", "kt:simulated_annealing", "kt:genetic_algorithm"]
    except ImportError:
        pass
    results = yardstick.evaluate(space, BUDGETS, range(2), policies)
    assert set(results) == set(policies)
    _, optimum = space.optimum()
    assert space.space.count() == 36 < max(BUDGETS)
    for policy, by_budget in results.items():
        for budget, runs in by_budget.items():
            assert len(runs) == 2
            for run in runs:
                assert len(run.configs) <= budget, (policy, budget)
                assert len(set(run.configs)) == len(run.configs)  # a repeat is not a run
                assert all(c in space.records for c in run.configs)
                found = yardstick.best_curve(space, run, budget)[-1]
                if found is not None:
                    assert found in {space.mean(c) for c in run.configs}
                    assert 0 < yardstick.fraction(optimum, found) <= 1
    for run in results["random"][50]:
        assert yardstick.fraction(optimum, yardstick.best_curve(space, run, 50)[-1]) == 1.0
    _, figures = yardstick.table(space, results, BUDGETS)
    assert figures["random"][50]["median"] == figures["random"][50]["p10"] == 1.0
    assert all(0 <= f[b]["p10"] <= f[b]["median"] <= 1 for f in figures.values() for b in BUDGETS)


def test_main_prints_the_table(capsys) -> None:  # type: ignore[no-untyped-def]
    code = yardstick.main(
        [
            str(DATA / "convolution_milo_A6000_cut.json"),
            "--kernel",
            str(DATA / "convolution_milo_cut.json"),
            "--budgets",
            "5,40",
            "--seeds",
            "1",
            "--policies",
            "random",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "36 valid configurations" in out and "random" in out and "B=40" in out
