"""Rank and thread counts that are not powers of two, and the unchanged 2-CPU space."""

from __future__ import annotations

from hpc_ds1.space import Config, ConfigSpace, apply_move, counts

TILES = (32, 64, 128, 256)


def test_counts_are_powers_of_two_and_the_halving_chain() -> None:
    assert counts(96) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96)
    assert counts(128) == (1, 2, 4, 8, 16, 32, 64, 128)
    assert counts(2) == (1, 2) and counts(1) == (1,) and counts(0) == (1,)
    assert counts(6) == (1, 2, 3, 4, 6)


def test_a_96_core_node_uses_96_and_the_space_stays_small() -> None:
    space = ConfigSpace.for_cpus(96, TILES)
    assert 96 in space.threads and 96 in space.ranks and 192 in space.ranks
    assert space.contains(Config(ranks=96, threads=1, tile=64))
    assert space.contains(Config(ranks=2, threads=48, tile=64))
    assert space.contains(Config(ranks=3, threads=32, tile=64))
    cpu_pairs = {(c.ranks, c.threads) for c in space.configs()}
    # The sizes the README quotes: 96 cores 105 (ranks, threads) pairs, 128 cores 44.
    assert len(cpu_pairs) == 105
    assert len({(c.ranks, c.threads) for c in ConfigSpace.for_cpus(128, TILES).configs()}) == 44


def test_moves_step_along_the_sorted_counts() -> None:
    space = ConfigSpace.for_cpus(96, TILES)
    c = Config(ranks=1, threads=48, tile=64)
    assert apply_move(c, "THREADS_UP", space) == Config(ranks=1, threads=64, tile=64)
    assert apply_move(c, "THREADS_DOWN", space) == Config(ranks=1, threads=32, tile=64)
    c = Config(ranks=2, threads=3, tile=64)
    assert apply_move(c, "RANKS_UP", space) == Config(ranks=3, threads=3, tile=64)
    assert apply_move(c, "THREADS_DOWN", space) == Config(ranks=2, threads=2, tile=64)


def test_a_trade_takes_the_next_rank_count_that_splits_the_workers() -> None:
    space = ConfigSpace.for_cpus(96, TILES)
    up, down = "RANKS_UP_THREADS_DOWN", "RANKS_DOWN_THREADS_UP"
    c = Config(ranks=1, threads=96, tile=64)
    path = []
    while c is not None:
        path.append((c.ranks, c.threads))
        c = apply_move(c, up, space)
    # 96 workers: every rank count of the space that divides 96 into a thread count of it
    assert path == [(1, 96), (2, 48), (3, 32), (4, 24), (6, 16), (8, 12), (12, 8), (16, 6),
                    (24, 4), (32, 3), (48, 2), (96, 1)]  # fmt: skip
    assert apply_move(Config(ranks=3, threads=32, tile=64), down, space) == Config(
        ranks=2, threads=48, tile=64
    )
    # 6 workers at ranks=2 threads=3: 3 ranks of 2 threads up, 1 rank of 6 threads down
    c = Config(ranks=2, threads=3, tile=64)
    assert apply_move(c, up, space) == Config(ranks=3, threads=2, tile=64)
    assert apply_move(c, down, space) == Config(ranks=1, threads=6, tile=64)


def test_the_two_cpu_space_is_exactly_what_it_was() -> None:
    space = ConfigSpace.for_cpus(2, TILES)
    assert space.ranks == (1, 2, 4) and space.threads == (1, 2) and space.max_workers == 4
    pairs = {(c.ranks, c.threads) for c in space.configs()}
    assert pairs == {(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)}
    runnable = space.runnable()
    assert runnable.ranks == (1, 2, 4, 8) and runnable.threads == (1, 2, 4)
