"""The kernels in this process (one rank, no MPI), every tile, small sizes, against references."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from hpc_ds1.workloads import RankContext, get_workload, list_workloads
from hpc_ds1.workloads.comm import SelfComm, split_range
from hpc_ds1.workloads.gemm_kernel import gemm
from hpc_ds1.workloads.rng import uniform_array, uniform_reference

SMALL = {"gemm": 70, "stencil": 13, "nbody": 45, "montecarlo": 5000}
SEEDS = {"gemm": 2048, "stencil": 160, "nbody": 4096, "montecarlo": 8_000_000}


def test_builtins_are_registered() -> None:
    assert set(SMALL) <= set(list_workloads())


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_tile_gives_a_correct_answer(name: str) -> None:
    wl = get_workload(name)
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    for tile in wl.tiles:
        job = wl.prepare(RankContext(SelfComm(), threads=2), SMALL[name], tile)
        job.run()
        job.run()  # a second (timed) run must not disturb the answer
        check = job.check()
        assert check.ok, (name, tile, check)
        assert check.error < (0.05 if name == "montecarlo" else 1e-9)  # MC: statistical


@pytest.mark.parametrize("name", sorted(SMALL))
def test_sizes_work_and_seed_examples(name: str) -> None:
    wl = get_workload(name)
    assert len(wl.sizes) == 6 and list(wl.sizes) == sorted(wl.sizes)
    assert not set(wl.sizes) & set(wl.held_out)
    low, high = wl.size_range
    assert low <= SEEDS[name] <= high
    assert all(wl.sizes[0] < h < wl.sizes[-1] for h in wl.held_out)
    small, big = wl.work(wl.sizes[0]), wl.work(wl.sizes[-1])
    assert big.items > small.items > 0
    assert big.flops > small.flops > 0
    assert wl.memory(wl.sizes[-1], 4) >= wl.memory(wl.sizes[-1], 1) > 0
    assert wl.throughput(wl.sizes[0], 1.0) > 0


@pytest.mark.parametrize(("m", "k", "n"), [(1, 1, 1), (5, 7, 11), (33, 1, 2), (100, 37, 65)])
def test_gemm_odd_shapes_match_numpy(m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * k * n)
    a, b = rng.random((m, k)), rng.random((k, n))
    c = np.empty((m, n))
    for tile in (1, 4, 32, 64):
        gemm(a, b, c, tile)
        np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)


def test_counter_rng_matches_numpy_and_any_split() -> None:
    whole = uniform_array((1000,), 5)
    np.testing.assert_array_equal(whole, uniform_reference(5, np.arange(1000)))
    parts = [
        uniform_array((hi - lo,), 5, lo) for lo, hi in (split_range(1000, 3, i) for i in range(3))
    ]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    assert 0.0 < whole.min() and whole.max() < 1.0


def test_checks_catch_wrong_answers() -> None:
    ctx = RankContext(SelfComm(), threads=1)
    job = get_workload("gemm").prepare(ctx, 40, 32)
    job.run()
    job.c[3, 5] += 1e-3  # type: ignore[attr-defined]
    assert not job.check().ok
    st = get_workload("stencil").prepare(ctx, 12, 8)
    st.run()
    st.result[1, 2, 6] += 1e-6  # type: ignore[attr-defined]
    assert not st.check().ok
    nb = get_workload("nbody").prepare(ctx, 20, 64)
    nb.run()
    nb.acc[:, 0] *= 1.01  # type: ignore[attr-defined]
    assert not nb.check().ok
    mc = get_workload("montecarlo").prepare(ctx, 4000, 256)
    mc.run()
    mc.sums = (mc.sums[0] * 1.5, mc.sums[1])  # type: ignore[attr-defined]
    assert not mc.check().ok


@pytest.mark.parametrize("block", [0, 1, 2, 3, 4, 7, 40, 64])
def test_stencil_temporal_block_is_the_same_jacobi_everywhere(block: int) -> None:
    """Every plane of the grid, not only the check's windows: the wavefront's sweeps (and a
    last, shorter block where SWEEPS is not a multiple) give numpy's Jacobi to rounding."""
    from hpc_ds1.workloads.stencil import SWEEPS, _init_values, effective_block, jacobi_reference

    n = 17
    want = jacobi_reference(_init_values(n, 0, n), SWEEPS)
    job = get_workload("stencil").prepare(RankContext(SelfComm(), threads=2), n, 8, block)
    assert job.block == effective_block(n, 1, block) == max(1, min(block, n - 2))
    job.run()
    assert job.result is not None
    np.testing.assert_allclose(job.result, want, rtol=0, atol=1e-13)
    assert job.check().ok


def test_stencil_block_is_capped_by_the_thinnest_slab() -> None:
    from hpc_ds1.workloads.stencil import effective_block

    assert effective_block(14, 4, 4) == 3  # 12 planes over 4 ranks: 3 each
    assert effective_block(100, 2, 4) == 4
    assert effective_block(100, 2, 0) == 1
