"""benchmarks/yardstick.py on the 36-configuration fixtures (tests/tuning/data/README.md): the
A6000 cut is the scored device, the A100 cut its sibling (the leave-one-GPU-out fleet)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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


@pytest.fixture(scope="module")
def siblings(space):  # type: ignore[no-untyped-def]
    candidates = yardstick.spaces([str(DATA)])
    return yardstick.siblings_of(space, candidates, DATA / "convolution_milo_cut.json")


def test_the_fleet_is_the_other_devices_of_the_kernel(space, siblings) -> None:  # type: ignore[no-untyped-def]
    # the A6000's T4 twin is the same GPU: not a sibling
    assert [s.device for s in siblings] == ["NVIDIA A100-PCIE-40GB"]
    prior = yardstick.fleet_prior(siblings, seed=0)
    assert set(prior[0]) == set(space.records)
    assert {c for c, s in prior[0].items() if s is None} == set(siblings[0].failures())


def test_baselines_count_runs_and_score_recorded_configurations(space, siblings) -> None:  # type: ignore[no-untyped-def]
    policies = ["hpcds1", "hpcds1_warm", "random", "optuna_tpe"]
    try:
        import kernel_tuner  # noqa: F401

        policies += ["kt:greedy_ils", "kt:simulated_annealing", "kt:genetic_algorithm"]
    except ImportError:
        pass
    results = yardstick.evaluate(space, BUDGETS, range(2), policies, siblings)
    assert set(results) == set(policies)
    _, optimum = space.optimum()
    assert space.space.count() == 36 < max(BUDGETS)
    for policy, by_budget in results.items():
        for budget, runs in by_budget.items():
            assert len(runs) == 2
            for run in runs:
                assert len(run.configs) <= budget, (policy, budget)
                if policy in yardstick.HPCDS1:  # a race's re-runs are runs, each counted
                    assert len(run.configs) == min(budget, 36) or budget > 36
                else:
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


def test_bootstrap_intervals_are_paired_seeded_and_hold_the_estimate(space, siblings) -> None:  # type: ignore[no-untyped-def]
    budgets = (5, 20)
    results = yardstick.evaluate(space, budgets, range(4), ["hpcds1", "random"], siblings)
    one = yardstick.comparisons(space, results, budgets)
    two = yardstick.comparisons(space, results, budgets)
    for b in budgets:
        point, draws = one["diffs"]["hpcds1"]["random"][b]
        assert draws.shape == (yardstick.RESAMPLES,)
        assert np.array_equal(draws, two["diffs"]["hpcds1"]["random"][b][1])  # seeded
        scores = yardstick.methodology_scores(
            space, {bb: results[p][bb] for p in ["hpcds1"] for bb in [b]}
        )
        theirs = yardstick.methodology_scores(space, {b: results["random"][b]})
        if scores is not None and theirs is not None:
            assert point == pytest.approx(scores[b] - theirs[b], nan_ok=True)
        if np.isfinite(draws).any():
            lo, hi = yardstick.interval(draws)
            assert lo <= hi
        fr = one["fractions"]["hpcds1"][b]
        assert ((0 <= fr) & (fr <= 1)).all()
    # identical policies: every paired draw is exactly 0
    same = yardstick.score_draws(
        space, results["random"][20], results["random"][20], 20, yardstick.resamples(4, 50, 1)
    )
    assert np.nan_to_num(same).tolist() == [0.0] * 50


def test_setup_check_compares_budgeted_with_exhaustive(space) -> None:  # type: ignore[no-untyped-def]
    check = yardstick.setup_check(space, range(3), share=0.5)
    assert check["runs"] == 18 and check["of"] == 36
    assert 0 < check["exhaustive"] <= 1 and 0 <= check["budgeted"] <= 1
    lo, hi = check["interval"]
    assert lo <= check["difference"] <= hi


def test_main_compares_two_spaces_warm_and_cold_with_json(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "yardstick.json"
    code = yardstick.main(
        [
            str(DATA / "convolution_milo_A6000_cut.json"),
            str(DATA / "convolution_milo_A100_cut.json"),
            "--kernel",
            str(DATA / "convolution_milo_cut.json"),
            "--budgets",
            "5,20",
            "--seeds",
            "3",
            "--policies",
            "hpcds1,hpcds1_warm,random",
            "--json",
            str(out),
            "--home",
            str(tmp_path / "home"),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "hpcds1_warm - random" in text and "pooled over the spaces" in text
    data = json.loads(out.read_text())
    assert json.loads((tmp_path / "home" / "evaluation" / "yardstick.json").read_text()) == data
    assert data["seeds"] == [0, 1, 2] and data["budgets"] == [5, 20]
    a6000 = data["spaces"]["data/convolution_milo_A6000_cut.json"]
    assert a6000["siblings"] == ["NVIDIA A100-PCIE-40GB"]
    assert set(a6000["figures"]) == {"hpcds1", "hpcds1_warm", "random"}
    assert len(a6000["figures"]["hpcds1"]["20"]["per_seed"]) == 3
    pooled = data["pooled"]["diffs"]["hpcds1 - random"]["20"]
    assert len(pooled["interval"]) == 2
