"""Transfer from the trained sizes: relative runtimes interpolated in log size."""

from __future__ import annotations

import math

import pytest

from hpc_ds1.model.labels import Outcome
from hpc_ds1.model.transfer import neighbours_of, pick, predict, relative_table
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
