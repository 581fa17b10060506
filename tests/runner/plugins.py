"""Plug-in workloads defined outside the package, for the runner tests (imported by the ranks
through their module path, exactly as a third-party workload would be)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpc_ds1.workloads import CheckResult, RankContext, Work, Workload
from hpc_ds1.workloads.comm import reduce_sum, split_range


@dataclass
class VectorSum:
    ctx: RankContext
    n: int
    tile: int
    total: float = 0.0

    def run(self) -> None:
        lo, hi = split_range(self.n, self.ctx.nranks, self.ctx.rank)
        local = float(np.arange(lo, hi, dtype=np.float64).sum())
        self.total = float(reduce_sum(self.ctx.comm, local))

    def check(self) -> CheckResult:
        want = self.n * (self.n - 1) / 2
        return CheckResult(self.total == want, abs(self.total - want), "sum of 0..n-1")


def _prepare_sum(ctx: RankContext, n: int, tile: int) -> VectorSum:
    return VectorSum(ctx, n, tile)


def _work(n: int) -> Work:
    return Work(flops=float(n), bytes_moved=8.0 * n, memory_bytes=8 * n, items=float(n))


def _memory(n: int, ranks: int) -> int:
    return 8 * n


VECTOR_SUM = Workload(
    name="test-vector-sum",
    description="sum of 0..n-1 split over ranks",
    prepare=_prepare_sum,
    work=_work,
    memory=_memory,
    sizes=(10, 20, 40, 80, 160, 320),
    held_out=(30,),
    tiles=(1, 2),
    default_tile=1,
)


@dataclass
class Hang:
    ctx: RankContext

    def run(self) -> None:
        time.sleep(3600)

    def check(self) -> CheckResult:
        return CheckResult(True, 0.0)


def _prepare_hang(ctx: RankContext, n: int, tile: int) -> Hang:
    pid_dir = os.environ.get("HPCDS1_TEST_PID_DIR")
    if pid_dir:
        Path(pid_dir, f"{os.getpid()}.pid").write_text(str(os.getpid()))
    return Hang(ctx)


HANG = Workload(
    name="test-hang",
    description="never finishes",
    prepare=_prepare_hang,
    work=_work,
    memory=_memory,
    sizes=(1, 2, 3, 4, 5, 6),
    held_out=(),
    tiles=(1,),
    default_tile=1,
)


def _prepare_broken(ctx: RankContext, n: int, tile: int) -> VectorSum:
    if ctx.rank == ctx.nranks - 1:
        raise RuntimeError("broken on purpose")
    return VectorSum(ctx, n, tile)


BROKEN = Workload(
    name="test-broken",
    description="raises on the last rank",
    prepare=_prepare_broken,
    work=_work,
    memory=_memory,
    sizes=(1, 2, 3, 4, 5, 6),
    held_out=(),
    tiles=(1,),
    default_tile=1,
)


@dataclass
class Liar(VectorSum):
    def check(self) -> CheckResult:
        return CheckResult(False, 1.0, "always wrong")


def _prepare_liar(ctx: RankContext, n: int, tile: int) -> Liar:
    return Liar(ctx, n, tile)


LIAR = Workload(
    name="test-liar",
    description="its check always fails",
    prepare=_prepare_liar,
    work=_work,
    memory=_memory,
    sizes=(1, 2, 3, 4, 5, 6),
    held_out=(),
    tiles=(1,),
    default_tile=1,
)


@dataclass
class JittedDot:
    """np.dot inside a jitted kernel: numba calls BLAS (through scipy) for it."""

    ctx: RankContext
    a: np.ndarray
    kernel: Callable[[np.ndarray, np.ndarray], float]
    got: float = 0.0

    def run(self) -> None:
        self.got = float(self.kernel(self.a, self.a))

    def check(self) -> CheckResult:
        want = float(self.a @ self.a)
        return CheckResult(abs(self.got - want) <= 1e-9 * want, abs(self.got - want))


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    return np.dot(a, b)


def _prepare_dot(ctx: RankContext, n: int, tile: int) -> JittedDot:
    from numba import njit  # in the rank, as a plug-in's kernel would be

    return JittedDot(ctx, np.arange(1, n + 1, dtype=np.float64), njit(_dot))


JITTED_DOT = Workload(
    name="test-jitted-dot",
    description="np.dot in a numba kernel (BLAS)",
    prepare=_prepare_dot,
    work=_work,
    memory=_memory,
    sizes=(10, 20, 40, 80, 160, 320),
    held_out=(),
    tiles=(1,),
    default_tile=1,
)
