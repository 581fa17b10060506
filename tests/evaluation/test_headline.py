"""Issue 13's headline figures on the truth pass: System 1's picks scored there, the model
against another policy with a bootstrap interval over cells, and the targets. Synthetic scores:
deterministic."""

from __future__ import annotations

from typing import Any

import pytest

from hpc_ds1.evaluation.headline import system1_truth, truth_targets, versus
from hpc_ds1.evaluation.policies import SessionOutcome
from hpc_ds1.evaluation.truth import TruePoint, TrueScore
from hpc_ds1.space import Config, ConfigSpace

CONFIGS = ConfigSpace.for_cpus(2, (32, 64, 128)).configs()


def score(policy: str, size: int, pct: float) -> TrueScore:
    c = CONFIGS[0]
    outcome = SessionOutcome(policy, "gemm", size, c, c, 1, pct, ran=(c,))
    return TrueScore(outcome, pct, pct >= 99.0, None, 1.0)


def test_system1_picks_are_scored_on_the_truth_and_unmeasured_ones_counted() -> None:
    a, b, c = CONFIGS[:3]
    truth = {("gemm", 1000): {a: TruePoint(1.0, 0.0), b: TruePoint(1.25, 0.0)}}
    s1 = {
        "per_size": [
            {
                "workload": "gemm",
                "size": 1000,
                "model": {"config": b.label(), "pct_of_best": 100.0},  # observed: lucky
                "default": {"config": a.label(), "pct_of_best": 80.0},
                "rule_of_thumb": {"config": c.label(), "pct_of_best": 90.0},
            }
        ]
    }
    rows = {r["key"]: r for r in system1_truth(s1, truth)}
    assert rows["model"]["median"] == pytest.approx(80.0)  # 1.0 / 1.25
    assert rows["default"]["median"] == pytest.approx(100.0)
    assert rows["rule_of_thumb"] == {
        "key": "rule_of_thumb",
        "median": None,
        "p10": None,
        "scored": 0,
        "unscored": 1,
    }


def test_a_policy_ahead_in_every_cell_has_an_interval_above_zero() -> None:
    scores = []
    for size in range(10):
        scores += [score("model", size, 95.0 + (size % 3)) for _ in range(4)]
        scores += [score("random", size, 80.0 + (size % 5)) for _ in range(4)]
    v = versus(scores, "model", "random", seed=1)
    assert v is not None and v["cells"] == 10
    assert v["median_difference"] > 0 and v["median_interval"][0] > 0
    assert v["p10_interval"][0] > 0 and v["above_with_interval"]
    assert v["median_interval"][0] <= v["median_difference"] <= v["median_interval"][1]
    assert versus(scores, "model", "random", seed=1) == v  # seeded: deterministic


def test_a_policy_ahead_in_half_the_cells_only_has_an_interval_across_zero() -> None:
    scores = []
    for size in range(10):
        ahead = size % 2 == 0
        scores += [score("model", size, 99.0 if ahead else 70.0) for _ in range(3)]
        scores += [score("optuna_tpe", size, 85.0) for _ in range(3)]
    v = versus(scores, "model", "optuna_tpe", seed=0)
    assert v is not None
    assert v["median_interval"][0] <= 0  # the median cannot be told apart from TPE's
    assert v["p10_interval"][1] < 0  # and its worst sessions are clearly worse
    assert not v["above_with_interval"]
    assert versus(scores, "model", "greedy") is None  # no shared cell


def results(**calibration: Any) -> dict[str, Any]:
    return {
        "truth": {
            "table": [{"policy": "model", "pct_median": 98.0, "pct_p10": 90.0, "runs_median": 4}],
            "system1": [
                {"key": "model", "median": 96.0},
                {"key": "rule_of_thumb", "median": 90.0},
                {"key": "nearest_trained", "median": 97.0},
            ],
            "versus": {"random": {"above_with_interval": True}, "optuna_tpe": None},
        },
        "calibration": {"decisions": 10, "auto_moves": 4, **calibration},
    }


def test_the_targets_read_the_truth_pass_and_say_met_or_missed() -> None:
    rows = {
        r["target"]: r for r in truth_targets(results(auto_not_slower=1.0, ece_not_slower=0.08))
    }
    assert rows["model sessions: true median % of best"]["met"] is True
    assert rows["model sessions: true 10th percentile % of best"]["met"] is False
    assert rows["model sessions: median real runs"]["met"] is True
    random_row = "model above random on median and p10, bootstrap interval excluding 0"
    assert rows[random_row]["met"] is True
    tpe_row = "model above optuna_tpe on median and p10, bootstrap interval excluding 0"
    assert rows[tpe_row]["met"] is None  # not measurable: no shared cell
    assert rows["System 1: true median % of best with 0 runs"]["met"] is True
    above = "System 1 above rule of thumb and nearest trained size (true median)"
    assert rows[above]["met"] is False  # 96 is below the nearest trained size's 97
    assert rows["held-out decisions that run automatically"]["value"] == pytest.approx(0.4)
    assert rows["automatic decisions not slower"]["met"] is True
    assert rows["calibration error (ECE) on not slower"]["met"] is False
    assert not any(name.startswith("live") for name in rows)  # no live sessions, no live rows


def test_live_sessions_get_the_session_targets_of_their_own() -> None:
    seeded = {"sessions": 32, "pct_median": 97.5, "pct_p10": 91.0, "runs_median": 4.5}
    live = {
        "table": [
            {"policy": "model_recommend_live", "live": {**seeded, "pct_p10": 99.0}},
            {"policy": "model_live", "live": seeded},
        ]
    }
    rows = {r["target"]: r for r in truth_targets({**results(), "live": live})}
    name = "live model sessions (32, seeded starts, every run real)"
    assert rows[f"{name}: true median % of best"]["met"] is True
    assert rows[f"{name}: true 10th percentile % of best"]["value"] == 91.0  # the seeded row's
    assert rows[f"{name}: true 10th percentile % of best"]["met"] is False
    assert rows[f"{name}: median real runs"]["met"] is True
    # the replayed rows are still there, beside them
    assert rows["model sessions: median real runs"]["value"] == 4


def test_a_config_label_is_what_matches_a_pick_to_the_truth() -> None:
    c = Config(ranks=1, threads=2, tile=64)
    truth = {("gemm", 5): {c: TruePoint(2.0, 0.01)}}
    rows = system1_truth(
        {"per_size": [{"workload": "gemm", "size": 5, "model": {"config": c.label()}}]}, truth
    )
    assert rows == [{"key": "model", "median": 100.0, "p10": 100.0, "scored": 1, "unscored": 0}]
