"""Issue 13, part 2: the transfer prior travels in the model file and System 1 blends it in with
the weight leave-one-size-out chose; the confidence of a decision is calibrated against "not
slower" by isotonic tables in the file. Synthetic data where the figures are checked; the shared
tiny model (tests/support/measured.py) where the wiring is, with exact relations only."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest

from hpc_ds1.model import Model, State, TrainedModel, aggregate
from hpc_ds1.model.calibration import Calibration, ece, fit, fit_and_score
from hpc_ds1.model.labels import Outcome
from hpc_ds1.model.onnx_graph import METADATA_KEY
from hpc_ds1.model.training import DECIDE_SHARES
from hpc_ds1.model.transfer import (
    LN10,
    blend_logs,
    blended_deltas,
    choose_weights,
    from_metadata,
    pick,
    predict,
    relative_table,
    tied_with,
    to_metadata,
)
from hpc_ds1.space import STOP, Config, neighbours

A = Config(ranks=1, threads=2, tile=32)
B = Config(ranks=2, threads=1, tile=32)
C = Config(ranks=4, threads=1, tile=32)
SIZES = (100, 200, 400, 800)


def runtime(c: Config, size: int) -> float:
    """A crossover: A is best small, C large, B in between (smooth in log size)."""
    x = math.log2(size / 100)  # 0 .. 3
    shape = {A: 0.25 * x, B: 0.25 + 0.05 * (x - 1.5) ** 2, C: 0.9 - 0.3 * x}[c]
    return size * math.exp(shape)


def landscape() -> dict[tuple[str, int, Config], float]:
    return {("w", s, c): runtime(c, s) for s in SIZES for c in (A, B, C)}


def table_of(measured: dict[tuple[str, int, Config], float]) -> dict:
    return relative_table({k: Outcome(True, t, 0.01, None) for k, t in measured.items()})


# --- transfer prior ---------------------------------------------------------------------------


def test_blend_keeps_the_level_and_mixes_the_shape() -> None:
    logs = {A: 1.0, B: 2.0, C: 3.0, Config(ranks=8, threads=1, tile=32): 9.0}
    prior = {A: 0.5, B: 0.0, C: -0.5}
    assert blend_logs(logs, prior, 0.0) == logs
    full = blend_logs(logs, prior, 1.0)
    assert [full[c] for c in (A, B, C)] == pytest.approx([2.5, 2.0, 1.5])  # prior's shape
    assert full[Config(ranks=8, threads=1, tile=32)] == 9.0  # unknown to the prior: kept
    half = blend_logs(logs, prior, 0.5)
    assert sum(half[c] for c in (A, B, C)) == pytest.approx(6.0)  # level stays the model's
    assert half[A] == pytest.approx(2.0 + 0.5 * 0.5 + 0.5 * -1.0)


def test_table_round_trips_through_the_model_metadata() -> None:
    t = table_of(landscape())
    back = from_metadata(json.loads(json.dumps(to_metadata(t))))
    assert set(back) == {"w"} and set(back["w"]) == set(SIZES)
    for s in SIZES:
        for c, v in t["w"][s].items():
            assert back["w"][s][c] == pytest.approx(v, abs=1e-5)


def test_leave_one_size_out_prefers_transfer_over_a_wrong_model() -> None:
    measured = landscape()
    # a runtime model that ranks the configurations the wrong way round at every size
    wrong = {k: math.log10(measured[("w", k[1], C if k[2] == A else A if k[2] == C else B)])
             for k in measured}  # fmt: skip
    chosen = choose_weights(table_of(measured), wrong, measured)
    assert chosen["weight"]["inside"] >= 0.5
    assert chosen["folds"]["inside"] == ["w 200", "w 400"]
    assert chosen["folds"]["outside"] == ["w 100", "w 800"]
    inside = {r["weight"]: r for r in chosen["by_weight"]["inside"]}
    assert inside[chosen["weight"]["inside"]]["pct_of_best"] > inside[0.0]["pct_of_best"]


def test_leave_one_size_out_keeps_an_exact_model_where_transfer_picks_worse() -> None:
    # two workloads of the same shape, so each kind has 4 folds
    measured = landscape() | {("v", s, c): 3.0 * t for (_, s, c), t in landscape().items()}
    exact = {k: math.log10(t) for k, t in measured.items()}
    chosen = choose_weights(table_of(measured), exact, measured)
    # transfer picks worse at some folds (extrapolating outside the range, and near the
    # crossover inside); the exact model picks the best at every fold
    for kind in ("inside", "outside"):
        rows = {r["weight"]: r for r in chosen["by_weight"][kind]}
        best_everywhere = [w for w, r in rows.items() if r["pct_of_best"] == pytest.approx(100.0)]
        assert rows[1.0]["pct_of_best"] < 100.0 and not rows[1.0]["within_one_se_of_best"]
        assert 0.0 in best_everywhere and all(
            rows[w]["within_one_se_of_best"] for w in best_everywhere
        )
        # among the weights tied with the best, the measured relative runtimes weigh most
        assert chosen["weight"][kind] == max(best_everywhere)


def test_one_standard_error_ties_are_paired_by_fold() -> None:
    # 0.5 point short at every fold: consistently worse, not tied
    assert not tied_with([99.5, 94.5, 89.5], [100.0, 95.0, 90.0])
    # short by 3 at one fold, ahead by 2 at another: the mean gap (0.33) is within its
    # standard error (1.45)
    assert tied_with([97.0, 97.0, 90.0], [100.0, 95.0, 90.0])
    assert tied_with([100.0, 95.0, 90.0], [100.0, 95.0, 90.0])
    assert not tied_with([99.0], [100.0])  # one fold: only the best itself


def test_no_fold_means_the_model_alone() -> None:
    one = {k: t for k, t in landscape().items() if k[1] == 200}
    chosen = choose_weights(table_of(one), {}, one)
    assert chosen["weight"] == {"inside": 0.0, "outside": 0.0}


# --- the prior in a real model file --------------------------------------------------------


def states(measurements: list) -> list[State]:
    return [
        State(workload=w, size=s, config=c, runtime_s=o.runtime_s, throughput=o.throughput)
        for (w, s, c), o in sorted(aggregate(measurements).items(), key=lambda kv: str(kv[0]))
        if o.ok
    ]


def edited(data: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    m = onnx.load_from_string(data)
    for prop in m.metadata_props:
        if prop.key == METADATA_KEY:
            meta = json.loads(prop.value)
            edit(meta)
            prop.value = json.dumps(meta)
    return m.SerializeToString()


def test_the_model_file_carries_the_trained_sizes_relative_runtimes(
    trained: TrainedModel, model: Model, measurements: list
) -> None:
    training = [m for m in measurements if not m.held_out]
    expected = relative_table(aggregate(training))
    for w, sizes in expected.items():
        assert set(model.transfer[w]) == set(sizes)
        for s, rel in sizes.items():
            assert set(model.transfer[w][s]) == set(rel)
            for c, v in rel.items():
                assert model.transfer[w][s][c] == pytest.approx(v, abs=1e-5)
    info = trained.metrics["transfer"]
    assert set(info["weight"]) == {"inside", "outside"}
    assert model.transfer_bandwidth == info["smoothing"]["bandwidth"]  # chosen, then carried
    assert all(0.0 <= v <= 1.0 for v in info["weight"].values())


@pytest.mark.parametrize(("weight", "bandwidth"), [(0.3, 0.0), (1.0, 0.0), (1.0, 0.3)])
def test_recommend_blends_the_prior_with_the_chosen_weight(
    trained: TrainedModel, weight: float, bandwidth: float
) -> None:
    def set_weight(meta: dict[str, Any]) -> None:
        meta["transfer"]["weight"] = {"inside": weight, "outside": weight}
        meta["transfer"]["bandwidth"] = bandwidth

    model = Model.from_onnx(edited(trained.to_onnx(), set_weight))
    assert model.transfer_bandwidth == bandwidth
    for workload, size in (("gemm", 80), ("stencil", 14), ("gemm", 200)):
        space = model.space_for(workload)
        configs = space.configs()
        runtimes, _ = model.predict_runtimes(workload, size, configs)
        rel = predict(model.transfer, workload, size, bandwidth=bandwidth)
        prior = {c: v / LN10 for c, v in rel.items()}
        logs = blend_logs(
            {c: math.log10(r) for c, r in zip(configs, runtimes, strict=True)}, prior, weight
        )
        rec = model.recommend(workload, size)
        best = min(configs, key=lambda c: logs[c])
        assert rec.config == best
        assert rec.predicted_runtime_s == pytest.approx(10.0 ** logs[best], rel=1e-6)
        if weight == 1.0 and set(configs) <= set(prior):
            assert rec.config == pick(
                model.transfer, workload, size, allowed=configs, bandwidth=bandwidth
            )


def test_a_reweighted_model_recommends_as_a_file_carrying_that_weight(
    trained: TrainedModel, model: Model
) -> None:
    def set_weight(meta: dict[str, Any]) -> None:
        meta["transfer"]["weight"] = {"inside": 1.0, "outside": 0.2}

    carried = Model.from_onnx(edited(trained.to_onnx(), set_weight))
    again = model.reweighted({"inside": 1.0, "outside": 0.2})
    assert again.transfer_weights == carried.transfer_weights == {"inside": 1.0, "outside": 0.2}
    assert model.transfer_weights == trained.metrics["transfer"]["weight"]  # left as it was
    for workload, size in (("gemm", 80), ("stencil", 14), ("gemm", 200), ("gemm", 10)):
        mine, theirs = again.recommend(workload, size), carried.recommend(workload, size)
        # the same recommendation; only the version (the file's hash) differs
        assert mine.model_dump(exclude={"model_version"}) == theirs.model_dump(
            exclude={"model_version"}
        )
    for bad in ({"inside": 1.5}, {"middle": 0.5}):
        with pytest.raises(ValueError, match="accepted are 'inside' and 'outside'"):
            model.reweighted(bad)


def test_a_model_with_another_decide_share_decides_as_a_file_carrying_it(
    trained: TrainedModel, model: Model
) -> None:
    def set_share(meta: dict[str, Any]) -> None:
        meta["transfer"]["decide_share"] = 1.0

    carried = Model.from_onnx(edited(trained.to_onnx(), set_share))
    again = model.with_decide_share(1.0)
    assert again.decide_share == carried.decide_share == 1.0
    assert model.decide_share == trained.metadata["transfer"]["decide_share"]  # left as it was
    for workload, size in (("gemm", 80), ("gemm", 200)):
        assert again.decide_prior(workload, size) == carried.decide_prior(workload, size)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="accepted is a number between 0 and 1"):
            model.with_decide_share(bad)


def test_an_older_model_file_without_prior_or_calibration_keeps_working(
    trained: TrainedModel, measurements: list
) -> None:
    def strip(meta: dict[str, Any]) -> None:
        del meta["transfer"], meta["calibration"]

    old = Model.from_onnx(edited(trained.to_onnx(), strip))
    assert old.transfer == {} and old.calibration.tables == {}
    space = old.space_for("gemm")
    runtimes, _ = old.predict_runtimes("gemm", 80, space.configs())
    rec = old.recommend("gemm", 80)
    assert rec.config == space.configs()[int(np.argmin(runtimes))]
    assert rec.predicted_runtime_s == pytest.approx(float(runtimes.min()), rel=1e-6)
    for state in states(measurements)[::11]:
        d = old.decide(state)
        assert d.confidence == pytest.approx(max(d.alternatives.values()))


def test_an_older_file_states_good_and_a_newer_ones_moves_are_refused_in_words(
    trained: TrainedModel,
) -> None:
    def older(meta: dict[str, Any]) -> None:
        del meta["calibration_target"]

    assert Model.from_onnx(edited(trained.to_onnx(), older)).calibration_target == "good"

    def newer(meta: dict[str, Any]) -> None:
        meta["classes"] = [*meta["classes"], "RANKS_TIMES_TWO"]

    with pytest.raises(ValueError, match=r"does not know \(RANKS_TIMES_TWO; it knows RANKS_UP"):
        Model.from_onnx(edited(trained.to_onnx(), newer))


# --- the prior in decide -----------------------------------------------------------------------


def test_blended_deltas_are_the_differences_of_blend_logs() -> None:
    here, a, b, unknown = (Config(ranks=r, threads=1, tile=32) for r in (1, 2, 4, 8))
    logs = {here: 0.30, a: 0.10, b: 0.50, unknown: 0.20}
    prior = {here: 0.05, a: 0.25, b: -0.30}
    model = [logs[a] - logs[here], logs[b] - logs[here], logs[unknown] - logs[here]]
    for weight in (0.0, 0.4, 1.0):
        got = blended_deltas(model, prior, here, [a, b, unknown], weight)
        mixed = blend_logs(logs, prior, weight)
        assert got[0] == pytest.approx(mixed[a] - mixed[here], abs=1e-12)
        assert got[1] == pytest.approx(mixed[b] - mixed[here], abs=1e-12)
        assert got[2] == model[2]  # the prior does not know it: the model's difference
    assert blended_deltas(model, prior, here, [a, b, unknown], 1.0)[:2] == pytest.approx(
        [0.20, -0.35]
    )
    # a state the prior does not know: the model's differences, whatever the weight
    assert blended_deltas(model, prior, unknown, [a, b, here], 1.0) == model


def test_decide_ranks_neighbours_with_the_prior_the_file_says_it_uses(
    trained: TrainedModel, model: Model, measurements: list
) -> None:
    """The model file says how much of the transfer prior decide blends in (a share chosen in
    training); at share 0.5 a decision's runtime differences are the runtime model's with
    the prior blended at half its weight, at share 0 (older files) the model's alone."""

    def share(value: float | None) -> Callable[[dict[str, Any]], None]:
        def edit(meta: dict[str, Any]) -> None:
            # a weight the prior surely has, whatever leave-one-size-out chose on the tiny set
            meta["transfer"]["weight"] = {"inside": 1.0, "outside": 1.0}
            if value is None:
                del meta["transfer"]["decide_share"]
            else:
                meta["transfer"]["decide_share"] = value

        return edit

    assert trained.metadata["transfer"]["decide_share"] in DECIDE_SHARES
    assert trained.metrics["move_model"]["blend"]["transfer_in_decide"]["share"] == (
        model.decide_share
    )
    half = Model.from_onnx(edited(trained.to_onnx(), share(0.5)))
    plain = Model.from_onnx(edited(trained.to_onnx(), share(None)))
    assert plain.decide_share == 0.0 and plain.decide_prior("gemm", 80) is None
    differed = 0
    for state in states(measurements)[::5]:
        with_prior, alone = half.decide(state), plain.decide(state)
        space = half.space_for(state.workload)
        moves = neighbours(state.config, space)
        prior = half.transfer_prior(state.workload, state.size)
        here = math.log10(alone.predicted_runtimes_s[STOP])
        model_deltas = [math.log10(alone.predicted_runtimes_s[m]) - here for m in moves]
        expected = model_deltas
        if prior is not None:
            rel, weight, _ = prior
            targets = list(moves.values())
            expected = blended_deltas(model_deltas, rel, state.config, targets, 0.5 * weight)
        got = [math.log10(with_prior.predicted_runtimes_s[m]) - here for m in moves]
        assert got == pytest.approx(expected, abs=1e-9)
        assert with_prior.predicted_runtimes_s[STOP] == alone.predicted_runtimes_s[STOP]
        differed += with_prior.predicted_runtimes_s != alone.predicted_runtimes_s
    assert differed  # the prior moves some neighbours' predicted runtimes


# --- calibration ------------------------------------------------------------------------------


def overconfident(n: int = 2000) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    p = rng.uniform(0.3, 1.0, n)
    stop = rng.uniform(size=n) < 0.3
    truth = np.where(stop, 0.95, p**4)  # moves: right far less often than stated
    good = rng.uniform(size=n) < truth
    groups = np.arange(n) % 4
    return p, stop, good, groups


def test_isotonic_calibration_brings_the_error_down_out_of_sample() -> None:
    p, stop, good, groups = overconfident()
    calibration, report = fit_and_score(p, stop, good, groups)
    assert report["ece_before"] > 0.1
    assert report["ece_after_leave_one_size_out"] <= 0.05
    assert set(calibration.tables) == {"move", "stop"}
    moves = [calibration.confidence(v, False) for v in (0.3, 0.5, 0.7, 0.9, 1.0)]
    assert moves == sorted(moves) and moves[3] < 0.8 and moves[0] < 0.3  # 0.9 -> about 0.66
    assert calibration.confidence(0.35, True) == pytest.approx(0.95, abs=0.1)  # STOP its own


def test_calibration_round_trips_and_needs_no_sklearn_to_apply() -> None:
    p, stop, good, _ = overconfident(400)
    calibration = fit(p, stop, good)
    back = Calibration.from_dict(json.loads(json.dumps(calibration.as_dict())))
    for v in np.linspace(0.0, 1.0, 23):
        for s in (False, True):
            assert back.confidence(float(v), s) == pytest.approx(calibration.confidence(v, s))
    assert ece(np.array([1.0, 1.0]), np.array([True, False])) == pytest.approx(0.5)


def test_too_few_decisions_of_a_kind_keep_the_raw_confidence() -> None:
    p = np.linspace(0.4, 0.9, 30)
    calibration = fit(p, np.arange(30) < 5, np.ones(30, dtype=bool))
    assert set(calibration.tables) == {"move"}
    assert calibration.confidence(0.42, True) == 0.42
    assert Calibration.from_dict(None).confidence(0.7, False) == 0.7
    with pytest.raises(ValueError, match="calibration table 'other'"):
        Calibration.from_dict({"other": {"x": [0.0], "y": [1.0]}})


def test_the_trained_model_carries_its_calibration(trained: TrainedModel, model: Model) -> None:
    report = trained.metrics["move_model"]["not_slower"]
    assert report["decisions"] > 0
    # the confidence states the chance of being right unattended (issue 43), and the file
    # says so (the report keeps its historical key)
    assert report["target"] == "unattended" == model.calibration_target
    assert trained.metadata["calibration_target"] == model.describe()["confidence_means"]
    assert model.calibration.as_dict() == trained.metadata["calibration"]
    for kind, (xs, ys) in model.calibration.tables.items():
        assert list(xs) == sorted(xs) and list(ys) == sorted(ys), kind
        assert all(0.0 <= y <= 1.0 for y in ys)
