"""label_moves on hand-made landscapes: the fastest neighbour, or STOP within the noise."""

from __future__ import annotations

from typing import Any

from hpc_ds1.model import Measurement, label_moves
from hpc_ds1.space import Config


def m(ranks: int, threads: int, runtime: float | None, **kw: Any) -> Measurement:
    status = kw.pop("status", "ok")
    return Measurement(
        workload=kw.pop("workload", "w"),
        size=kw.pop("size", 10),
        config={"ranks": ranks, "threads": threads, "tile": 1},
        status=status,
        runtime_s=runtime,
        spread=kw.pop("spread", 0.01),
        **kw,
    )


def c(ranks: int, threads: int) -> Config:
    return Config(ranks=ranks, threads=threads, tile=1)


def test_fastest_neighbour_or_stop_within_noise() -> None:
    labels = label_moves(
        [
            m(1, 1, 1.0),
            m(2, 1, 0.50),
            m(4, 1, 0.49),  # 2% better than ranks=2: inside the noise
            m(1, 2, 0.70),
            m(2, 2, 0.30),
        ]
    )
    assert labels[("w", 10, c(1, 1))] == "RANKS_UP"  # 0.50 beats THREADS_UP's 0.70
    assert labels[("w", 10, c(2, 1))] == "THREADS_UP"  # 0.30
    # ranks=2 (RANKS_DOWN) is slower; the same 4 workers as ranks=2 threads=2 are faster
    assert labels[("w", 10, c(4, 1))] == "RANKS_DOWN_THREADS_UP"
    assert labels[("w", 10, c(2, 2))] == "STOP"
    assert labels[("w", 10, c(1, 2))] == "RANKS_UP"


def test_noise_decides_stop() -> None:
    noisy = label_moves([m(1, 1, 1.0, spread=0.2), m(2, 1, 0.7, spread=0.2)])
    assert noisy[("w", 10, c(1, 1))] == "STOP"  # 30% faster but 3 sigma is ~85%
    quiet = label_moves([m(1, 1, 1.0, spread=0.01), m(2, 1, 0.7, spread=0.01)])
    assert quiet[("w", 10, c(1, 1))] == "RANKS_UP"
    assert quiet[("w", 10, c(2, 1))] == "STOP"


def test_failed_neighbours_are_never_right_and_failed_states_have_no_label() -> None:
    labels = label_moves(
        [m(1, 1, 1.0), m(2, 1, None, status="failed"), m(1, 2, 0.9, status="wrong_answer")]
    )
    assert labels == {("w", 10, c(1, 1)): "STOP"}


def test_held_out_rows_are_ignored_and_sizes_are_separate() -> None:
    labels = label_moves(
        [
            m(1, 1, 1.0),
            m(2, 1, 0.1, held_out=True),
            m(1, 1, 1.0, size=20),
            m(2, 1, 0.5, size=20),
        ]
    )
    assert labels == {
        ("w", 10, c(1, 1)): "STOP",
        ("w", 20, c(1, 1)): "RANKS_UP",
        ("w", 20, c(2, 1)): "STOP",
    }


def test_repeated_measurements_are_folded() -> None:
    labels = label_moves([m(1, 1, 1.0), m(1, 1, 1.2), m(1, 1, 0.8), m(2, 1, 0.5)])
    assert labels[("w", 10, c(1, 1))] == "RANKS_UP"
