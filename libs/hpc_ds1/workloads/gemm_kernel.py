"""Packed, register-blocked DGEMM in numba: C = A @ B.

B is packed once per k-block into panels of NR=3 columns (each column contiguous over k), each
thread packs its MC rows of A into MR=4-row micro-panels, and a 4x3 micro-kernel keeps twelve
dot-product accumulators that LLVM vectorizes over k (fastmath allows the reassociation).
`tile` is both the k-block (KC) and the row-block (MC) size."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

MR = 4
NR = 3


@njit(fastmath=True, cache=True, inline="always")
def _micro(
    ap: np.ndarray,
    aoff: int,
    bp: np.ndarray,
    boff: int,
    kc: int,
    c: np.ndarray,
    i0: int,
    j0: int,
    m: int,
    n: int,
) -> None:
    a0 = ap[aoff : aoff + kc]
    a1 = ap[aoff + kc : aoff + 2 * kc]
    a2 = ap[aoff + 2 * kc : aoff + 3 * kc]
    a3 = ap[aoff + 3 * kc : aoff + 4 * kc]
    b0 = bp[boff : boff + kc]
    b1 = bp[boff + kc : boff + 2 * kc]
    b2 = bp[boff + 2 * kc : boff + 3 * kc]
    c00 = c01 = c02 = c10 = c11 = c12 = c20 = c21 = c22 = c30 = c31 = c32 = 0.0
    for p in range(kc):
        x0 = b0[p]
        x1 = b1[p]
        x2 = b2[p]
        y = a0[p]
        c00 += y * x0
        c01 += y * x1
        c02 += y * x2
        y = a1[p]
        c10 += y * x0
        c11 += y * x1
        c12 += y * x2
        y = a2[p]
        c20 += y * x0
        c21 += y * x1
        c22 += y * x2
        y = a3[p]
        c30 += y * x0
        c31 += y * x1
        c32 += y * x2
    acc = ((c00, c01, c02), (c10, c11, c12), (c20, c21, c22), (c30, c31, c32))
    for i in range(MR):
        if i0 + i < m:
            row = acc[i]
            for j in range(NR):
                if j0 + j < n:
                    c[i0 + i, j0 + j] += row[j]


@njit(parallel=True, fastmath=True, cache=True)
def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, tile: int) -> None:
    """c[:, :] = a @ b for C-contiguous float64 arrays; any shapes (m, k) x (k, n)."""
    m, k = a.shape
    n = b.shape[1]
    kc_blk = max(tile, 1)
    mc_blk = max(MR, (tile + MR - 1) // MR * MR)
    npan = (n + NR - 1) // NR
    nmb = (m + mc_blk - 1) // mc_blk
    for i in prange(m):
        c[i, :] = 0.0
    bp = np.zeros(npan * kc_blk * NR)
    for pc in range(0, k, kc_blk):
        kc = min(kc_blk, k - pc)
        for jp in prange(npan):
            base = jp * kc * NR
            for jj in range(NR):
                j = jp * NR + jj
                if j < n:
                    for p in range(kc):
                        bp[base + jj * kc + p] = b[pc + p, j]
                else:
                    for p in range(kc):
                        bp[base + jj * kc + p] = 0.0
        for ib in prange(nmb):
            ic = ib * mc_blk
            mc = min(mc_blk, m - ic)
            nrp = (mc + MR - 1) // MR
            ap = np.empty(nrp * kc * MR)
            for rp in range(nrp):
                base = rp * kc * MR
                for ii in range(MR):
                    i = ic + rp * MR + ii
                    if i < ic + mc:
                        for p in range(kc):
                            ap[base + ii * kc + p] = a[i, pc + p]
                    else:
                        for p in range(kc):
                            ap[base + ii * kc + p] = 0.0
            for jp in range(npan):
                for rp in range(nrp):
                    _micro(ap, rp * kc * MR, bp, jp * kc * NR, kc, c, ic + rp * MR, jp * NR, m, n)
