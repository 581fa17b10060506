"""OpenMP's wait policy for launches that fit the CPUs (issue 13's noise): the runner makes
oversubscribed launches (ranks x threads > CPUs) wait passively; this measures whether a launch
of threads = CPUs should too. Each job runs under the default policy (libgomp spins at a barrier
before it sleeps) and under OMP_WAIT_POLICY=PASSIVE, the two alternated launch by launch, on
a quiet machine and beside a background process that keeps one CPU half busy in short bursts
(what the embedded services do while a setup or an evaluation measures). Prints, per job and
condition, the median of the repeats' runtimes and their spread (1.4826 MAD / median) under
each policy and the ratio default / passive. Nothing is recorded. Run, on a machine left alone:
    .venv/bin/python benchmarks/omp_wait_policy.py [--rounds 3] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hpc_ds1.machine.allocation import detect
from hpc_ds1.runner import Job, run_many
from hpc_ds1.space import Config

POLICIES = ("default", "PASSIVE")


def jobs(threads: int, repeats: int) -> list[Job]:
    def job(workload: str, size: int, tile: int, block: int = 0) -> Job:
        config = Config(ranks=1, threads=threads, tile=tile, block=block)
        return Job(workload=workload, size=size, config=config, repeats=repeats)

    return [
        job("gemm", 896, 256),
        job("gemm", 1792, 128),
        job("stencil", 160, 16),
        job("stencil", 160, 16, block=4),
        job("nbody", 2560, 64),
        job("montecarlo", 1500000, 4096),
    ]


def _bursts(stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
        time.sleep(0.002)


@contextmanager
def background(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=_bursts, args=(stop,), daemon=True)
    proc.start()
    try:
        yield
    finally:
        stop.set()
        proc.join(5)


def spread(values: list[float]) -> float:
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return 1.4826 * mad / median


def measure(
    batch: list[Job], rounds: int, conditions: tuple[str, ...] = ("quiet", "background")
) -> list[dict[str, Any]]:
    """Each job under each policy, alternated launch by launch, `rounds` launches each, in each
    condition; the user's own OMP_WAIT_POLICY is put back afterwards."""
    runs: dict[tuple[str, str, str], list[float]] = {}
    before = os.environ.get("OMP_WAIT_POLICY")
    try:
        for condition in conditions:
            with background(condition == "background"):
                for _ in range(rounds):
                    for policy in POLICIES:
                        if policy == "default":
                            os.environ.pop("OMP_WAIT_POLICY", None)
                        else:
                            os.environ["OMP_WAIT_POLICY"] = policy
                        for result in run_many(batch):
                            name = f"{result.workload} {result.size} {result.config.label()}"
                            times = runs.setdefault((condition, name, policy), [])
                            times.extend(result.runtimes_s)
    finally:
        os.environ.pop("OMP_WAIT_POLICY", None)
        if before is not None:
            os.environ["OMP_WAIT_POLICY"] = before
    rows = []
    for condition in conditions:
        for job in batch:
            name = f"{job.workload} {job.size} {job.config.label()}"
            default, passive = (runs[(condition, name, p)] for p in POLICIES)
            rows.append(
                {
                    "condition": condition,
                    "job": name,
                    "default_median_s": statistics.median(default),
                    "default_spread": spread(default),
                    "passive_median_s": statistics.median(passive),
                    "passive_spread": spread(passive),
                    "default_over_passive": statistics.median(default) / statistics.median(passive),
                    "runs": len(default),
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="launches per policy and condition")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per job and launch")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    threads = detect().usable
    started = time.monotonic()
    rows = measure(jobs(threads, args.repeats), args.rounds)
    took = time.monotonic() - started
    if args.json:
        print(json.dumps({"threads": threads, "seconds": took, "rows": rows}, indent=2))
        return 0
    print(f"threads = usable CPUs = {threads}; {args.rounds} launches x {args.repeats} repeats")
    print(f"per policy, alternated; {took:.0f} s")
    head = ("condition", "job", "default s (spread)", "passive s (spread)", "ratio")
    print(f"{head[0]:<11}{head[1]:<58}{head[2]:>22}{head[3]:>22}{head[4]:>7}")
    for r in rows:
        d = f"{r['default_median_s']:.4f} ({100 * r['default_spread']:.0f} %)"
        p = f"{r['passive_median_s']:.4f} ({100 * r['passive_spread']:.0f} %)"
        print(f"{r['condition']:<11}{r['job']:<58}{d:>22}{p:>22}{r['default_over_passive']:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
