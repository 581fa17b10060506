"""A known landscape for replayed and live sessions: a smooth bowl over a small space, every
step away from BEST 30 % slower. Shared by the evaluation tests and tests/benchmarks."""

from __future__ import annotations

from hpc_ds1.evaluation import Cell, Point
from hpc_ds1.space import Config, ConfigSpace

SPACE = ConfigSpace.for_cpus(2, (32, 64, 128))
BEST = Config(ranks=2, threads=2, tile=64)


def runtime(c: Config) -> float:
    """A smooth bowl around BEST: every step away costs 30%."""
    steps = (
        abs(SPACE.ranks.index(c.ranks) - SPACE.ranks.index(BEST.ranks))
        + abs(SPACE.threads.index(c.threads) - SPACE.threads.index(BEST.threads))
        + abs(SPACE.tiles.index(c.tile) - SPACE.tiles.index(BEST.tile))
    )
    return 1.0 * 1.3**steps


def bowl(failed: tuple[Config, ...] = ()) -> Cell:
    points = {c: Point(runtime(c), 0.01, None) for c in SPACE.configs() if c not in failed}
    return Cell("gemm", 1000, points, frozenset(failed))
