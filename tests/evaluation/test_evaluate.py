"""The whole evaluation on really measured tiny sizes (tests/support/measured.py): every table
filled from the held-out landscape, and the honesty rules."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from hpc_ds1.evaluation import Evaluation, EvaluationError, build_cells, evaluate
from hpc_ds1.evaluation.plot import write_plot
from hpc_ds1.evaluation.policies import POLICIES
from hpc_ds1.evaluation.report import render
from hpc_ds1.machine.hardware import Fingerprint
from hpc_ds1.model import Measurement, Model, State, TrainedModel, train
from tests.support.measured import HELD_OUT


@pytest.fixture(scope="module")
def evaluation(model: Model, measurements: list[Measurement], fp: Fingerprint) -> Evaluation:
    return evaluate(model, measurements, fp, seed=11)


def test_every_policy_replays_every_start_on_the_measured_landscape(
    evaluation: Evaluation, model: Model, measurements: list[Measurement]
) -> None:
    r = evaluation.results
    cells, _ = build_cells([m for m in measurements if m.held_out], model.space_for)
    assert r["landscape"]["cells"] == len(cells) == sum(len(s) for s in HELD_OUT.values())
    table = {row["policy"]: row for row in r["sessions"]["table"]}
    assert set(table) == set(POLICIES)  # every policy replayed
    starts = sum(len(c.points) for c in cells)
    assert {row["sessions"] for row in table.values()} == {starts}  # same starts for all
    assert table["exhaustive"]["pct_median"] == 100.0
    for row in table.values():
        assert 0 < row["pct_p10"] <= row["pct_median"] <= 100.0
    budget = r["sessions"]["budget"]
    assert table["random"]["runs_max"] == budget and table["optuna_tpe"]["runs_max"] <= budget
    model_runs = [o.runs for o in evaluation.sessions if o.policy == "model"]
    assert budget == max(2, math.ceil(sum(model_runs) / len(model_runs)))  # the model's mean
    assert table["optuna_tpe_warm"]["runs_max"] <= budget
    # the baselines with the model's information: none runs more than two, the lookup none
    assert table["lookup"]["runs_max"] == 0 and table["always_stop"]["runs_max"] == 1
    assert table["start_then_lookup"]["runs_max"] <= 2
    by_key = {(c.workload, c.size): c for c in cells}
    for o in evaluation.sessions:
        cell = by_key[(o.workload, o.size)]
        assert o.runs >= (o.policy != "lookup") and o.final in cell.points  # a measured one
        if o.policy == "always_stop":
            assert o.final == o.start
        assert o.pct_of_best == pytest.approx(
            100 * cell.best_runtime_s / cell.points[o.final].runtime_s
        )
        if o.policy == "model_recommend":  # where `tune` starts without --start
            space = model.space_for(o.workload)
            assert o.start == model.recommend(o.workload, o.size, space=space).config


def test_system1_guard_and_calibration_tables(evaluation: Evaluation) -> None:
    r = evaluation.results
    s1 = {row["key"]: row for row in r["system1"]["table"]}
    assert set(s1) == {
        "model",
        "default",
        "rule_of_thumb",
        "nearest_trained",
        "interpolated_transfer",
        "exhaustive",
    }
    zero = ("model", "default", "rule_of_thumb", "interpolated_transfer")
    assert all(s1[k]["real_runs"] == 0 for k in zero)
    assert s1["exhaustive"]["median"] == 100.0 and s1["exhaustive"]["real_runs"] > 0
    kernels = {row["kernel"]: row for row in r["guard"]["kernels"]}
    assert set(kernels) == set(HELD_OUT)
    for row in kernels.values():
        if "error" in row:
            continue
        # retrained without the kernel, the model has never seen it: the guard must say so
        assert row["flagged_by_guard"] == 1.0
        assert row["confidently_wrong_after_guard"] == 0
        assert row["retrained_version"] != r["model_version"]
        assert row["confidently_wrong_after_guard"] <= row["confidently_wrong_before"]
    cal = r["calibration"]
    assert cal["decisions"] == len(evaluation.checks) > 0
    assert sum(b["decisions"] for b in cal["reliability"]) == cal["decisions"]
    lenient = cal["reliability_not_slower"]
    assert sum(b["decisions"] for b in lenient) == cal["decisions"]
    # not slower is a weaker claim than right: never a lower share
    assert cal["not_slower"] >= cal["accuracy"] and 0.0 <= cal["ece_not_slower"] <= 1.0
    assert cal["auto_moves"] == sum(c.mode == "auto" for c in evaluation.checks)
    # issue 43: the unattended label's table, the modes and the confidence's discrimination
    assert sum(b["decisions"] for b in cal["reliability_unattended"]) == cal["decisions"]
    assert sum(cal["modes"].values()) == cal["decisions"]
    assert cal["discrimination"]["decisions"] == cal["decisions"]
    assert cal["discrimination"]["selective_risk"]["curve"][-1]["coverage"] == 1.0
    assert cal["worse_5"] == round(
        sum(c.worse_5 for c in evaluation.checks) / len(evaluation.checks), 4
    )
    assert {t["target"] for t in r["targets"]} and all("met" in t for t in r["targets"])
    text = render(r)
    assert "Tuning sessions on held-out sizes" in text and "optuna_tpe" in text
    assert "discrimination: AUROC" in text and "selective risk" in text


def test_the_plot_is_a_png(evaluation: Evaluation, tmp_path: Path) -> None:
    path = write_plot(
        tmp_path / "e.png",
        evaluation.sessions,
        evaluation.checks,
        evaluation.results["calibration"]["reliability"],
        "test",
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def state_rows(model: Model, measurements: list[Measurement]) -> np.ndarray:
    return np.vstack(
        [
            model.state_features(
                State(workload=m.workload, size=m.size, config=m.as_config(), runtime_s=m.runtime_s)
            )
            for m in measurements
            if m.ok
        ]
    )


def test_held_out_measurements_never_change_the_model(
    measurements: list[Measurement], fp: Fingerprint, trained: TrainedModel, model: Model
) -> None:
    without = Model.from_onnx(train([m for m in measurements if not m.held_out], fp).to_onnx())
    X = state_rows(model, measurements)  # training and held-out states alike
    for a, b in zip(model.raw(X), without.raw(X), strict=True):
        np.testing.assert_array_equal(a, b)
    assert without.sizes == model.sizes


def test_a_run_at_a_registered_held_out_size_is_never_trained_on(
    measurements: list[Measurement], fp: Fingerprint, trained: TrainedModel
) -> None:
    # e.g. a decision or a session ran gemm at 896, a held-out size, without the flag
    unflagged = [
        m.model_copy(update={"size": 896, "held_out": False})
        for m in measurements
        if m.workload == "gemm" and m.size == 96
    ]
    again = train([*measurements, *unflagged], fp, seed=0)
    assert 896 not in again.metadata["workloads"]["gemm"]["sizes"]
    assert again.metrics["counts"]["held_out_ignored"] == (
        trained.metrics["counts"]["held_out_ignored"] + len(unflagged)
    )


def test_no_landscape_fails_loudly(
    model: Model, measurements: list[Measurement], fp: Fingerprint
) -> None:
    with pytest.raises(EvaluationError, match="no held-out landscape"):
        evaluate(model, [m for m in measurements if not m.held_out], fp)


def test_training_sizes_are_never_reported_as_held_out(
    model: Model, measurements: list[Measurement], fp: Fingerprint
) -> None:
    relabelled = [
        m.model_copy(update={"held_out": True}) if (m.workload, m.size) == ("gemm", 64) else m
        for m in measurements
    ]
    with pytest.raises(EvaluationError, match="gemm 64"):
        evaluate(model, relabelled, fp)


def test_the_truth_pass_beside_the_observed_scores(
    model: Model, measurements: list[Measurement], fp: Fingerprint
) -> None:
    """Scored on a truth pass identical to the observed one, every session keeps its old score
    (the method is the old one where nothing is re-measured); the truth pass chooses at least
    the near-best and every final configuration; what it lacks fails loudly."""
    from hpc_ds1.evaluation.run import truth_plan

    held = [m for m in measurements if m.held_out]
    plan = truth_plan(model, measurements, seed=11)
    cells, _ = build_cells(held, model.space_for)
    for cell in cells:
        chosen = set(plan[(cell.workload, cell.size)])
        assert cell.best_config in chosen
        assert {c for c, p in cell.points.items() if p.runtime_s <= 1.15 * cell.best_runtime_s} <= (
            chosen
        )
    result = evaluate(model, measurements, fp, seed=11, guard_retrain=False, truth=held)
    truth = result.results["truth"]
    for row in truth["table"]:
        assert row["pct_median"] == pytest.approx(row["observed_pct_median"], abs=0.01)
        assert row["pct_p10"] == pytest.approx(row["observed_pct_p10"], abs=0.01)
    assert truth["exhaustive_check"]["pct_mean"] == 100.0
    model_row = next(r for r in truth["table"] if r["policy"] == "model")
    spread = truth["model_interval"]
    assert spread["median"] == pytest.approx(model_row["pct_median"], abs=0.01)
    assert spread["median_interval"][0] <= spread["median"] <= spread["median_interval"][1]
    # System 1 against each baseline, paired by size: every scored size is the same pick, ahead
    # or behind
    s1 = {r["key"]: r for r in truth["system1"]}
    for other, v in truth["system1_versus"].items():
        if v is None:
            continue
        assert v["cells"] == min(s1["model"]["scored"], s1[other]["scored"])
        assert len(v["where_different"]) == v["cells"] - v["same_pick"]
        assert v["ahead"] + v["behind"] <= len(v["where_different"])  # a tie is neither
        assert v["ahead_beyond_noise"] <= v["ahead"] and v["behind_beyond_noise"] <= v["behind"]
    text = render(result.results)
    assert "sessions" in result.results and "Scored against the truth pass" in text
    assert "model sessions: median" in text
    one_cell = [m for m in held if (m.workload, m.size) == (cells[0].workload, cells[0].size)]
    with pytest.raises(EvaluationError, match="truth pass is incomplete"):
        evaluate(model, measurements, fp, seed=11, guard_retrain=False, truth=one_cell)
