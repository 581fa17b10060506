"""Transfer from the trained sizes: relative runtimes interpolated in log size."""

from __future__ import annotations

import math

import pytest

from hpc_ds1.model.labels import Outcome
from hpc_ds1.model.transfer import (
    BANDWIDTHS,
    choose_bandwidth,
    neighbours_of,
    pick,
    predict,
    relative_table,
    smooth_sizes,
)
from hpc_ds1.space import Config

A = Config(ranks=1, threads=2, tile=32)
B = Config(ranks=2, threads=1, tile=32)
C = Config(ranks=4, threads=1, tile=32)


def ok(t: float) -> Outcome:
    return Outcome(True, t, 0.01, None)


def table() -> dict:
    # At 100, A is best; at 400, C is best; B is second at both ends and best in between.
    return relative_table(
        {
            ("w", 100, A): ok(1.0),
            ("w", 100, B): ok(1.1),
            ("w", 100, C): ok(1.6),
            ("w", 400, A): ok(16.0),
            ("w", 400, B): ok(11.0),
            ("w", 400, C): ok(10.0),
            ("w", 400, Config(ranks=8, threads=1, tile=32)): Outcome(False, None, None, None),
        }
    )


def test_relative_runtimes_are_centred_per_size_and_failed_runs_left_out() -> None:
    t = table()
    for size in (100, 400):
        assert sum(t["w"][size].values()) == pytest.approx(0.0)
    assert Config(ranks=8, threads=1, tile=32) not in t["w"][400]
    assert t["w"][100][B] - t["w"][100][A] == pytest.approx(math.log(1.1))


def test_weights_are_linear_in_log_size_and_clamped_outside() -> None:
    assert neighbours_of(200, [100, 400]) == [(100, pytest.approx(0.5)), (400, pytest.approx(0.5))]
    assert neighbours_of(50, [100, 400]) == [(100, 1.0)]
    assert neighbours_of(800, [100, 400]) == [(400, 1.0)]
    assert neighbours_of(400, [100, 400, 1600]) == [(400, 1.0)]
    with pytest.raises(ValueError, match="no trained size"):
        neighbours_of(5, [])


def test_interpolation_finds_the_crossover_that_neither_neighbour_has() -> None:
    t = table()
    assert pick(t, "w", 110, "interpolated") == A  # near the small end
    assert pick(t, "w", 200, "interpolated") == B  # in between: neither end's best
    assert pick(t, "w", 380, "interpolated") == C
    assert pick(t, "w", 200, "nearest") in (A, C)  # the nearest size's best only
    assert pick(t, "w", 200, "interpolated", allowed=[A, C]) in (A, C)
    assert pick(t, "w", 200, "interpolated", allowed=[]) is None
    mid = predict(t, "w", 200)
    assert set(mid) == {A, B, C}


def test_an_unknown_workload_or_method_is_refused() -> None:
    with pytest.raises(ValueError, match="no trained size of 'x'"):
        predict(table(), "x", 100)
    with pytest.raises(ValueError, match="accepted are 'nearest' and 'interpolated'"):
        predict(table(), "w", 100, "cubic")  # type: ignore[arg-type]


def test_smoothing_keeps_a_trend_that_is_linear_in_log_size_and_damps_noise() -> None:
    sizes = [100, 200, 400, 800, 1600]
    # A's relative runtime falls linearly in ln size; B's is flat with one noisy size
    linear = {s: {A: 0.1 - 0.05 * math.log(s / 100), B: 0.0} for s in sizes}
    linear[400][B] = 0.08  # a lucky-unlucky measurement at one size
    out = smooth_sizes(linear, 0.6)
    assert set(out) == set(linear) and all(set(out[s]) == {A, B} for s in sizes)
    for s in sizes:  # a local-linear fit reproduces a straight line exactly
        assert out[s][A] == pytest.approx(linear[s][A], abs=1e-12)
    assert 0.0 < out[400][B] < 0.04  # the outlier pulled towards its neighbours
    assert smooth_sizes(linear, 0.0) == linear  # 0: as measured
    with pytest.raises(ValueError, match="bandwidth"):
        smooth_sizes(linear, -1.0)


def test_smoothing_uses_only_the_sizes_where_a_configuration_ran() -> None:
    sizes = {100: {A: 0.2, B: -0.2}, 200: {A: 0.2}, 400: {A: 0.2, B: -0.1}}
    out = smooth_sizes(sizes, 10.0)
    assert set(out[200]) == {A}  # B did not run at 200: still absent there
    assert out[100][B] == pytest.approx(-0.2) and out[400][B] == pytest.approx(-0.1)  # a line
    # predict smooths first: B ran at 100 and 400 only, so it is never picked between them
    assert B not in predict({"w": sizes}, "w", 150, bandwidth=10.0)


def noisy(seed: int, sizes: list[int]) -> dict:
    """A truly 3 % faster than B at every size, each measured with a 3 % spread."""
    import random

    rng = random.Random(seed)
    return {
        ("w", s, c): ok(s * level * math.exp(rng.gauss(0.0, 0.03)))
        for s in sizes
        for c, level in ((A, 1.0), (B, 1.03), (C, 1.5))
    }


SIZES = [100, 141, 200, 283, 400, 566, 800]


def test_smoothing_finds_the_truly_fastest_more_often_than_each_size_alone() -> None:
    raw_right = smoothed_right = 0
    for seed in range(50):
        t = relative_table(noisy(seed, SIZES))["w"]
        sm = smooth_sizes(t, 0.6)
        raw_right += sum(min(t[s], key=t[s].__getitem__) == A for s in SIZES)
        smoothed_right += sum(min(sm[s], key=sm[s].__getitem__) == A for s in SIZES)
    # 50 landscapes x 7 sizes: each size alone is right about 78 % of the time (the noise swaps
    # A and B), smoothed about 90 %
    assert smoothed_right >= raw_right + 0.05 * 50 * len(SIZES)


def test_the_bandwidth_is_chosen_on_left_out_sizes() -> None:
    outcomes = noisy(7, SIZES)
    measured = {k: o.runtime_s for k, o in outcomes.items()}
    choice = choose_bandwidth(relative_table(outcomes), measured)
    assert choice["folds"] == len(SIZES)
    rows = {r["bandwidth"]: r["pct_of_best"] for r in choice["by_bandwidth"]}
    assert set(rows) == set(BANDWIDTHS)
    assert choice["bandwidth"] == max(rows, key=lambda h: (rows[h], -h))  # highest, then smaller
    # without noise every bandwidth picks the best: the tie goes to 0, the table as measured
    clean = {("w", s, c): ok(s * level) for s in SIZES for c, level in ((A, 1.0), (B, 1.03))}
    calm = choose_bandwidth(relative_table(clean), {k: o.runtime_s for k, o in clean.items()})
    assert calm["bandwidth"] == 0.0
    assert all(r["pct_of_best"] == pytest.approx(100.0) for r in calm["by_bandwidth"])
    assert choose_bandwidth({}, {})["bandwidth"] == 0.0  # nothing to choose on
