"""Counter-based random numbers: a splitmix64 hash of a global index, so values do not depend
on how work is split across ranks and threads."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange, uint64

_GOLDEN = uint64(0x9E3779B97F4A7C15)
_M1 = uint64(0xBF58476D1CE4E5B9)
_M2 = uint64(0x94D049BB133111EB)
_S30 = uint64(30)
_S27 = uint64(27)
_S31 = uint64(31)
_S11 = uint64(11)
_INV53 = 1.0 / 9007199254740992.0  # 2**-53


@njit(cache=True, inline="always")
def splitmix64(x: Any) -> Any:
    z = uint64(x) + _GOLDEN
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(cache=True, inline="always")
def uniform(seed: Any, index: Any) -> float:
    """A float in (0, 1) for counter `index` of stream `seed`."""
    h = splitmix64(uint64(seed) * _GOLDEN + uint64(index))
    return (float(h >> _S11) + 0.5) * _INV53


@njit(parallel=True, cache=True)
def fill_uniform(out: np.ndarray, seed: Any, offset: Any) -> None:
    """out.flat[i] = uniform(seed, offset + i), in parallel, for a C-contiguous array."""
    flat = out.reshape(-1)
    for i in prange(flat.size):
        flat[i] = uniform(seed, offset + i)


def uniform_array(shape: tuple[int, ...], seed: int, offset: int = 0) -> np.ndarray:
    out = np.empty(shape, dtype=np.float64)
    fill_uniform(out, np.uint64(seed), np.int64(offset))
    return out


def uniform_reference(seed: int, indices: np.ndarray) -> np.ndarray:
    """The same numbers computed with numpy only (the reference for checks)."""
    with np.errstate(over="ignore"):
        x = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + indices.astype(np.uint64)
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)
