"""The PICK in a replayed session, as the coordinator runs it: System 1's configuration once
where the session would end (the model's STOP, no untried move, two misses in a row) and
System 1 predicts it clearly faster than the best so far."""

from __future__ import annotations

from typing import Any

from hpc_ds1.model.replay import model_session
from hpc_ds1.model.schema import Thresholds
from hpc_ds1.space import STOP, Config
from tests.evaluation.landscapes import BEST, SPACE, bowl, runtime
from tests.evaluation.scripted import Scripted


def system1(pick: Config) -> dict[str, Any]:
    predicted = {c.label(): runtime(c) for c in SPACE.configs()}  # the bowl, exactly
    return {
        "config": pick.model_dump(),
        "confidence": 0.9,
        "mode": "auto",
        "predicted_runtimes_s": predicted,
    }


START = Config(ranks=1, threads=1, tile=32)


def test_a_session_that_would_stop_runs_system1_once_and_keeps_it_when_faster() -> None:
    stopper = Scripted({STOP: 1.0})
    before = model_session(stopper, bowl(), START, SPACE, Thresholds())
    assert (before.final, before.runs, before.finish) == (START, 1, "stop")
    after = model_session(stopper, bowl(), START, SPACE, Thresholds(), system1=system1(BEST))
    # the PICK ran and was kept; the next STOP finds it used: once a session
    assert (after.final, after.runs, after.finish) == (BEST, 2, "stop")
    assert after.ran == (START, BEST)
    # predicted 3.7 times faster: a gate above that offers nothing
    gated = model_session(
        stopper, bowl(), START, SPACE, Thresholds(), system1=system1(BEST), pick_gain=3.0
    )
    assert (gated.final, gated.runs) == (START, 1)


def test_two_misses_in_a_row_run_system1_before_the_session_ends() -> None:
    start = Config(ranks=2, threads=2, tile=128)  # one step from BEST
    away = Scripted({"RANKS_DOWN": 0.5, "THREADS_DOWN": 0.4, STOP: 0.1})  # each 30 % slower
    before = model_session(away, bowl(), start, SPACE, Thresholds())
    assert (before.final, before.runs, before.finish) == (start, 3, "two_misses")
    after = model_session(away, bowl(), start, SPACE, Thresholds(), system1=system1(BEST))
    # two misses, the PICK kept, two more misses from BEST, and no second PICK
    assert (after.final, after.runs, after.finish) == (BEST, 6, "two_misses")
    assert after.ran[3] == BEST
    only_stop = model_session(
        away, bowl(), start, SPACE, Thresholds(), system1=system1(BEST), pick_after_misses=False
    )
    assert (only_stop.final, only_stop.runs) == (start, 3)
