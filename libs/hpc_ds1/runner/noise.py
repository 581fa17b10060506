"""Run-to-run noise: spread of repeated timings and the threshold for "faster than noise"."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

MAD_TO_SIGMA = 1.4826
DEFAULT_K = 3.0
DEFAULT_FLOOR = 0.02


def relative_spread(times: Sequence[float]) -> float:
    """Robust relative spread (sigma estimate / median) from the median absolute deviation."""
    if len(times) < 2:
        return 0.0
    mid = statistics.median(times)
    if mid <= 0:
        return 0.0
    mad = statistics.median(abs(t - mid) for t in times)
    return MAD_TO_SIGMA * mad / mid


def coefficient_of_variation(times: Sequence[float]) -> float:
    if len(times) < 2:
        return 0.0
    mean = statistics.fmean(times)
    return statistics.stdev(times) / mean if mean > 0 else 0.0


def noise_threshold(
    spread_a: float | None,
    spread_b: float | None = None,
    *,
    k: float = DEFAULT_K,
    floor: float = DEFAULT_FLOOR,
) -> float:
    """Relative runtime difference that counts as real: k combined sigmas, at least `floor`."""
    a = spread_a or 0.0
    b = spread_a if spread_b is None else spread_b or 0.0
    return max(floor, k * (a * a + (b or 0.0) ** 2) ** 0.5)


def is_faster(
    new_runtime: float,
    new_spread: float | None,
    old_runtime: float,
    old_spread: float | None,
    *,
    k: float = DEFAULT_K,
    floor: float = DEFAULT_FLOOR,
) -> bool:
    """True when `new` beats `old` by more than the noise of the two measurements."""
    threshold = noise_threshold(new_spread, old_spread, k=k, floor=floor)
    return new_runtime < old_runtime * (1.0 - threshold)
