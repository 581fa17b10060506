"""`stencil`: 3-D 7-point Jacobi on an n^3 grid (fixed boundary), SWEEPS sweeps.

Ranks own slabs of interior planes along the first axis and exchange one halo plane with each
neighbour after every sweep. `tile` blocks the middle axis so the three planes a thread reads
stay in cache while it walks its planes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
from numba import njit, prange

from hpc_ds1.workloads.base import CheckResult, RankContext, Work, Workload
from hpc_ds1.workloads.comm import SelfComm, neighbour, reduce_max, split_range
from hpc_ds1.workloads.rng import uniform_array, uniform_reference

SWEEPS = 40
SEED = 21
TOLERANCE = 1e-12
SIXTH = 1.0 / 7.0


@njit(parallel=True, fastmath=True, cache=True)
def sweep(src: np.ndarray, dst: np.ndarray, tile: int, threads: int) -> None:
    """dst = 7-point average of src on planes 1..nz-2, rows/columns 1..n-2 (edges untouched)."""
    nz, ny, nx = src.shape
    planes = nz - 2
    if planes <= 0 or ny < 3 or nx < 3:
        return
    jblocks = (ny - 2 + tile - 1) // tile
    chunks = max(1, min(threads, planes))
    for b in prange(chunks * jblocks):
        chunk = b // jblocks
        jb = b % jblocks
        i0 = 1 + chunk * planes // chunks
        i1 = 1 + (chunk + 1) * planes // chunks
        j0 = 1 + jb * tile
        j1 = min(j0 + tile, ny - 1)
        for i in range(i0, i1):
            for j in range(j0, j1):
                c = src[i, j]
                for k in range(1, nx - 1):
                    dst[i, j, k] = (
                        c[k]
                        + c[k - 1]
                        + c[k + 1]
                        + src[i - 1, j, k]
                        + src[i + 1, j, k]
                        + src[i, j - 1, k]
                        + src[i, j + 1, k]
                    ) * SIXTH


def work(n: int) -> Work:
    points = float(max(n - 2, 0)) ** 3
    return Work(
        flops=8.0 * points * SWEEPS,
        bytes_moved=16.0 * float(n) ** 3 * SWEEPS,  # read src + write dst, once per sweep
        memory_bytes=3 * 8 * n**3,
        items=points * SWEEPS,
    )


def memory(n: int, ranks: int) -> int:
    return 3 * 8 * n * n * (n + 2 * ranks)


def _init_values(n: int, g_lo: int, g_hi: int) -> np.ndarray:
    """Initial grid planes g_lo..g_hi-1 (global), values from the counter-based hash."""
    return uniform_array((g_hi - g_lo, n, n), SEED, g_lo * n * n)


@dataclass
class StencilJob:
    ctx: RankContext
    n: int
    tile: int
    g0: int  # first owned global plane
    init: np.ndarray
    a: np.ndarray
    b: np.ndarray
    result: np.ndarray | None = None

    def _exchange(self, arr: Any) -> None:
        comm = self.ctx.comm
        if isinstance(comm, SelfComm) or self.ctx.nranks == 1:
            return
        if self.ctx.gpu:
            from hpc_ds1.workloads import gpu

            gpu.stencil_exchange(comm, arr, neighbour(comm, -1), neighbour(comm, 1))
            return
        last = arr.shape[0] - 2
        down, up = neighbour(comm, -1), neighbour(comm, 1)
        comm.Sendrecv(arr[1], dest=down, recvbuf=arr[last + 1], source=up)
        comm.Sendrecv(arr[last], dest=up, recvbuf=arr[0], source=down)

    def run(self) -> None:
        src: Any = self.init
        bufs: list[Any] = [self.a, self.b]
        if self.ctx.gpu:
            from hpc_ds1.workloads import gpu

            src, bufs = gpu.stencil_buffers(self)
        for s in range(SWEEPS):
            dst = bufs[s % 2]
            if self.ctx.gpu:
                from hpc_ds1.workloads import gpu

                gpu.stencil_sweep(src, dst)
            else:
                sweep(src, dst, self.tile, numba.get_num_threads())
            self._exchange(dst)
            src = dst
        if self.ctx.gpu:
            self.result = src.copy_to_host()
        else:
            self.result = src

    def check(self) -> CheckResult:
        """Recompute small windows (at both slab edges, so halos matter) with numpy."""
        assert self.result is not None, "run() before check()"
        n, local_planes = self.n, self.a.shape[0] - 2
        error = 0.0
        if local_planes > 0 and n > 2:
            lo, hi = self.g0, self.g0 + local_planes
            mid = n // 2
            windows = [
                ((lo, min(lo + 2, hi)), (1, min(5, n - 1)), (max(1, mid - 2), min(mid + 2, n - 1))),
                ((max(hi - 2, lo), hi), (max(1, mid - 2), min(mid + 2, n - 1)), (n - 5, n - 1)),
            ]
            for window in windows:
                error = max(error, self._window_error(window))
        error = reduce_max(self.ctx.comm, error)
        ok = bool(np.isfinite(error) and error <= TOLERANCE)
        return CheckResult(ok, error, f"max |u - numpy Jacobi| on windows <= {TOLERANCE:g}")

    def _window_error(self, window: tuple[tuple[int, int], ...]) -> float:
        n = self.n
        (i0, i1), (j0, j1), (k0, k1) = ((max(lo, 1), max(hi, 1)) for lo, hi in window)
        if i1 <= i0 or j1 <= j0 or k1 <= k0:
            return 0.0
        box = [
            (max(lo - SWEEPS, 0), min(hi + SWEEPS, n)) for lo, hi in ((i0, i1), (j0, j1), (k0, k1))
        ]
        (bi0, bi1), (bj0, bj1), (bk0, bk1) = box
        ii, jj, kk = np.meshgrid(
            np.arange(bi0, bi1), np.arange(bj0, bj1), np.arange(bk0, bk1), indexing="ij"
        )
        u = uniform_reference(SEED, (ii * n + jj) * n + kk)
        for _ in range(SWEEPS):
            v = u.copy()
            v[1:-1, 1:-1, 1:-1] = (
                u[1:-1, 1:-1, 1:-1]
                + u[:-2, 1:-1, 1:-1]
                + u[2:, 1:-1, 1:-1]
                + u[1:-1, :-2, 1:-1]
                + u[1:-1, 2:, 1:-1]
                + u[1:-1, 1:-1, :-2]
                + u[1:-1, 1:-1, 2:]
            ) / 7.0
            u = v
        want = u[i0 - bi0 : i1 - bi0, j0 - bj0 : j1 - bj0, k0 - bk0 : k1 - bk0]
        assert self.result is not None
        got = self.result[i0 - self.g0 + 1 : i1 - self.g0 + 1, j0:j1, k0:k1]
        return float(np.abs(got - want).max(initial=0.0))


def prepare(ctx: RankContext, n: int, tile: int) -> StencilJob:
    g0, g1 = split_range(n - 2, ctx.nranks, ctx.rank)
    g0, g1 = g0 + 1, g1 + 1
    init = _init_values(n, g0 - 1, g1 + 1)
    return StencilJob(ctx, n, tile, g0, init, init.copy(), init.copy())


WORKLOAD = Workload(
    name="stencil",
    description=f"3-D 7-point Jacobi on an n^3 grid, {SWEEPS} sweeps, slabs with halo exchange",
    prepare=prepare,
    work=work,
    memory=memory,
    sizes=(88, 120, 160, 224, 288, 384),
    held_out=(104, 144, 192, 256, 336),
    tiles=(8, 16, 32, 64),
    default_tile=16,
    throughput_unit="GB/s",
    item_name="point-updates",
    min_size_base=2,
    min_size_per_rank=1,
    gpu_capable=True,
)
