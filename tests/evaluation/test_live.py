"""Live sessions (evaluation/live.py): the coordinator's session with every run made by a run
function, here a scripted one over a known landscape, so each run it asks for is seen; scored
on a truth pass beside the replay of the same start. Deterministic: no launches, no timings
asserted (the real launches are in tests/e2e/test_evaluate.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from hpc_ds1.evaluation import Cell
from hpc_ds1.evaluation.live import (
    LIVE_POLICY,
    LiveMeasure,
    LiveRun,
    device_runs,
    launch_spread,
    live_sessions,
    live_starts,
    live_summary,
    paired,
    run_stats,
)
from hpc_ds1.evaluation.policies import system1_answer
from hpc_ds1.evaluation.report import render_live
from hpc_ds1.evaluation.truth import TruePoint, score_sessions
from hpc_ds1.machine.devicelock import Cancelled
from hpc_ds1.model.replay import model_session
from hpc_ds1.model.schema import Measurement, Thresholds
from hpc_ds1.space import Config, ConfigSpace
from tests.evaluation.landscapes import BEST, SPACE, bowl, runtime
from tests.evaluation.scripted import Runs, Walker

START = Config(ranks=1, threads=1, tile=32)


UPHILL = {"TILE_UP": 0.6, "RANKS_UP": 0.3, "STOP": 0.1}  # from START: each a 30 % gain


def test_a_live_session_runs_every_step_and_asks_from_its_own_runtimes() -> None:
    runs = Runs()
    walker = Walker(UPHILL)
    cell = bowl()
    live = model_session(walker, cell, START, SPACE, Thresholds(), measure=_measure(cell, runs))
    replayed = model_session(Walker(UPHILL), cell, START, SPACE, Thresholds())
    # the run function answers the bowl exactly: the same walk as the replay
    assert (live.final, live.runs, live.ran) == (replayed.final, replayed.runs, replayed.ran)
    assert runs.calls == list(live.ran)  # every run the session made was a call, in order
    # asked with the session's own best runtime, not the observed pass's
    assert [s.runtime_s for s in walker.asked] == [runtime(s.config) for s in walker.asked]


def _measure(cell: Cell, runs: Runs) -> LiveMeasure:
    return LiveMeasure(cell, runs)


def test_a_race_reruns_for_real_and_a_new_launch_can_overturn_the_first() -> None:
    # the candidate's first launch is lucky (it looks 1 % faster than the incumbent, which is
    # within the noise, so the rule races); its next launches are slow: a miss, not a keep
    start = Config(ranks=2, threads=2, tile=32)  # TILE_UP -> BEST (1.3x faster in the bowl)
    lucky = {BEST: [1.287, 1.5, 1.5, 1.5]}  # x runtime(BEST) = 1.0; the start runs 1.3
    cell = bowl()
    runs = Runs(lucky)
    out = model_session(
        Walker({"TILE_UP": 0.9, "STOP": 0.1}),
        cell,
        start,
        SPACE,
        Thresholds(),
        measure=_measure(cell, runs),
    )
    assert out.final == start  # the re-runs overturned the lucky first launch
    assert runs.calls.count(BEST) >= 2 and runs.calls.count(start) >= 2  # real re-runs


def test_a_failed_start_ends_the_session_and_a_failed_move_is_not_kept() -> None:
    cell = bowl()
    failed_start = model_session(
        Walker(UPHILL), cell, START, SPACE, Thresholds(), measure=_measure(cell, Runs(fail=START))
    )
    assert (failed_start.final, failed_start.runs, failed_start.finish) == (START, 1, "failed")
    up = Config(ranks=1, threads=1, tile=64)
    out = model_session(
        Walker(UPHILL), cell, START, SPACE, Thresholds(), measure=_measure(cell, Runs(fail=up))
    )
    assert out.final != up and up in out.ran


def test_starts_are_seeded_distinct_and_measured() -> None:
    cell = bowl(failed=(BEST,))
    a, b = live_starts(cell, 4, seed=3), live_starts(cell, 4, seed=3)
    assert a == b and len(set(a)) == 4 and all(c in cell.points for c in a)
    assert live_starts(cell, 4, seed=4) != a
    assert len(live_starts(cell, 999, seed=0)) == len(cell.points)


def test_live_sessions_from_the_recommendation_and_seeded_starts_with_their_cost() -> None:
    cell = bowl()
    seen: list[tuple[Any, list[LiveRun]]] = []
    out = live_sessions(
        Walker(UPHILL), [cell], Thresholds(), 2, Runs(), on_session=lambda o, r: seen.append((o, r))
    )
    assert [o.policy for o in out] == ["model_recommend_live", "model_live", "model_live"]
    assert out[0].start == BEST and [o.start for o in out[1:]] == live_starts(cell, 2, 0)
    assert [o for o, _ in seen] == out
    for o, runs in seen:
        assert len(runs) == o.runs and o.cost_s == sum(r.seconds for r in runs)
    stats = run_stats([r for _, runs in seen for r in runs])
    assert stats["runs"] == sum(o.runs for o in out) and stats["failed_runs"] == 0
    # a recommendation that failed at this size has no session, as in the replay
    failed = bowl(failed=(BEST,))
    out = live_sessions(Walker(UPHILL), [failed], Thresholds(), 1, Runs())
    assert [o.policy for o in out] == ["model_live"]


def test_each_live_session_is_scored_beside_the_replay_of_its_start() -> None:
    cell = bowl()
    truth = {("gemm", 1000): {c: TruePoint(runtime(c), 0.01) for c in SPACE.configs()}}
    starts = live_starts(cell, 3, seed=0)
    answer = system1_answer(Walker(UPHILL), cell, SPACE, Thresholds())  # the PICK, as live
    replays = [
        model_session(Walker(UPHILL), cell, s, SPACE, Thresholds(), system1=answer)
        for s in SPACE.configs()
    ]
    live = live_sessions(Walker(UPHILL), [cell], Thresholds(), 3, Runs())
    scores = score_sessions([cell], [*replays, *live], truth)
    pairs = paired(scores)
    assert len(pairs) == 3  # the recommendation's live session has no replay here
    for a, b in pairs:
        assert a.outcome.policy == "model_live" and b.outcome.policy == "model"
        assert a.outcome.start == b.outcome.start and a.outcome.start in starts
        assert a.cost_s == a.outcome.cost_s  # measured, not modelled
    summary = live_summary(scores)
    assert summary is not None
    assert [r["policy"] for r in summary["table"]] == [LIVE_POLICY["model"]]
    row = summary["table"][0]
    assert row["same_final_share"] == 1.0  # the run function answers the bowl exactly
    assert row["live"]["pct_median"] == row["replayed"]["pct_median"]
    assert summary["live_minus_replayed"]["median_difference"] == 0.0
    assert live_summary(scores[: len(replays)]) is None  # no live session, no summary
    text = render_live(summary)
    assert "model_live (live)" in text and "live - replayed: median +0.0" in text


def test_a_workloads_launch_spread_is_the_median_of_its_training_runs() -> None:
    def m(spread: float | None, **kw: Any) -> Measurement:
        fields = {"workload": "gemm", "size": 64, "config": START.model_dump(), "status": "ok"}
        return Measurement.model_validate({**fields, "runtime_s": 1.0, "spread": spread, **kw})

    rows = [m(0.01), m(0.05), m(0.09), m(None), m(0.9, held_out=True), m(0.9, status="failed")]
    assert launch_spread(rows, "gemm") == 0.05  # held-out, failed and unknown spreads left out
    assert launch_spread(rows, "stencil") is None


def test_a_cancelled_live_evaluation_starts_no_more_launches(tmp_path: Path) -> None:
    stop = threading.Event()
    run_fn = device_runs(tmp_path, lambda w: ConfigSpace.for_device(workload=w), 60.0, stop)
    stop.set()  # Ctrl-C: `evaluate --live` sets it before asyncio waits for the thread
    with pytest.raises(Cancelled):
        run_fn("gemm", 64, Config(ranks=1, threads=1, tile=32))
