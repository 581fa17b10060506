"""Kernel benchmark: each numba kernel against a baseline measured beside it, on this machine.

    .venv/bin/python benchmarks/bench_kernels.py [--quick]

gemm GFLOP/s vs numpy's BLAS (n=2048, 2 threads; target >= 30%); stencil effective GB/s vs a
threaded STREAM triad at the same thread count (160^3; target >= 60%); nbody and montecarlo
items/s at 1 and 2 threads (parallel efficiency target >= 80%); mpiexec launch overhead; JIT
cost with and without numba's on-disk cache. Best of `REPEATS` timed runs after a warm-up."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

THREADS = 2
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(THREADS))

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402

from hpc_ds1.workloads import RankContext, get_workload  # noqa: E402
from hpc_ds1.workloads.comm import SelfComm  # noqa: E402

REPEATS = 5


def best(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@njit(parallel=True, fastmath=True)
def triad(a: np.ndarray, b: np.ndarray, c: np.ndarray, s: float) -> None:
    for i in prange(a.size):
        a[i] = b[i] + s * c[i]


def kernel_time(name: str, size: int, threads: int, tile: int | None = None) -> float:
    wl = get_workload(name)
    numba.set_num_threads(threads)
    job = wl.prepare(RankContext(SelfComm(), threads), size, tile or wl.default_tile)
    seconds = best(job.run)
    assert job.check().ok, f"{name} failed its check"
    return seconds


def bench_gemm(n: int) -> None:
    """BLAS is re-measured beside every tile, so both see the same machine load."""
    numba.set_num_threads(THREADS)
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n)), rng.random((n, n))
    wl = get_workload("gemm")
    print(f"gemm n={n} threads={THREADS} (numpy BLAS measured beside each tile):")
    for tile in wl.tiles:
        blas = 2 * n**3 / best(lambda: a @ b) / 1e9
        ours = wl.throughput(n, kernel_time("gemm", n, THREADS, tile))
        pct = 100 * ours / blas
        print(f"  tile={tile:<4d} numba {ours:5.1f} GFLOP/s, BLAS {blas:5.1f}: {pct:5.1f}%")


def bench_stencil(n: int) -> None:
    numba.set_num_threads(THREADS)
    m = 20_000_000
    a, b, c = np.zeros(m), np.ones(m), np.ones(m)
    gbs = 24 * m / best(lambda: triad(a, b, c, 3.0)) / 1e9
    print(f"stencil n={n} threads={THREADS}: triad {gbs:.1f} GB/s ({m * 8 / 1e6:.0f} MB arrays)")
    wl = get_workload("stencil")
    for tile in wl.tiles:
        ours = wl.throughput(n, kernel_time("stencil", n, THREADS, tile))
        print(
            f"  numba stencil tile={tile:<3d} {ours:5.1f} GB/s = {100 * ours / gbs:5.1f}% of triad"
        )


def bench_scaling(name: str, size: int) -> None:
    wl = get_workload(name)
    items = wl.work(size).items
    t1 = kernel_time(name, size, 1)
    t2 = kernel_time(name, size, 2)
    eff = t1 / (2 * t2)
    print(
        f"{name} size={size}: {items / t1 / 1e6:.1f} M {wl.item_name}/s on 1 thread, "
        f"{items / t2 / 1e6:.1f} M/s on 2; parallel efficiency {100 * eff:.0f}%"
    )


def bench_launch() -> None:
    mpiexec = str(Path(sys.executable).with_name("mpiexec"))
    code = "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"
    for ranks in (1, 2, 4):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-c", code], check=True)
            times.append(time.perf_counter() - start)
        print(f"mpiexec -n {ranks} python (import mpi4py, barrier): {min(times):.3f} s per launch")
    from hpc_ds1.runner import run
    from hpc_ds1.space import Config

    r = run("gemm", 64, Config(ranks=2, threads=1, tile=64), repeats=1)
    print(f"runner launch to ready (2 ranks, numba + workloads imported): {r.startup_s:.3f} s")


JIT_SCRIPT = """
import time, numpy as np, numba
t = time.perf_counter()
from hpc_ds1.workloads.gemm_kernel import gemm
from hpc_ds1.workloads import stencil, nbody, montecarlo
imp = time.perf_counter() - t
out = {}
a = np.ones((8, 8)); c = np.empty((8, 8))
for name, fn in (
    ("gemm", lambda: gemm(a, a, c, 4)),
    ("stencil", lambda: stencil.sweep(np.ones((4, 4, 4)), np.ones((4, 4, 4)), 2, 1)),
    ("nbody", lambda: nbody.accelerations(np.ones((3, 4)), np.ones(4), 0, np.ones((3, 4)), 4, 0.1)),
    ("montecarlo", lambda: montecarlo.payoff_sums(0, 10, 4, 1)),
):
    t = time.perf_counter(); fn(); out[name] = time.perf_counter() - t
print(" ".join(f"{k}={v:.3f}" for k, v in out.items()))
"""


def bench_jit() -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "NUMBA_NUM_THREADS": "2"}
        for label in ("empty cache (compile)", "warm on-disk cache"):
            done = subprocess.run(
                [sys.executable, "-c", JIT_SCRIPT], env=env, capture_output=True, text=True
            )
            print(f"first call, {label}: {done.stdout.strip() or done.stderr[-300:]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args()
    quick = args.quick
    print(
        f"numba {numba.__version__}, threading layer {numba.config.THREADING_LAYER}, "
        f"{os.cpu_count()} CPUs"
    )
    bench_gemm(512 if quick else 2048)
    bench_stencil(64 if quick else 160)
    bench_scaling("nbody", 1024 if quick else 4096)
    bench_scaling("montecarlo", 1_000_000 if quick else 8_000_000)
    bench_launch()
    bench_jit()


if __name__ == "__main__":
    main()
