"""`stencil`: 3-D 7-point Jacobi on an n^3 grid (fixed boundary), SWEEPS sweeps.

Ranks own slabs of interior planes along the first axis. `tile` blocks the middle axis so the
three planes a thread reads stay in cache while it walks its planes.

`block` is the temporal block: sweeps made per pass over memory and per halo exchange. With
block 0 (or 1: the kernel before the block was a knob) every sweep reads and writes the whole
grid and exchanges one halo plane with each neighbour. With block T, each rank keeps T halo
planes a side, exchanges them once every T sweeps, and makes the T sweeps as one wavefront
over its planes: plane p at sweep t as soon as planes p-1..p+1 at sweep t-1 exist, the sweeps
in between kept in three-plane rings that stay in cache. The grid crosses memory once per T
sweeps instead of T times, for two costs: the halo planes swept again on both sides
(T-1 planes a side per sweep, more ranks more of it) and one parallel region per plane and sweep
instead of one per sweep. What wins depends on the grid against the caches, the ranks and the
threads: a trade-off, not a setting that is always better."""

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
# 0: one sweep per exchange, the kernel before the block was a knob (every configuration
# recorded before it has block 0); 2 and 4 sweeps per pass. 8 was tried too: on one thread it
# tied or lost to 4 at every size tried (the rings of a large grid's planes outgrow the caches).
BLOCKS = (0, 2, 4)


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


@njit(parallel=True, fastmath=True, cache=True)
def _plane(
    below: np.ndarray, mid: np.ndarray, above: np.ndarray, out: np.ndarray, tile: int
) -> None:
    """out = one sweep of plane `mid` from its neighbours (rows and columns 0 and n-1 copied)."""
    ny, nx = mid.shape
    out[0, :] = mid[0, :]
    out[ny - 1, :] = mid[ny - 1, :]
    for j in range(ny):
        out[j, 0] = mid[j, 0]
        out[j, nx - 1] = mid[j, nx - 1]
    jblocks = (ny - 2 + tile - 1) // tile
    for jb in prange(jblocks):
        j0 = 1 + jb * tile
        j1 = min(j0 + tile, ny - 1)
        for j in range(j0, j1):
            c = mid[j]
            for k in range(1, nx - 1):
                out[j, k] = (
                    c[k]
                    + c[k - 1]
                    + c[k + 1]
                    + below[j, k]
                    + above[j, k]
                    + mid[j - 1, k]
                    + mid[j + 1, k]
                ) * SIXTH


@njit(cache=True)
def _level(
    src: np.ndarray, dst: np.ndarray, ring: np.ndarray, steps: int, t: int, p: int
) -> np.ndarray:
    """Plane p after t of `steps` sweeps: src at 0, dst at `steps`, a ring slot in between; the
    first and last planes never change within a block (a fixed boundary, or a halo edge whose
    value the next exchange replaces)."""
    if t == 0 or p == 0 or p == src.shape[0] - 1:
        return src[p]
    if t == steps:
        return dst[p]
    return ring[t - 1, p % 3]


@njit(cache=True)
def wavefront(src: np.ndarray, dst: np.ndarray, ring: np.ndarray, steps: int, tile: int) -> None:
    """dst = `steps` sweeps of src on planes 1..L-2, in one pass: at front f, sweep t of plane
    f - t + 1 for t = 1..steps (its three planes of sweep t-1 exist by then). Planes near the
    slab's ends are valid for fewer sweeps; `steps` halo planes a side keep the owned ones right.
    `ring`: (steps - 1, 3, ny, nx) scratch."""
    planes = src.shape[0]
    dst[0] = src[0]
    dst[planes - 1] = src[planes - 1]
    for front in range(1, planes - 1 + steps - 1):
        for t in range(1, steps + 1):
            p = front - t + 1
            if p < 1 or p > planes - 2:
                continue
            _plane(
                _level(src, dst, ring, steps, t - 1, p - 1),
                _level(src, dst, ring, steps, t - 1, p),
                _level(src, dst, ring, steps, t - 1, p + 1),
                _level(src, dst, ring, steps, t, p),
                tile,
            )


def effective_block(n: int, ranks: int, block: int) -> int:
    """The temporal block a job runs: at least 1, at most the thinnest slab (a rank's halo
    planes must all come from its direct neighbours)."""
    thinnest = max(1, (n - 2) // max(ranks, 1))
    return max(1, min(block, thinnest))


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
    block: int = 1  # the temporal block this job runs (effective_block)
    base: int = -1  # the global plane of local plane 0 (g0 - 1 unless block > 1)
    owned: int = -1  # owned planes
    ring: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.base < 0:
            self.base = self.g0 - 1
        if self.owned < 0:
            self.owned = self.a.shape[0] - 2

    def _exchange(self, arr: Any) -> None:
        comm = self.ctx.comm
        if isinstance(comm, SelfComm) or self.ctx.nranks == 1:
            return
        if self.ctx.gpu:
            from hpc_ds1.workloads import gpu

            gpu.stencil_exchange(comm, arr, neighbour(comm, -1), neighbour(comm, 1))
            return
        down, up = neighbour(comm, -1), neighbour(comm, 1)
        lo = self.g0 - self.base  # local index of the first owned plane
        hi = lo + self.owned
        depth = self.block
        # my first `depth` owned planes are the lower neighbour's upper halo, and the other way;
        # past either end of the slabs there is no one to hear from (MPI.PROC_NULL)
        from_up = arr[hi : hi + depth] if self.ctx.rank < self.ctx.nranks - 1 else arr[hi:hi]
        from_down = arr[lo - depth : lo] if self.ctx.rank > 0 else arr[lo:lo]
        comm.Sendrecv(arr[lo : lo + depth], dest=down, recvbuf=from_up, source=up)
        comm.Sendrecv(arr[hi - depth : hi], dest=up, recvbuf=from_down, source=down)

    def run(self) -> None:
        src: Any = self.init
        bufs: list[Any] = [self.a, self.b]
        if self.ctx.gpu:
            from hpc_ds1.workloads import gpu

            src, bufs = gpu.stencil_buffers(self)
        done, group = 0, 0
        while done < SWEEPS:
            steps = min(self.block, SWEEPS - done)
            dst = bufs[group % 2]
            if self.ctx.gpu:
                from hpc_ds1.workloads import gpu

                gpu.stencil_sweep(src, dst)
            elif steps == 1:
                sweep(src, dst, self.tile, numba.get_num_threads())
            else:
                assert self.ring is not None
                wavefront(src, dst, self.ring, steps, self.tile)
            self._exchange(dst)
            src = dst
            done += steps
            group += 1
        if self.ctx.gpu:
            self.result = src.copy_to_host()
        else:
            self.result = src

    def check(self) -> CheckResult:
        """Recompute small windows (at both slab edges, so halos matter) with numpy."""
        assert self.result is not None, "run() before check()"
        n, local_planes = self.n, self.owned
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
        u = jacobi_reference(uniform_reference(SEED, (ii * n + jj) * n + kk), SWEEPS)
        want = u[i0 - bi0 : i1 - bi0, j0 - bj0 : j1 - bj0, k0 - bk0 : k1 - bk0]
        assert self.result is not None
        got = self.result[i0 - self.base : i1 - self.base, j0:j1, k0:k1]
        return float(np.abs(got - want).max(initial=0.0))


def jacobi_reference(u: np.ndarray, sweeps: int) -> np.ndarray:
    """numpy's Jacobi, the check's reference: `sweeps` 7-point averages of u's interior (the
    outer planes, rows and columns stay)."""
    for _ in range(sweeps):
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
    return u


def prepare(ctx: RankContext, n: int, tile: int, block: int = 0) -> StencilJob:
    """Block 0 or 1: one sweep per exchange. The GPU kernel sweeps once per exchange."""
    g0, g1 = split_range(n - 2, ctx.nranks, ctx.rank)
    g0, g1 = g0 + 1, g1 + 1
    depth = 1 if ctx.gpu else effective_block(n, ctx.nranks, block)
    base = max(g0 - depth, 0)
    init = _init_values(n, base, min(g1 + depth, n))
    ring = np.zeros((depth - 1, 3, n, n)) if depth > 1 else None
    job = StencilJob(ctx, n, tile, g0, init, init.copy(), init.copy(), None, depth, base, g1 - g0)
    job.ring = ring
    return job


WORKLOAD = Workload(
    name="stencil",
    description=f"3-D 7-point Jacobi on an n^3 grid, {SWEEPS} sweeps, slabs with halo exchange",
    prepare=prepare,
    work=work,
    memory=memory,
    sizes=(88, 120, 160, 224, 288, 384),
    # the last two joined the final set on 5 Dec 2026 (evaluation.plan.FINAL_INDICES)
    held_out=(104, 144, 192, 256, 336, 128, 208),
    tiles=(8, 16, 32, 64),
    default_tile=16,
    blocks=BLOCKS,
    default_block=0,
    throughput_unit="GB/s",
    item_name="point-updates",
    min_size_base=2,
    min_size_per_rank=1,
    gpu_capable=True,
)
