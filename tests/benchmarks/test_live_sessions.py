"""The launch-floor benchmark's small version: the paired live sessions on a known landscape,
with a scripted run function whose first launch of a configuration is lucky. Real launches are
the benchmark's (and `evaluate --live`'s, tests/e2e/test_evaluate.py)."""

from __future__ import annotations

from benchmarks.live_sessions import FLOOR, NONE, compare_floors
from hpc_ds1.evaluation.truth import TruePoint
from hpc_ds1.model.replay import SessionOutcome
from hpc_ds1.model.schema import Thresholds
from tests.evaluation.landscapes import BEST, SPACE, bowl, runtime
from tests.evaluation.scripted import Runs, Walker


class Noisy(Walker):
    thresholds = Thresholds()


FLOOR_6 = {"gemm": 0.06}


def test_each_start_runs_with_and_without_the_floor_in_turn_and_both_are_scored() -> None:
    cell = bowl()
    truth = {("gemm", 1000): {c: TruePoint(runtime(c), 0.01) for c in SPACE.configs()}}
    order: list[SessionOutcome] = []
    result = compare_floors(
        Noisy({"TILE_UP": 0.6, "RANKS_UP": 0.3, "STOP": 0.1}),
        [cell],
        truth,
        2,
        Runs(),
        FLOOR_6,
        on_session=lambda o, _: order.append(o),
    )
    # the recommendation and two seeded starts, each twice; who goes first alternates
    assert [o.policy for o in order] == [
        "model_recommend_live_launch_floor",
        "model_recommend_live",
        "model_live",
        "model_live_launch_floor",
        "model_live_launch_floor",
        "model_live",
    ]
    assert result[FLOOR]["sessions"] == result[NONE]["sessions"] == 3
    assert result["launch_spread"] == {"gemm": 0.06}
    # the bowl's steps are 30 % each, far beyond a 6 % floor: the same walk either way
    assert result["same_final_share"] == 1.0
    assert result["floor_minus_none"]["median_difference"] == 0.0


def test_the_floor_races_a_lucky_launch_that_the_runs_own_spread_would_keep() -> None:
    cell = bowl()
    truth = {("gemm", 1000): {c: TruePoint(runtime(c), 0.01) for c in SPACE.configs()}}
    # from the best (the recommendation), TILE_UP is truly 30 % slower, but its first launch
    # in each session reads 5 % faster than the start: one launch with its own 1 % spread
    # says keep; with the device's 6 % spread between launches it is raced, and lost
    slower = BEST.model_copy(update={"tile": 128})
    runs = Runs({slower: [0.95 / 1.3] + [1.0] * 20})

    def new_session(o: SessionOutcome, _: object) -> None:
        runs.calls.clear()  # each session's first launch of it is the lucky one

    result = compare_floors(
        Noisy({"TILE_UP": 0.9, "STOP": 0.1}),
        [cell],
        truth,
        0,
        runs,
        FLOOR_6,
        on_session=new_session,
    )
    floor, none = result[FLOOR], result[NONE]
    assert floor["sessions"] == none["sessions"] == 1
    assert floor["pct_median"] == 100.0 and none["pct_median"] < 80.0  # kept the lucky launch
    assert floor["runs_median"] > none["runs_median"] == 2
    assert result["same_final_share"] == 0.0
