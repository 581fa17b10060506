"""The runtime checks, pure: a runtime faster than the device's claimed hardware could run the
declared work is refused with the numbers, one far ahead of another device's verified runtime
is refused unless its claimed hardware is that much larger, and a result far from the device's
own estimate is flagged."""

from __future__ import annotations

from typing import Any

import pytest

from hpc_ds1.fleet.plausible import (
    FLEET_FACTOR,
    MARGIN,
    Verified,
    declared_work,
    fleet_bound,
    hardware_bound,
    implausible,
    off_estimate,
    peak,
)

CPU = {"ranks": 1, "threads": 8, "tile": 64, "gpu": False}
GPU = {**CPU, "gpu": True}
BOX: dict[str, Any] = {  # 8 logical CPUs with AVX2 and FMA, one GPU
    "physical_cores": 4,
    "logical_cpus": 8,
    "simd": ["sse2", "avx", "avx2", "fma"],
    "gpus": [{"name": "Sim GPU", "memory_bytes": 2**33}],
}


def test_the_peak_is_every_cpu_at_6_ghz_with_its_widest_fma_and_a_margin() -> None:
    top = peak(BOX)
    assert top is not None
    assert top.flops == pytest.approx(8 * 6e9 * 16 * MARGIN)
    assert "8 CPUs x 6 GHz x 16 FLOP/cycle (fma)" in top.how
    wide = peak({**BOX, "simd": ["avx512f", "avx2"]})
    assert wide is not None and wide.flops == pytest.approx(2 * top.flops)
    unknown = peak({**BOX, "simd": []})  # no known flag: the widest, not the narrowest
    assert unknown is not None and unknown.flops == wide.flops
    with_gpu = peak(BOX, gpu=True)
    assert with_gpu is not None and with_gpu.flops > 100 * top.flops
    assert peak({"simd": ["avx2"]}) is None  # no CPUs claimed: not bounded


def test_1e_6_s_for_gemm_512_and_1024_is_refused_with_the_numbers() -> None:
    for size in (512, 1024):
        why = hardware_bound("gemm", size, 1e-6, BOX, CPU)
        assert why is not None
        assert why.startswith(f"1e-06 s for gemm size {size} is ")
        assert "FLOP/s, over the 3.07e+12 FLOP/s its claimed hardware could reach" in why
    # 2 * 512^3 FLOPs at that peak: 87 microseconds at the very least.
    assert "cannot take less than 8.74e-05 s" in str(hardware_bound("gemm", 512, 1e-6, BOX, CPU))


def test_real_runtimes_and_what_cannot_be_bounded_pass() -> None:
    assert hardware_bound("gemm", 512, 0.02, BOX, CPU) is None  # 13 GFLOP/s
    assert hardware_bound("gemm", 64, 0.01, BOX, CPU) is None
    assert hardware_bound("stencil", 64, 0.05, BOX, CPU) is None
    assert hardware_bound("nbody", 4096, 0.5, BOX, CPU) is None
    assert hardware_bound("gemm", 512, 1e-6, {}, CPU) is None  # no fingerprint
    assert declared_work("no-such-workload", 512) is None
    assert hardware_bound("no-such-workload", 512, 1e-9, BOX, CPU) is None
    # A GPU run may go faster than the CPUs could: 2 * 1024^3 FLOPs in 0.1 ms is 21 TFLOP/s.
    assert hardware_bound("gemm", 1024, 1e-4, BOX, CPU) is not None
    assert hardware_bound("gemm", 1024, 1e-4, BOX, GPU) is None
    # A zero runtime for declared work is never plausible.
    assert hardware_bound("gemm", 64, 0.0, BOX, CPU) is not None


def test_a_runtime_far_ahead_of_another_devices_verified_one_is_refused() -> None:
    theirs = Verified("dev-b", 1.0, CPU, BOX)
    assert fleet_bound("gemm", 1024, 1.0 / FLEET_FACTOR, BOX, CPU, theirs) is None
    why = fleet_bound("gemm", 1024, 0.01, BOX, CPU, theirs)
    assert why == (
        "0.01 s for gemm size 1024 is 100 x faster than dev-b's verified 1 s: at most 10 x is "
        "believed (10 x)"
    )
    assert fleet_bound("gemm", 1024, 0.01, BOX, CPU, None) is None  # nothing verified
    # A device that claims 16 times the CPUs may be 16 times further ahead.
    big = {**BOX, "logical_cpus": 128}
    assert fleet_bound("gemm", 1024, 0.01, big, CPU, theirs) is None
    scaled = fleet_bound("gemm", 1024, 0.005, big, CPU, theirs)
    assert scaled is not None and "at most 160 x" in scaled and "16 x for its larger" in scaled
    # implausible(): the hardware first, then the fleet.
    assert "claimed hardware" in str(implausible("gemm", 1024, 1e-6, BOX, CPU, theirs))
    assert "verified" in str(implausible("gemm", 1024, 0.01, BOX, CPU, theirs))


def test_a_result_far_from_the_devices_own_estimate_is_flagged_either_way() -> None:
    assert off_estimate(0.1, 1e-6) == (
        "ran 0.1 s, 1e+05 x slower than its own estimate of 1e-06 s (more than 4 x off)"
    )
    assert off_estimate(0.01, 0.1) is not None and "faster" in str(off_estimate(0.01, 0.1))
    assert off_estimate(0.3, 0.1) is None and off_estimate(0.03, 0.1) is None
    assert off_estimate(5.0, None) is None and off_estimate(5.0, 0.0) is None  # no estimate
