"""Interleaved measurement: the timed repeats of a chunk's configurations are taken in rounds,
each round visiting every configuration once, in a random order drawn from a seeded generator.

Repeats taken back to back share the machine's load of the moment, so their spread misses the
load changes between configurations, which are what decide a comparison. In rounds, every
configuration's repeats are spread over the whole chunk's time, and its spread includes them.

One round: the ranks values in a random order, and for each one its configurations in a random
order, in one `mpiexec` launch (a launch costs about a second here, so a launch per run would
multiply the time of a setup; the ranks blocks are shuffled anew every round). Every run of a
round is one warm-up and one timed run, so a configuration's state from the run before is never
timed. `setup` and `evaluate` (both of its passes) measure this way.

A window (`Window`, `window_schedule`) takes two passes over the same configurations in one
stretch of time, their rounds interleaved: `evaluate --truth-all` measures what sessions observe
and the truth pass of a size this way, so that a load that comes and goes on a shared machine
falls on both passes alike instead of on one of them."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from hpc_ds1.runner import Job, RunResult, run_many
from hpc_ds1.runner.noise import coefficient_of_variation, relative_spread
from hpc_ds1.space import Config

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


class Window:
    """Passes over one chunk's configurations whose rounds share one stretch of time.

    Each pass (a label: the purpose its measurements are recorded under) has its own jobs and
    repeats; `run_rounds` takes rounds of the passes in the order given, so the passes' rounds
    can be interleaved with each other (evaluate's observed and truth passes, `window_schedule`)
    and taken in parts with other work between them. A configuration that failed in any pass
    is not run again in later rounds of either."""

    def __init__(self, passes: Mapping[str, Sequence[PlannedJob]]) -> None:
        self.passes = {label: list(jobs) for label, jobs in passes.items()}
        self.taken: dict[str, list[list[RunResult]]] = {
            label: [[] for _ in jobs] for label, jobs in self.passes.items()
        }
        self.rounds_done = dict.fromkeys(self.passes, 0)
        self.failures: dict[Config, RunResult] = {}
        self.seconds = dict.fromkeys(self.passes, 0.0)  # time each pass's rounds took

    def rounds(self, label: str) -> int:
        """The rounds a pass takes: the largest `repeats` among its jobs."""
        return max((j.repeats for j in self.passes[label]), default=0)

    def run_rounds(
        self,
        labels: Iterable[str],
        rng: random.Random,
        run: RunMany,
        stop: threading.Event | None = None,
    ) -> None:
        """One round of each label's pass, in order. Once `stop` is set, no launch starts:
        Interrupted (a chunk takes minutes, a launch seconds)."""
        for label in labels:
            started = time.monotonic()
            r = self.rounds_done[label]
            self.rounds_done[label] = r + 1
            jobs = self.passes[label]
            index = {id(j): i for i, j in enumerate(jobs)}
            live = [j for j in jobs if r < j.repeats and j.config not in self.failures]
            for block in round_order(live, rng):
                if stop is not None and stop.is_set():
                    raise Interrupted(f"stopped in round {r + 1} of {self.rounds(label)}")
                results = run(
                    [
                        Job(workload=j.workload, size=j.size, config=j.config, repeats=1)
                        for j in block
                    ]
                )
                for job, result in zip(block, results, strict=True):
                    self.taken[label][index[id(job)]].append(result)
                    if not result.ok:
                        self.failures.setdefault(job.config, result)
            self.seconds[label] += time.monotonic() - started

    def results(self, label: str) -> list[RunResult]:
        """A pass's results in the order of its jobs; a configuration that failed before its
        first round of this pass carries the failure that stopped it."""
        return [
            combine(taken) if taken else self.failures[job.config]
            for job, taken in zip(self.passes[label], self.taken[label], strict=True)
        ]


def measure_interleaved(
    jobs: Sequence[PlannedJob],
    rng: random.Random,
    run: RunMany,
    stop: threading.Event | None = None,
) -> list[RunResult]:
    """Every job's `repeats` as that many rounds (the largest `repeats` of the chunk); results
    in the order of `jobs`. A configuration that failed is not run again in later rounds.
    Once `stop` is set, no launch starts: Interrupted."""
    window = Window({"": jobs})
    window.run_rounds([""] * window.rounds(""), rng, run, stop)
    return window.results("")


def window_schedule(
    first: tuple[str, int], second: tuple[str, int], rng: random.Random, *, split: bool
) -> tuple[list[str], list[str]]:
    """The rounds of two passes over one chunk in one window: (label, rounds) each. All of
    `first`'s rounds and, with `split`, half of `second`'s (rounded down) in a random order,
    then the rest of `second`'s: other work can run between the two parts (evaluate's live
    sessions, which need the observed pass whole) and still have `second` on both sides of it.
    Without `split`, every round in one random order and nothing after."""
    (a, a_rounds), (b, b_rounds) = first, second
    before_b = b_rounds // 2 if split else b_rounds
    before = [a] * a_rounds + [b] * before_b
    rng.shuffle(before)
    return before, [b] * (b_rounds - before_b)


def run_jobs(
    timeout_s: float | None,
    cancel: threading.Event | None = None,
    on_start: Callable[[Job], None] | None = None,
) -> RunMany:
    """run_many with this timeout (None: each workload's own); setting `cancel` kills the
    launch that runs (Cancelled); `on_start(job)` as each job starts (what is in flight)."""

    def run(jobs: Sequence[Job]) -> list[RunResult]:
        return run_many(jobs, timeout_s=timeout_s, cancel=cancel, on_start=on_start)

    return run
