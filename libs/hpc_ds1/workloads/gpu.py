# mypy: ignore-errors
# (numba.cuda intrinsics such as cuda.grid and cuda.threadIdx have no usable static types)
"""numba-cuda versions of the four kernels (imported only for gpu=True jobs).

Under NUMBA_ENABLE_CUDASIM=1 they run in numba's CUDA simulator (tiny sizes only). `tile` does
not apply on the GPU: the launch shapes below are fixed."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from numba import cuda, float64, uint64

warnings.filterwarnings("ignore", message="overflow encountered", category=RuntimeWarning)

TPB = 16  # gemm tile edge (threads per block per axis)
THREADS = 64
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


@cuda.jit
def _gemm_kernel(a: Any, b: Any, c: Any) -> None:
    sa = cuda.shared.array(shape=(TPB, TPB), dtype=float64)
    sb = cuda.shared.array(shape=(TPB, TPB), dtype=float64)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    row = cuda.blockIdx.y * TPB + ty
    col = cuda.blockIdx.x * TPB + tx
    m, k = a.shape
    n = b.shape[1]
    acc = 0.0
    for t in range((k + TPB - 1) // TPB):
        kk = t * TPB
        sa[ty, tx] = a[row, kk + tx] if row < m and kk + tx < k else 0.0
        sb[ty, tx] = b[kk + ty, col] if kk + ty < k and col < n else 0.0
        cuda.syncthreads()
        for p in range(TPB):
            acc += sa[ty, p] * sb[p, tx]
        cuda.syncthreads()
    if row < m and col < n:
        c[row, col] = acc


def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    m, n = c.shape
    if m == 0:
        return
    grid = ((n + TPB - 1) // TPB, (m + TPB - 1) // TPB)
    dc = cuda.device_array_like(c)
    _gemm_kernel[grid, (TPB, TPB)](cuda.to_device(a), cuda.to_device(b), dc)
    dc.copy_to_host(c)
    cuda.synchronize()


@cuda.jit
def _stencil_kernel(src: Any, dst: Any) -> None:
    k, j, i = cuda.grid(3)
    nz, ny, nx = src.shape
    if 1 <= i < nz - 1 and 1 <= j < ny - 1 and 1 <= k < nx - 1:
        dst[i, j, k] = (
            src[i, j, k]
            + src[i - 1, j, k]
            + src[i + 1, j, k]
            + src[i, j - 1, k]
            + src[i, j + 1, k]
            + src[i, j, k - 1]
            + src[i, j, k + 1]
        ) * (1.0 / 7.0)


def stencil_buffers(job: Any) -> tuple[Any, list[Any]]:
    cached = getattr(job, "gpu_buffers", None)
    if cached is None:
        cached = (cuda.to_device(job.init), [cuda.to_device(job.a), cuda.to_device(job.b)])
        job.gpu_buffers = cached
    return cached[0], list(cached[1])


# threads per block along x (the contiguous axis), y, z: a warp spans 32 consecutive points of
# a row, so its loads coalesce; on an H200 at 384^3 one sweep took 0.281 ms against 0.327 with
# (8, 8, 4), within 0.3 % of the best of six shapes (docs/gpu.md, benchmarks/gpu_check.py)
STENCIL_BLOCK = (32, 8, 1)


def stencil_sweep(src: Any, dst: Any, block: tuple[int, int, int] = STENCIL_BLOCK) -> None:
    nz, ny, nx = src.shape
    grid = tuple((d + s - 1) // s for d, s in zip((nx, ny, nz), block, strict=True))
    _stencil_kernel[grid, block](src, dst)
    cuda.synchronize()


def stencil_exchange(comm: Any, arr: Any, down: int, up: int) -> None:
    last = arr.shape[0] - 2
    send_up = arr[last].copy_to_host()
    send_down = arr[1].copy_to_host()
    from_up = np.empty_like(send_up)
    from_down = np.empty_like(send_down)
    comm.Sendrecv(send_down, dest=down, recvbuf=from_up, source=up)
    comm.Sendrecv(send_up, dest=up, recvbuf=from_down, source=down)
    from mpi4py import MPI

    if up != MPI.PROC_NULL:
        arr[last + 1].copy_to_device(from_up)
    if down != MPI.PROC_NULL:
        arr[0].copy_to_device(from_down)


@cuda.jit
def _nbody_kernel(pos: Any, mass: Any, lo: int, acc: Any, eps2: float) -> None:
    i = cuda.grid(1)
    n = pos.shape[1]
    if i < acc.shape[1]:
        xi = pos[0, lo + i]
        yi = pos[1, lo + i]
        zi = pos[2, lo + i]
        sx = 0.0
        sy = 0.0
        sz = 0.0
        for j in range(n):
            dx = pos[0, j] - xi
            dy = pos[1, j] - yi
            dz = pos[2, j] - zi
            r2 = dx * dx + dy * dy + dz * dz + eps2
            inv = 1.0 / math.sqrt(r2)
            s = mass[j] * inv * inv * inv
            sx += dx * s
            sy += dy * s
            sz += dz * s
        acc[0, i] = sx
        acc[1, i] = sy
        acc[2, i] = sz


def nbody_accelerations(
    pos: np.ndarray, mass: np.ndarray, lo: int, acc: np.ndarray, eps2: float
) -> None:
    nloc = acc.shape[1]
    if nloc == 0:
        return
    dacc = cuda.device_array_like(acc)
    blocks = (nloc + THREADS - 1) // THREADS
    _nbody_kernel[blocks, THREADS](cuda.to_device(pos), cuda.to_device(mass), lo, dacc, eps2)
    dacc.copy_to_host(acc)
    cuda.synchronize()


@cuda.jit(device=True)
def _uniform(seed: Any, index: Any) -> float:
    z = uint64(seed) * uint64(_GOLDEN) + uint64(index) + uint64(_GOLDEN)
    z = (z ^ (z >> uint64(30))) * uint64(_M1)
    z = (z ^ (z >> uint64(27))) * uint64(_M2)
    z = z ^ (z >> uint64(31))
    return (float(z >> uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)


@cuda.jit
def _mc_kernel(start: int, count: int, seed: int, params: Any, sums: Any, squares: Any) -> None:
    tid = cuda.grid(1)
    stride = cuda.gridsize(1)
    s = 0.0
    q = 0.0
    for t in range(tid, count, stride):
        idx = start + t
        u1 = _uniform(seed, 2 * idx)
        u2 = _uniform(seed, 2 * idx + 1)
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
        p = max(params[0] * math.exp(params[2] + params[3] * z) - params[1], 0.0)
        s += p
        q += p * p
    sums[tid] = s
    squares[tid] = q


def montecarlo_sums(
    start: int, count: int, seed: int, option: tuple[float, float, float, float]
) -> tuple[float, float]:
    """`option`: the spot, strike, drift and volatility (the CPU kernel's, montecarlo.py)."""
    if count <= 0:
        return 0.0, 0.0
    blocks = max(1, min((count + THREADS - 1) // THREADS, 1024))
    params = cuda.to_device(np.array(option))
    sums = cuda.device_array(blocks * THREADS)
    squares = cuda.device_array(blocks * THREADS)
    _mc_kernel[blocks, THREADS](start, count, seed, params, sums, squares)
    cuda.synchronize()
    return float(sums.copy_to_host().sum()), float(squares.copy_to_host().sum())
