"""Whether a process's memory costs the same from one launch to the next (issue 13's launch
effect): each of N fresh processes first touches a buffer (page faults: the guest's, and in a
VM whose host lends memory lazily, the host's too), times a random gather over it (TLB and
cache misses) and a streaming sum, then the gemm kernel at SIZE with two threads (its packing
walks B down columns). One row per process, then the rank correlation of first touch with
gather and with gemm over the processes. Each process is a launch as the runner's are: what it
meets is fixed when its memory is first touched.

It also reads how much of the gemm's three matrices the kernel backed with transparent huge
pages (AnonHugePages in /proc/self/smaps_rollup, before and after they are allocated): numpy
asks for huge pages on large arrays (madvise) and gets them only where the kernel finds free
2 MiB blocks at that moment, which can differ from launch to launch. `--no-hugepage` sets
NUMPY_MADVISE_HUGEPAGE=0 in the processes (4 KiB pages only) for a before/after.

    .venv/bin/python benchmarks/host_memory.py [--processes N] [--mb MB] [--size SIZE]
        [--no-hugepage]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Launch:
    first_touch_s: float  # np.ones over the whole buffer
    gather_s: float  # 4 million random reads from it
    stream_s: float  # one sum over it
    gemm_s: float  # median of 5 gemm calls at SIZE, two threads, tile 128
    gemm_huge_mb: float  # of the gemm's matrices, MiB backed by transparent huge pages


def anon_huge_kb() -> int:
    """AnonHugePages of this process (kB), 0 where the kernel does not report it."""
    try:
        with open("/proc/self/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def child(mb: int, size: int) -> Launch:
    from hpc_ds1.workloads.gemm_kernel import gemm

    n = mb * 1024 * 1024 // 8
    started = time.perf_counter()
    buffer = np.ones(n)
    first_touch = time.perf_counter() - started
    index = np.random.default_rng(0).integers(0, n, 4_000_000)
    started = time.perf_counter()
    buffer[index].sum()
    gather = time.perf_counter() - started
    started = time.perf_counter()
    buffer.sum()
    stream = time.perf_counter() - started
    huge_before = anon_huge_kb()
    a, b, c = np.ones((size, size)), np.ones((size, size)), np.zeros((size, size))
    gemm(a, b, c, 128)  # compiled (or loaded from numba's cache) before the timed calls
    gemm_huge_mb = max(anon_huge_kb() - huge_before, 0) / 1024
    times = []
    for _ in range(5):
        started = time.perf_counter()
        gemm(a, b, c, 128)
        times.append(time.perf_counter() - started)
    return Launch(first_touch, gather, stream, statistics.median(times), gemm_huge_mb)


def measure(processes: int, mb: int, size: int, *, hugepage: bool = True) -> list[Launch]:
    """One Launch per fresh process, one after another."""
    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    if not hugepage:
        env["NUMPY_MADVISE_HUGEPAGE"] = "0"
    rows = []
    for _ in range(processes):
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--mb", str(mb), "--size", str(size)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        rows.append(Launch(**json.loads(out.stdout.strip().splitlines()[-1])))
    return rows


def rank_correlation(x: list[float], y: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=12)
    parser.add_argument("--mb", type=int, default=256, help="buffer per process (MiB)")
    parser.add_argument("--size", type=int, default=1280, help="gemm size")
    parser.add_argument(
        "--no-hugepage", action="store_true", help="NUMPY_MADVISE_HUGEPAGE=0: 4 KiB pages only"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.mb, args.size).__dict__))
        return
    rows = measure(args.processes, args.mb, args.size, hugepage=not args.no_hugepage)
    pages = "4 KiB pages only" if args.no_hugepage else "numpy's huge-page advice on"
    print(
        f"{args.processes} processes, {args.mb} MiB first touched each, gemm {args.size}, {pages}"
    )
    for r in rows:
        print(
            f"  first touch {1e3 * r.first_touch_s:7.1f} ms  gather {1e3 * r.gather_s:6.1f} ms"
            f"  stream {1e3 * r.stream_s:5.1f} ms  gemm {1e3 * r.gemm_s:6.1f} ms"
            f"  gemm's huge pages {r.gemm_huge_mb:5.1f} MiB"
        )
    touch = [r.first_touch_s for r in rows]
    for name, other in (("gather", [r.gather_s for r in rows]), ("gemm", [r.gemm_s for r in rows])):
        print(f"  rank correlation, first touch with {name}: {rank_correlation(touch, other):+.2f}")
    huge = [r.gemm_huge_mb for r in rows]
    if len(set(huge)) > 1:
        gemm = [r.gemm_s for r in rows]
        rho = rank_correlation(huge, gemm)
        print(f"  rank correlation, gemm's huge pages with gemm: {rho:+.2f}")


if __name__ == "__main__":
    main()
