"""The baselines replayed on a known landscape: greedy, random, Optuna TPE, exhaustive."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from hpc_ds1.evaluation import Cell, Point, build_cells
from hpc_ds1.evaluation.landscape import nearest_size, noise_summary
from hpc_ds1.evaluation.policies import (
    exhaustive_session,
    greedy_session,
    random_session,
    tpe_session,
)
from hpc_ds1.model import Measurement, Thresholds
from hpc_ds1.model.replay import landscape_engineer, model_session
from hpc_ds1.space import STOP, Config, ConfigSpace, neighbours
from tests.evaluation.landscapes import BEST, SPACE, bowl, runtime

START = Config(ranks=1, threads=1, tile=32)


def test_exhaustive_is_the_reference() -> None:
    out = exhaustive_session(bowl(), START, SPACE)
    assert out.final == BEST and out.pct_of_best == 100.0 and out.runs == len(SPACE.configs())


def test_greedy_walks_the_bowl_to_its_bottom_and_counts_each_configuration_once() -> None:
    out = greedy_session(bowl(), START, SPACE)
    assert out.final == BEST and out.pct_of_best == 100.0
    assert 1 < out.runs < len(SPACE.configs())


def test_greedy_stops_where_no_neighbour_beats_the_noise() -> None:
    flat = Cell("gemm", 1000, {c: Point(1.0, 0.01, None) for c in SPACE.configs()}, frozenset())
    out = greedy_session(flat, START, SPACE)
    assert out.final == START and out.runs == 1 + len(neighbours(START, SPACE))


def test_random_search_spends_exactly_its_budget_and_is_seeded() -> None:
    first = random_session(bowl(), START, SPACE, 5, random.Random(7))
    again = random_session(bowl(), START, SPACE, 5, random.Random(7))
    assert first.runs == 5 and first == again
    assert 0 < first.pct_of_best <= 100


def test_tpe_is_a_real_seeded_study_within_the_budget() -> None:
    first = tpe_session(bowl(), START, SPACE, 6, seed=3)
    again = tpe_session(bowl(), START, SPACE, 6, seed=3)
    assert first.runs == 6 and first.final == again.final
    assert first.pct_of_best >= bowl().pct_of_best(START)  # the start is its first trial
    whole = tpe_session(bowl(), START, SPACE, 100, seed=3)
    assert whole.runs == len(SPACE.configs()) and whole.pct_of_best == 100.0


def test_a_failed_configuration_is_never_the_answer() -> None:
    cell = bowl(failed=(BEST,))
    assert cell.best_config != BEST and cell.pct_of_best(BEST) == 0.0
    for out in (greedy_session(cell, START, SPACE), tpe_session(cell, START, SPACE, 100, 0)):
        assert out.final != BEST and out.pct_of_best == 100.0


def m(size: int, c: Config, status: str = "ok", held_out: bool = True) -> Measurement:
    return Measurement(
        workload="gemm",
        size=size,
        config=c.model_dump(),
        status=status,
        runtime_s=runtime(c) if status == "ok" else None,
        spread=0.01,
        held_out=held_out,
    )


def test_cells_need_every_configuration_measured() -> None:
    every = [m(1000, c) for c in SPACE.configs()]
    partial = [m(2000, c) for c in SPACE.configs()[:-1]]
    broken = [m(3000, c, status="failed") for c in SPACE.configs()]
    cells, skipped = build_cells(every + partial + broken, lambda _: SPACE)
    assert [c.size for c in cells] == [1000] and cells[0].best_config == BEST
    assert len(skipped) == 2
    assert f"1 of {len(SPACE.configs())} configurations not measured" in skipped[0]
    assert "no configuration ran successfully" in skipped[1]


@pytest.mark.parametrize(
    ("size", "nearest"), [(896, 1024), (800, 768), (1000, 1024), (1800, 2048), (5000, 3584)]
)
def test_nearest_trained_size_on_a_log_scale(size: int, nearest: int) -> None:
    assert nearest_size(size, (768, 1024, 1536, 2048, 2560, 3584)) == nearest


def test_noise_ties_bound_what_any_policy_can_show() -> None:
    assert bowl().tied_with_best() == [BEST]
    flat = Cell("gemm", 1000, {c: Point(1.0, 0.05, None) for c in SPACE.configs()}, frozenset())
    assert len(flat.tied_with_best()) == len(SPACE.configs())
    summary = noise_summary([bowl(), flat])
    assert summary["tied_with_best_median"] == (1 + len(SPACE.configs())) / 2
    assert summary["spread_median"] == pytest.approx(0.03)  # half at 1 %, half at 5 %


class Asking:
    """A decider whose every proposal waits for an engineer: the same moves, in one order."""

    device_id = "d"

    def __init__(self, order: tuple[str, ...]) -> None:
        self.order = order

    def decide(self, state: Any, *, space: ConfigSpace, thresholds: Thresholds) -> Any:
        moves = {STOP, *neighbours(state.config, space)}
        feasible = {m: 0.5 - i / 10 for i, m in enumerate(self.order) if m in moves}
        choice = max(feasible, key=lambda m: feasible[m])
        return SimpleNamespace(choice=choice, alternatives=feasible, mode="confirm")


def test_the_landscape_engineer_approves_what_gains_and_a_stop_at_the_bottom() -> None:
    engineer = landscape_engineer(bowl(), SPACE)
    toward = Config(ranks=1, threads=1, tile=64)
    assert engineer(START, "TILE_UP", toward)
    assert not engineer(toward, "TILE_DOWN", START)  # 30 % slower
    assert not engineer(START, STOP, None)  # a neighbour is 30 % faster
    assert engineer(BEST, STOP, None)
    failed = bowl(failed=(toward,))
    assert not landscape_engineer(failed, SPACE)(START, "TILE_UP", toward)


def test_an_engineer_who_rejects_a_move_ends_the_session_and_a_stop_goes_on() -> None:
    # from START the decider first proposes STOP (rejected: a neighbour is faster), then a move
    # away from the bottom (rejected: the session ends where it is)
    start = Config(ranks=1, threads=1, tile=64)  # one rank and one thread short of the bottom
    decider = Asking((STOP, "TILE_DOWN", "RANKS_UP"))
    engineer = landscape_engineer(bowl(), SPACE)
    out = model_session(decider, bowl(), start, SPACE, Thresholds(), engineer=engineer)
    assert out.finish == "rejected" and out.final == start and out.runs == 1
    assert out.engineer_moves == 2 and out.engineer_rejected == 2
    approving = model_session(decider, bowl(), start, SPACE, Thresholds())
    assert approving.finish == "stop" and approving.engineer_rejected == 0
    assert approving.engineer_moves == 1  # the STOP waited, and was approved
