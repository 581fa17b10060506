"""The session rules as pure functions over events."""

from __future__ import annotations

from hpc_ds1.events import (
    SessionFinished,
    SessionMoveDecided,
    SessionMoveResolved,
    SessionPaused,
    SessionResumed,
    SessionStarted,
    SessionStepRun,
)
from hpc_ds1.tuning.session import choose_move, replay, resolve

A = {"ranks": 1, "threads": 1, "tile": 32}
B = {"ranks": 1, "threads": 2, "tile": 32}


def started() -> list:
    return [
        (1, SessionStarted(session_id="s", device_id="d", workload="gemm", size=64, start=A)),
        (
            2,
            SessionStepRun(
                session_id="s", step=0, config=A, status="ok", runtime_s=1.0, spread=0.01
            ),
        ),
    ]


def decided(
    step: int, move: str, mode: str = "auto", config: dict | None = None
) -> SessionMoveDecided:
    return SessionMoveDecided(
        session_id="s",
        step=step,
        decision_id=f"d{step}",
        move=move,
        confidence=0.9,
        mode=mode,
        config=config or A,
    )


def with_run(run: SessionStepRun, *more: SessionStepRun) -> list:
    events = [*started(), (3, decided(1, "THREADS_UP"))]
    return events + [(4 + i, r) for i, r in enumerate([run, *more])]


def step_run(step: int, config: dict, runtime: float, race: str | None = None) -> SessionStepRun:
    """A run of THREADS_UP's session at `step` (a race's re-runs each have their own step)."""
    return SessionStepRun(
        session_id="s",
        step=step,
        move="THREADS_UP",
        config=config,
        status="ok",
        runtime_s=runtime,
        spread=0.01,
        race=race,  # type: ignore[arg-type]
    )


def test_a_faster_move_beyond_the_noise_is_kept_a_tie_races_and_a_failure_is_a_miss() -> None:
    faster = SessionStepRun(
        session_id="s", step=1, config=B, status="ok", runtime_s=0.5, spread=0.01
    )
    within_noise = faster.model_copy(update={"runtime_s": 0.99})
    failed = faster.model_copy(update={"status": "wrong_answer", "runtime_s": 0.1})
    kept = resolve(replay(with_run(faster)))
    assert (kept.kept, kept.misses, kept.race) == (True, 0, None)
    tie = resolve(replay(with_run(within_noise)))
    assert (tie.kept, tie.misses, tie.race) == (False, 0, "incumbent")  # race, not a miss
    lost = resolve(replay(with_run(failed)))
    assert (lost.kept, lost.misses, lost.race) == (False, 1, None)


def test_a_race_runs_incumbent_then_candidate_and_its_runs_decide() -> None:
    steps = iter(range(1, 100))

    def run(config: dict, runtime: float, race: str | None = None) -> SessionStepRun:
        return step_run(next(steps), config, runtime, race)  # every run its own step

    first = run(B, 0.985)
    assert resolve(replay(with_run(first))).race == "incumbent"
    half = resolve(replay(with_run(first, run(A, 1.0, "incumbent"))))
    assert half.race == "candidate"  # a pair is finished before it is judged
    # three pairs in which the candidate is steadily 1.5 % faster: kept
    pairs = [run(A, 1.0, "incumbent"), run(B, 0.985, "candidate")] * 3
    state = replay(with_run(first, *pairs))
    done = resolve(state)
    assert done.kept and done.race is None and state.runs == 1 + 1 + 6
    assert done.runtime_s is not None and abs(done.runtime_s - 0.985) < 1e-9
    # the same three pairs with no gain: reverted within the noise, not a miss
    flat = [run(A, 1.0, "incumbent"), run(B, 1.0, "candidate")] * 3
    tie = resolve(replay(with_run(run(B, 0.995), *flat)))
    assert not tie.kept and tie.race is None and tie.misses == 0
    assert tie.verdict is not None and tie.verdict.within_noise


def test_a_session_budget_counts_the_pairs_raced_over_the_whole_session() -> None:
    from hpc_ds1.runner.keep import KeepRule

    run = step_run
    one_pair = [run(2, A, 1.0, "incumbent"), run(3, B, 0.99, "candidate")]
    state = replay(with_run(run(1, B, 0.99), *one_pair))
    assert state.race_pairs == 1
    # an incumbent re-run alone is half a pair: not counted until the candidate's run
    assert replay(with_run(run(1, B, 0.99), one_pair[0])).race_pairs == 0
    assert resolve(state).race == "incumbent"  # no budget: the move races on
    spent = resolve(state, KeepRule(session_pairs=1))
    assert spent.race is None and not spent.kept and spent.misses == 0  # within the noise


def test_misses_count_in_a_row_and_a_kept_move_resets_them() -> None:
    events = [
        *started(),
        (3, decided(1, "THREADS_UP")),
        (
            4,
            SessionStepRun(
                session_id="s", step=1, move="THREADS_UP", config=B, status="ok", runtime_s=2.0
            ),
        ),
    ]
    state = replay(events)
    assert state.pending is not None and state.pending.run is not None
    r = resolve(state)
    assert (r.kept, r.misses) == (False, 1)
    events.append(
        (
            5,
            SessionMoveResolved(
                session_id="s",
                step=1,
                move="THREADS_UP",
                kept=False,
                config=B,
                runtime_s=2.0,
                misses_in_a_row=1,
            ),
        )
    )
    state = replay(events)
    assert state.misses == 1 and state.best_config == A and state.pending is None
    assert state.runs == 2 and state.version == 5
    # The same move is not proposed again from the same configuration.
    assert choose_move(state, "THREADS_UP", {"THREADS_UP": 0.7, "TILE_UP": 0.2, "STOP": 0.1}) == (
        "TILE_UP",
        0.2,
    )
    assert choose_move(state, "STOP", {"STOP": 0.9}) == ("STOP", 0.9)
    assert choose_move(state, "THREADS_UP", {"THREADS_UP": 1.0}) is None
    # explore_first changes only a session's first decision: a move was tried here already
    assert choose_move(state, "STOP", {"STOP": 0.9, "TILE_UP": 0.1}, explore_first=True) == (
        "STOP",
        0.9,
    )


def test_explore_first_turns_a_first_stop_into_the_likeliest_move() -> None:
    fresh = replay(started())
    odds = {"STOP": 0.8, "TILE_UP": 0.05, "THREADS_UP": 0.15}
    assert choose_move(fresh, "STOP", odds) == ("STOP", 0.8)
    assert choose_move(fresh, "STOP", odds, explore_first=True) == ("THREADS_UP", 0.15)
    assert choose_move(fresh, "TILE_UP", odds, explore_first=True) == ("TILE_UP", 0.05)
    assert choose_move(fresh, "STOP", {"STOP": 1.0}, explore_first=True) is None  # no move left


def test_a_paused_session_waits_and_resumes_with_the_approved_move() -> None:
    events = [
        *started(),
        (3, decided(1, "THREADS_UP", mode="confirm")),
        (4, SessionPaused(session_id="s", step=1, approval_id="a1")),
    ]
    paused = replay(events)
    assert paused.status == "paused" and paused.awaiting == "a1"
    assert paused.pending is not None and not paused.pending.approved
    events.append((5, SessionResumed(session_id="s", approval_id="a1", approved=True)))
    resumed = replay(events)
    assert resumed.status == "running" and resumed.pending is not None
    assert resumed.pending.approved and resumed.awaiting is None


def test_rejecting_a_doubtful_stop_goes_on_and_rejecting_a_move_ends() -> None:
    stop = [
        *started(),
        (3, decided(1, "STOP", mode="confirm")),
        (4, SessionPaused(session_id="s", step=1, approval_id="a1")),
        (5, SessionResumed(session_id="s", approval_id="a1", approved=False)),
    ]
    state = replay(stop)
    assert state.pending is None and state.status == "running"
    # STOP was proposed from here: the next proposal is a move.
    assert choose_move(state, "STOP", {"STOP": 0.6, "TILE_UP": 0.3}) == ("TILE_UP", 0.3)
    move = [
        *started(),
        (3, decided(1, "TILE_UP", mode="confirm")),
        (4, SessionPaused(session_id="s", step=1, approval_id="a1")),
        (5, SessionResumed(session_id="s", approval_id="a1", approved=False)),
    ]
    rejected = replay(move)
    assert rejected.pending is not None and rejected.pending.rejected


def test_a_finished_session_keeps_its_best() -> None:
    events = [
        *started(),
        (3, decided(1, "THREADS_UP")),
        (
            4,
            SessionStepRun(
                session_id="s",
                step=1,
                move="THREADS_UP",
                config=B,
                status="ok",
                runtime_s=0.5,
                spread=0.02,
            ),
        ),
        (
            5,
            SessionMoveResolved(
                session_id="s",
                step=1,
                move="THREADS_UP",
                kept=True,
                config=B,
                runtime_s=0.5,
                best_runtime_s=1.0,
                misses_in_a_row=0,
            ),
        ),
        (
            6,
            SessionFinished(
                session_id="s",
                reason="stop",
                best_config=B,
                best_runtime_s=0.5,
                start_runtime_s=1.0,
                speedup=2.0,
                real_runs=2,
            ),
        ),
    ]
    state = replay(events)
    assert state.status == "finished" and state.best_config == B
    assert state.best_spread == 0.02 and state.speedup == 2.0


def test_a_pick_is_offered_once_where_system1_predicts_it_clearly_faster_and_never_ran() -> None:
    from hpc_ds1.space import Config
    from hpc_ds1.tuning.session import PICK, pick_to_offer

    far = Config(ranks=2, threads=1, tile=128).model_dump()
    here = Config.model_validate(A).label()
    answer = {"config": far, "predicted_runtimes_s": {here: 1.2, Config(**far).label(): 1.0}}
    state = replay(started())
    assert pick_to_offer(state, answer) == far  # predicted 20 % faster, never run
    assert pick_to_offer(state, answer, min_gain=0.25) is None  # not 25 %
    assert pick_to_offer(state, None) is None  # no System 1 answer
    assert pick_to_offer(state, {**answer, "predicted_runtimes_s": {}}) is None  # no prediction
    assert pick_to_offer(state, {**answer, "config": A}) is None  # where the session stands
    picked = replay(
        [*started(), (3, SessionMoveDecided(**{**decided(1, PICK).model_dump(), "target": far}))]
    )
    assert picked.picked and picked.pending is not None and picked.pending.target == far
    assert pick_to_offer(picked, answer) is None  # once a session
    ran = replay([*started(), (3, decided(1, "RANKS_UP")), (4, step_run(1, far, 1.5))])
    assert pick_to_offer(ran, answer) is None  # the session ran it already


def test_a_pick_that_ties_within_the_noise_is_kept_and_a_slower_one_is_a_miss() -> None:
    from hpc_ds1.tuning.session import PICK

    far = B
    pick = SessionMoveDecided(**{**decided(1, PICK).model_dump(), "target": far})

    def runs(*runtimes: tuple[float, str | None]) -> list:
        out = [(3, pick)]
        for i, (runtime, race) in enumerate(runtimes):
            config = far if race in (None, "candidate") else A
            run = step_run(1 + i, config, runtime, race).model_copy(update={"move": PICK})
            out.append((4 + i, run))
        return [*started(), *out]

    flat = [(1.0, "incumbent"), (1.0, "candidate")] * 3
    tied = resolve(replay(runs((0.995, None), *flat)))
    assert tied.kept and tied.misses == 0 and tied.race is None
    assert tied.verdict is not None and tied.verdict.within_noise  # kept on the tie, not won
    slower = resolve(replay(runs((1.5, None))))
    assert not slower.kept and slower.misses == 1  # clearly slower: reverted, a miss
    # the same tie from any other move is reverted (test_a_race_runs_incumbent_then_candidate_...)
