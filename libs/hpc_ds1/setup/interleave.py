"""Interleaved measurement: the timed repeats of a chunk's configurations are taken in rounds,
each round visiting every configuration once, in a random order drawn from a seeded generator.

Repeats taken back to back share the machine's load of the moment, so their spread misses the
load changes between configurations, which are what decide a comparison. In rounds, every
configuration's repeats are spread over the whole chunk's time, and its spread includes them.

One round: the ranks values in a random order, and for each one its configurations in a random
order, in one `mpiexec` launch (a launch costs about a second here, so a launch per run would
multiply the time of a setup; the ranks blocks are shuffled anew every round). Every run of a
round is one warm-up and one timed run, so a configuration's state from the run before is never
timed. `setup` and `evaluate` (both of its passes) measure this way."""

from __future__ import annotations

import random
import statistics
import threading
from collections.abc import Callable, Sequence

from hpc_ds1.runner import Job, RunResult, run_many
from hpc_ds1.runner.noise import coefficient_of_variation, relative_spread

from .plan import PlannedJob

RunMany = Callable[[Sequence[Job]], list[RunResult]]


class Interrupted(Exception):
    """The campaign was stopped (Ctrl-C) between two launches; the chunk is not recorded."""


def chunk_rng(seed: int, purpose: str, workload: str, size: int) -> random.Random:
    """The generator of one chunk's order: from the printed seed and the chunk alone, so an
    interrupted campaign draws the same order again when it resumes."""
    return random.Random(f"{seed}:{purpose}:{workload}:{size}")


def round_order(jobs: Sequence[PlannedJob], rng: random.Random) -> list[list[PlannedJob]]:
    """One round: blocks of one ranks value each (one launch), blocks and the jobs inside them
    in a random order."""
    by_ranks: dict[int, list[PlannedJob]] = {}
    for job in jobs:
        by_ranks.setdefault(job.config.ranks, []).append(job)
    blocks = [by_ranks[r] for r in sorted(by_ranks)]
    rng.shuffle(blocks)
    out = []
    for block in blocks:
        block = list(block)
        rng.shuffle(block)
        out.append(block)
    return out


def combine(results: Sequence[RunResult]) -> RunResult:
    """One configuration's rounds as one result: median and spread over every timed run.
    A failed round makes the whole configuration failed (its first failure is kept)."""
    failed = [r for r in results if not r.ok]
    if failed:
        return failed[0]
    times = [t for r in results for t in r.runtimes_s]
    median = statistics.median(times)
    first = results[0]
    throughput = (
        first.throughput * first.runtime_s / median
        if first.throughput is not None and first.runtime_s
        else None
    )
    items = (
        first.items_per_s * first.runtime_s / median
        if first.items_per_s and first.runtime_s
        else None
    )
    return first.model_copy(
        update={
            "runtime_s": median,
            "runtimes_s": tuple(times),
            "min_runtime_s": min(times),
            "spread": relative_spread(times),
            "cv": coefficient_of_variation(times),
            "repeats": len(times),
            "throughput": throughput,
            "items_per_s": items,
        }
    )


def measure_interleaved(
    jobs: Sequence[PlannedJob],
    rng: random.Random,
    run: RunMany,
    stop: threading.Event | None = None,
) -> list[RunResult]:
    """Every job's `repeats` as that many rounds (the largest `repeats` of the chunk); results
    in the order of `jobs`. A configuration that failed is not run again in later rounds.
    Once `stop` is set, no launch starts: Interrupted (a chunk takes minutes, a launch seconds)."""
    rounds = max((j.repeats for j in jobs), default=0)
    taken: dict[int, list[RunResult]] = {i: [] for i in range(len(jobs))}
    index = {id(j): i for i, j in enumerate(jobs)}
    for r in range(rounds):
        live = [j for i, j in enumerate(jobs) if r < j.repeats and all(x.ok for x in taken[i])]
        for block in round_order(live, rng):
            if stop is not None and stop.is_set():
                raise Interrupted(f"stopped in round {r + 1} of {rounds}")
            results = run(
                [Job(workload=j.workload, size=j.size, config=j.config, repeats=1) for j in block]
            )
            for job, result in zip(block, results, strict=True):
                taken[index[id(job)]].append(result)
    return [combine(taken[i]) for i in range(len(jobs))]


def run_jobs(timeout_s: float, cancel: threading.Event | None = None) -> RunMany:
    """run_many with this timeout; setting `cancel` kills the launch that runs (Cancelled)."""

    def run(jobs: Sequence[Job]) -> list[RunResult]:
        return run_many(jobs, timeout_s=timeout_s, cancel=cancel)

    return run
