"""Whether a runtime a device reports can be true, pure: what the coordinator checks before a
measurement or a task result from a remote device enters the log.

- The hardware bound: the work the workload declares for the size (hpc_ds1.workloads: FLOPs,
  bytes moved) cannot be done faster than the device's claimed hardware could at its plausible
  peak: every logical CPU at MAX_CLOCK_HZ with its widest SIMD's FMA throughput (and, for a
  gpu configuration, each GPU it claims at GPU_FLOPS), times MARGIN. Real kernels reach a
  fraction of that, so only an impossible number is refused. A workload that declares no work
  (a command workload), or a device without a fingerprint, is not bounded here.
- The fleet bound: a runtime more than FLEET_FACTOR times faster than the fastest *verified*
  runtime of another device for the same (workload, size) is refused; the factor grows with how
  much larger the device's claimed peak is than that device's (a GPU, a bigger box).
- The estimate check: a finished task whose runtime is more than OFF_ESTIMATE_FACTOR times off
  the device's own estimate (either way) is flagged; it is recorded, not refused."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

MAX_CLOCK_HZ: Final = 6.0e9  # above any CPU's boost clock
# fp64 FLOPs per cycle per core of the widest vector unit a SIMD flag implies: two FMA pipes
# (x86: AVX-512 8 lanes, AVX2/FMA 4 lanes; AVX without FMA: an add and a mul pipe; Arm: four
# 128-bit pipes on the widest cores, SVE up to 512 bits). The first flag found counts.
FLOPS_PER_CYCLE: Final = (
    ("avx512f", 32.0),
    ("sve", 32.0),
    ("fma", 16.0),
    ("avx2", 16.0),
    ("asimd", 16.0),
    ("neon", 16.0),
    ("avx", 8.0),
    ("sse2", 4.0),
)
UNKNOWN_FLOPS_PER_CYCLE: Final = 32.0  # no known flag: the widest
BYTES_PER_CYCLE: Final = 256.0  # per core: L1 loads and stores, above any DRAM or cache level
GPU_FLOPS: Final = 1.0e14  # per GPU: above any GPU's fp64 (and non-tensor fp32) peak
GPU_BYTES: Final = 2.0e13  # per GPU: above any GPU's memory (and L2) bandwidth
MARGIN: Final = 4.0  # on top of all that
FLEET_FACTOR: Final = 10.0  # faster than another device's verified runtime, at most
OFF_ESTIMATE_FACTOR: Final = 4.0  # a task's runtime against the device's own estimate


@dataclass(frozen=True)
class Peak:
    """A device's plausible peak (a bound, not a prediction) and how it was reckoned."""

    flops: float  # FLOP/s
    bytes: float  # bytes/s
    how: str


def _whole(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def peak(fingerprint: Mapping[str, Any], gpu: bool = False) -> Peak | None:
    """The device's plausible peak from its claimed fingerprint; None when it claims no CPUs
    (an unknown device: not bounded). With `gpu`, its GPUs' peaks are added."""
    cores = max(
        _whole(fingerprint.get("logical_cpus")),
        _whole(fingerprint.get("physical_cores")),
        _whole(fingerprint.get("usable_cpus")),
    )
    if cores == 0:
        return None
    simd = fingerprint.get("simd")
    flags = {str(f).lower() for f in simd} if isinstance(simd, list | tuple) else set()
    widest = next((f for f, _ in FLOPS_PER_CYCLE if f in flags), None)
    per_cycle = dict(FLOPS_PER_CYCLE)[widest] if widest else UNKNOWN_FLOPS_PER_CYCLE
    flops = cores * MAX_CLOCK_HZ * per_cycle
    moved = cores * MAX_CLOCK_HZ * BYTES_PER_CYCLE
    how = (
        f"{cores} CPUs x {MAX_CLOCK_HZ / 1e9:g} GHz x {per_cycle:g} FLOP/cycle "
        f"({widest or 'SIMD unknown'})"
    )
    gpus = fingerprint.get("gpus")
    count = len(gpus) if gpu and isinstance(gpus, list | tuple) else 0
    if count:
        flops += count * GPU_FLOPS
        moved += count * GPU_BYTES
        how += f" + {count} GPU{'s' if count > 1 else ''} x {GPU_FLOPS:.0e} FLOP/s"
    return Peak(flops * MARGIN, moved * MARGIN, f"{how}, with a margin of {MARGIN:g} x")


@functools.lru_cache(maxsize=4096)
def declared_work(workload: str, size: int) -> tuple[float, float] | None:
    """(FLOPs, bytes moved) the registered workload declares for one run at `size`; None for a
    workload unknown here or one that declares neither."""
    from hpc_ds1.workloads import UnknownWorkload, get_workload

    try:
        work = get_workload(workload).work(size)
        flops, moved = float(work.flops), float(work.bytes_moved)
    except (UnknownWorkload, ArithmeticError, ValueError, TypeError):
        return None
    flops = flops if math.isfinite(flops) and flops > 0 else 0.0
    moved = moved if math.isfinite(moved) and moved > 0 else 0.0
    return (flops, moved) if flops or moved else None


def _gpu(config: Mapping[str, Any]) -> bool:
    return bool(config.get("gpu"))


def _s(value: float) -> str:
    return f"{value:.3g} s"


def hardware_bound(
    workload: str,
    size: int,
    runtime_s: float,
    fingerprint: Mapping[str, Any],
    config: Mapping[str, Any],
) -> str | None:
    """Why `runtime_s` for (workload, size) at `config` is more than the device's claimed
    hardware could do; None when it is plausible (or cannot be bounded)."""
    work = declared_work(workload, size)
    top = peak(fingerprint, _gpu(config))
    if work is None or top is None:
        return None
    flops, moved = work
    need_flops = flops / top.flops
    need_bytes = moved / top.bytes
    if runtime_s >= max(need_flops, need_bytes):
        return None
    job = f"{workload} size {size}"
    if need_flops >= need_bytes:
        rate = f"{flops / runtime_s:.3g} FLOP/s" if runtime_s > 0 else "infinite FLOP/s"
        over = f"{top.flops:.3g} FLOP/s"
        need = need_flops
    else:
        rate = f"{moved / runtime_s:.3g} bytes/s" if runtime_s > 0 else "infinite bytes/s"
        over = f"{top.bytes:.3g} bytes/s"
        need = need_bytes
    return (
        f"{_s(runtime_s)} for {job} is {rate}, over the {over} its claimed hardware could "
        f"reach ({top.how}): it cannot take less than {_s(need)}"
    )


@dataclass(frozen=True)
class Verified:
    """Another device's fastest verified runtime of one (workload, size)."""

    device_id: str
    runtime_s: float
    config: Mapping[str, Any]
    fingerprint: Mapping[str, Any]


def fleet_bound(
    workload: str,
    size: int,
    runtime_s: float,
    fingerprint: Mapping[str, Any],
    config: Mapping[str, Any],
    fastest: Verified | None,
) -> str | None:
    """Why `runtime_s` is too far ahead of the fleet's fastest verified runtime of the job by
    another device; None when it is not (or there is none)."""
    if fastest is None or fastest.runtime_s <= 0:
        return None
    mine = peak(fingerprint, _gpu(config))
    theirs = peak(fastest.fingerprint, _gpu(fastest.config))
    bigger = mine.flops / theirs.flops if mine is not None and theirs is not None else 1.0
    allowed = FLEET_FACTOR * max(1.0, bigger)
    if runtime_s * allowed >= fastest.runtime_s:
        return None
    ratio = fastest.runtime_s / runtime_s if runtime_s > 0 else math.inf
    scaled = "" if allowed == FLEET_FACTOR else f", {bigger:.3g} x for its larger claimed peak"
    return (
        f"{_s(runtime_s)} for {workload} size {size} is {ratio:.3g} x faster than "
        f"{fastest.device_id}'s verified {_s(fastest.runtime_s)}: at most {allowed:.3g} x "
        f"is believed ({FLEET_FACTOR:g} x{scaled})"
    )


def implausible(
    workload: str,
    size: int,
    runtime_s: float,
    fingerprint: Mapping[str, Any],
    config: Mapping[str, Any],
    fastest: Verified | None = None,
) -> str | None:
    """Why the runtime cannot be true (the hardware bound, then the fleet bound); None when
    it may be."""
    return hardware_bound(workload, size, runtime_s, fingerprint, config) or fleet_bound(
        workload, size, runtime_s, fingerprint, config, fastest
    )


def off_estimate(runtime_s: float, expected_s: float | None) -> str | None:
    """Why a finished task's runtime is far from the device's own estimate (more than
    OFF_ESTIMATE_FACTOR times either way); None when it is not, or there was none."""
    if expected_s is None or expected_s <= 0 or runtime_s < 0:
        return None
    if runtime_s == 0:
        ratio = math.inf
    else:
        ratio = max(runtime_s / expected_s, expected_s / runtime_s)
    if ratio <= OFF_ESTIMATE_FACTOR:
        return None
    way = "slower" if runtime_s > expected_s else "faster"
    return (
        f"ran {_s(runtime_s)}, {ratio:.3g} x {way} than its own estimate of {_s(expected_s)} "
        f"(more than {OFF_ESTIMATE_FACTOR:g} x off)"
    )


__all__ = [
    "FLEET_FACTOR",
    "MARGIN",
    "OFF_ESTIMATE_FACTOR",
    "Peak",
    "Verified",
    "declared_work",
    "fleet_bound",
    "hardware_bound",
    "implausible",
    "off_estimate",
    "peak",
]
