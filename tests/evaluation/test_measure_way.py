"""How setup and evaluate measure (interleaved rounds in a seeded random order), and the reused
set (the "final" set before issue 43) that the development profiles leave out. No real runs: a
recording runner stands in for run_many in the interleaving tests (the real one is exercised
by tests/setup and e2e)."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

import pytest

from hpc_ds1.evaluation import EVAL_PROFILES
from hpc_ds1.evaluation.plan import REUSED_INDICES, reused_sizes
from hpc_ds1.runner import Job, RunResult
from hpc_ds1.runner.result import Status
from hpc_ds1.setup import PROFILES
from hpc_ds1.setup.interleave import (
    Interrupted,
    Window,
    chunk_rng,
    combine,
    measure_interleaved,
    round_order,
    window_schedule,
)
from hpc_ds1.setup.plan import PlannedJob
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import get_workload, list_workloads

SPACE = ConfigSpace.for_cpus(2, (32, 64))
JOBS = [PlannedJob("gemm", 256, c, 3) for c in SPACE.configs()]


class Recorder:
    """Answers every job with a time that grows with each call: a machine whose load drifts."""

    def __init__(self, fail: Config | None = None) -> None:
        self.calls: list[list[Config]] = []
        self.fail = fail
        self.clock = 0.0

    def __call__(self, jobs: Sequence[Job]) -> list[RunResult]:
        assert len({j.config.ranks for j in jobs}) == 1  # one launch: one ranks value
        assert all(j.repeats == 1 for j in jobs)
        self.calls.append([j.config for j in jobs])
        out = []
        for j in jobs:
            self.clock += 0.01
            status = Status.FAILED if j.config == self.fail else Status.OK
            t = 1.0 + self.clock
            out.append(
                RunResult(
                    workload=j.workload,
                    size=j.size,
                    config=j.config,
                    status=status,
                    runtime_s=t if status is Status.OK else None,
                    runtimes_s=(t,) if status is Status.OK else (),
                    repeats=1,
                    throughput=10.0 / t if status is Status.OK else None,
                )
            )
        return out


def test_every_configuration_once_per_round_in_a_seeded_random_order() -> None:
    first, again, other = Recorder(), Recorder(), Recorder()
    results = measure_interleaved(JOBS, random.Random(4), first)
    measure_interleaved(JOBS, random.Random(4), again)
    measure_interleaved(JOBS, random.Random(5), other)
    assert first.calls == again.calls and first.calls != other.calls
    rounds = [[c for call in first.calls[i : i + 3] for c in call] for i in (0, 3, 6)]
    ranks_values = len(SPACE.ranks)
    assert len(first.calls) == 3 * ranks_values
    for one in rounds:  # a round visits every configuration once
        assert sorted(one, key=Config.label) == sorted(SPACE.configs(), key=Config.label)
    assert rounds[0] != rounds[1] or rounds[1] != rounds[2]  # reshuffled every round
    for job, result in zip(JOBS, results, strict=True):
        assert result.config == job.config and result.repeats == 3 and result.ok
        # its three runs were taken in three different rounds, so far apart in time
        assert max(result.runtimes_s) - min(result.runtimes_s) >= 0.01 * (len(JOBS) - 1)
        assert result.runtime_s == sorted(result.runtimes_s)[1]


def test_a_failed_configuration_is_not_run_again_and_stays_failed() -> None:
    bad = JOBS[3].config
    recorder = Recorder(fail=bad)
    results = measure_interleaved(JOBS, random.Random(0), recorder)
    assert sum(c == bad for call in recorder.calls for c in call) == 1
    assert not results[3].ok and all(r.ok for i, r in enumerate(results) if i != 3)


def test_combine_recomputes_median_spread_and_throughput() -> None:
    c = JOBS[0].config
    parts = [
        RunResult(
            workload="gemm",
            size=256,
            config=c,
            status=Status.OK,
            runtime_s=t,
            runtimes_s=(t,),
            repeats=1,
            throughput=8.0 / t,
        )
        for t in (2.0, 1.0, 4.0)
    ]
    out = combine(parts)
    assert out.runtime_s == 2.0 and out.repeats == 3 and out.min_runtime_s == 1.0
    assert out.throughput == pytest.approx(4.0) and out.spread == pytest.approx(1.4826 * 1 / 2)


def test_the_order_depends_on_seed_and_chunk_only() -> None:
    a = round_order(JOBS, chunk_rng(0, "setup", "gemm", 256))
    b = round_order(JOBS, chunk_rng(0, "setup", "gemm", 256))
    c = round_order(JOBS, chunk_rng(0, "setup", "gemm", 512))
    assert a == b and a != c


def test_setup_and_evaluate_take_the_same_repeats() -> None:
    assert {p.repeats for p in PROFILES.values()} == {p.repeats for p in EVAL_PROFILES.values()}
    assert all(p.truth_repeats >= 5 for p in EVAL_PROFILES.values())


def test_the_reused_set_is_apart_from_every_development_profile() -> None:
    for name in list_workloads():
        wl = get_workload(name)
        if not wl.held_out:
            continue
        reused = set(reused_sizes(wl))
        assert len(reused) == len(REUSED_INDICES)
        for profile in ("full", "quick"):
            assert not reused & set(EVAL_PROFILES[profile].sizes(wl))
        assert set(EVAL_PROFILES["full"].sizes(wl)) | reused == set(wl.held_out)
        quick = PROFILES["quick"].sizes(wl)  # the reused set lies inside the quick range
        assert all(min(quick) < s < max(quick) for s in reused)


def test_a_stop_set_during_a_launch_starts_no_other_launch() -> None:
    stop = threading.Event()
    recorder = Recorder()

    def stopped_during_the_first_launch(jobs: Sequence[Job]) -> list[RunResult]:
        stop.set()  # Ctrl-C while this launch runs: it finishes, nothing more starts
        return recorder(jobs)

    with pytest.raises(Interrupted, match="stopped in round 1 of 3"):
        measure_interleaved(JOBS, random.Random(0), stopped_during_the_first_launch, stop)
    assert len(recorder.calls) == 1
    # not set: every round of every launch, as before
    whole = Recorder()
    measure_interleaved(JOBS, random.Random(0), whole, threading.Event())
    assert len(whole.calls) == 3 * len({c.ranks for c in SPACE.configs()})


TRUTH = [PlannedJob("gemm", 256, c, 5) for c in SPACE.configs()]


def test_a_window_schedule_holds_every_round_of_both_passes() -> None:
    before, after = window_schedule(("observed", 3), ("truth", 5), random.Random(1), split=True)
    assert sorted(before) == ["observed"] * 3 + ["truth"] * 2 and after == ["truth"] * 3
    whole, nothing = window_schedule(("observed", 3), ("truth", 5), random.Random(1), split=False)
    assert sorted(whole) == ["observed"] * 3 + ["truth"] * 5 and nothing == []
    orders = {
        tuple(window_schedule(("o", 3), ("t", 5), random.Random(seed), split=False)[0])
        for seed in range(20)
    }
    assert len(orders) > 1  # drawn, not fixed: the passes' rounds are mixed in time
    again = window_schedule(("observed", 3), ("truth", 5), random.Random(1), split=False)
    assert again == (whole, nothing)  # from the generator alone


def test_two_passes_in_one_window_share_its_time() -> None:
    """Under a load that drifts through the window, both passes' runs of a configuration
    spread over the whole of it: neither pass sits in a stretch of its own."""
    recorder = Recorder()
    rng = random.Random(3)
    window = Window({"observed": JOBS, "truth": TRUTH})
    before, after = window_schedule(
        ("observed", window.rounds("observed")), ("truth", window.rounds("truth")), rng, split=True
    )
    window.run_rounds(before, rng, recorder)
    observed = window.results("observed")  # whole once `before` ran: 3 rounds
    assert all(r.ok and r.repeats == 3 for r in observed)
    window.run_rounds(after, rng, recorder)
    truth = window.results("truth")
    assert all(r.ok and r.repeats == 5 for r in truth)
    per_round = len(SPACE.ranks)
    assert len(recorder.calls) == 8 * per_round
    # the truth pass brackets the observed one: some truth runs before its last observed run,
    # and some after
    for o, t in zip(observed, truth, strict=True):
        assert min(t.runtimes_s) < max(o.runtimes_s) < max(t.runtimes_s)
    assert window.seconds["observed"] >= 0.0 and window.seconds["truth"] >= 0.0
    # the passes apart, as before: every truth run after every observed one
    apart = Recorder()
    observed_apart = measure_interleaved(JOBS, random.Random(3), apart)
    truth_apart = measure_interleaved(TRUTH, random.Random(3), apart)
    assert min(min(t.runtimes_s) for t in truth_apart) > max(
        max(o.runtimes_s) for o in observed_apart
    )


def test_a_configuration_failed_in_one_pass_is_not_run_in_the_other() -> None:
    bad = JOBS[2].config
    recorder = Recorder(fail=bad)
    window = Window({"observed": JOBS, "truth": TRUTH})
    window.run_rounds(["truth", "observed", "truth"], random.Random(0), recorder)
    assert sum(c == bad for call in recorder.calls for c in call) == 1
    observed, truth = window.results("observed"), window.results("truth")
    assert not observed[2].ok and not truth[2].ok  # the failure that stopped it, in both
    assert observed[2].config == bad
    assert all(r.ok for i, r in enumerate(observed + truth) if i % len(JOBS) != 2)
