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
from hpc_ds1.services.coordinator.domain import choose_move, replay, resolve

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


def test_a_faster_move_beyond_the_noise_is_kept_and_a_lucky_one_is_not() -> None:
    state = replay(started())
    faster = SessionStepRun(
        session_id="s", step=1, config=B, status="ok", runtime_s=0.5, spread=0.01
    )
    within_noise = faster.model_copy(update={"runtime_s": 0.99})
    failed = faster.model_copy(update={"status": "wrong_answer", "runtime_s": 0.1})
    assert resolve(state, faster) == (True, 0)
    assert resolve(state, within_noise) == (False, 1)
    assert resolve(state, failed) == (False, 1)


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
    kept, misses = resolve(state, state.pending.run)
    assert (kept, misses) == (False, 1)
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
