"""A tuning session as a pure fold over its events, and the rules that decide its next step."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from hpc_ds1.events import (
    Event,
    SessionFinished,
    SessionMoveDecided,
    SessionMoveResolved,
    SessionPaused,
    SessionResumed,
    SessionStarted,
    SessionStepRun,
)
from hpc_ds1.runner.keep import DEFAULT_RULE, KeepRule, Sample, Verdict, geometric_mean, judge
from hpc_ds1.space import STOP, Config

MAX_MISSES = 2
# A session that would stop where System 1 (the model's whole-configuration answer for the job)
# predicts a clearly faster configuration runs that configuration once, as a move named PICK:
# one-change-at-a-time sessions stop behind slower configurations that the answer jumps over
# (docs/evaluation.md, sections 13, 15 and 16). "Clearly": predicted at least this much faster.
PICK = "PICK"
PICK_MIN_GAIN = 0.05
# A warm session (`tune --warm`: its device had not measured the job, or it was asked to) runs
# the top of its siblings' consensus first (SessionStarted.warm.plan): each configuration not
# yet run, in order, as a move named WARM, judged by the keep rule like any move. The siblings'
# runs are evidence about the job, not a move the model chose: a WARM that is not kept is not a
# miss (as the warm start of `tuning.search.tune` explores its prior runs).
WARM = "WARM"


def config_key(config: dict[str, Any]) -> str:
    return ",".join(f"{k}={config[k]}" for k in sorted(config))


@dataclass(frozen=True)
class PendingMove:
    step: int
    move: str
    decision_id: str
    mode: str
    confidence: float
    approved: bool = False  # auto moves count as approved
    rejected: bool = False
    target: dict[str, Any] | None = None  # a PICK's configuration
    run: SessionStepRun | None = None  # the step's run, once recorded
    race: tuple[SessionStepRun, ...] = ()  # re-runs of incumbent and candidate, in order


@dataclass(frozen=True)
class SessionState:
    session_id: str = ""
    device_id: str = ""
    workload: str = ""
    size: int = 0
    start: dict[str, Any] = field(default_factory=dict)
    status: Literal["new", "running", "paused", "finished"] = "new"
    version: int = 0  # stream sequence of the session's last event
    runs: int = 0
    start_runtime_s: float | None = None
    best_config: dict[str, Any] | None = None
    best_runtime_s: float | None = None
    best_spread: float | None = None
    best_runs: tuple[Sample, ...] = ()  # every run of the best configuration (the keep rule's)
    misses: int = 0
    race_pairs: int = 0  # pairs raced over the session (a session budget counts them)
    tried: frozenset[tuple[str, str]] = frozenset()  # (config key, move) already proposed
    ran: frozenset[str] = frozenset()  # config keys of every run of the session
    picked: bool = False  # a PICK was proposed (once a session)
    warm_plan: tuple[dict[str, Any], ...] = ()  # a warm start's configurations (WARM moves)
    warm_from: tuple[str, ...] = ()  # its siblings, "workload@device"
    pending: PendingMove | None = None
    awaiting: str | None = None  # approval id while paused
    finish_reason: str | None = None

    def tried_from_best(self) -> set[str]:
        key = config_key(self.best_config or {})
        return {move for k, move in self.tried if k == key}

    @property
    def speedup(self) -> float | None:
        if self.start_runtime_s and self.best_runtime_s:
            return self.start_runtime_s / self.best_runtime_s
        return None


def evolve(state: SessionState, seq: int, event: Event) -> SessionState:
    """The state after one more event (events of other types leave it as it was, but for its
    version). One replace() per event: training's replays fold hundreds of thousands."""
    if isinstance(event, SessionStarted):
        return replace(
            state,
            version=seq,
            session_id=event.session_id,
            device_id=event.device_id,
            workload=event.workload,
            size=event.size,
            start=event.start,
            status="running",
            warm_plan=tuple(event.warm.plan) if event.warm else (),
            warm_from=tuple(f"{w.workload}@{w.device_id}" for w in event.warm.siblings)
            if event.warm
            else (),
        )
    if isinstance(event, SessionStepRun):
        runs = state.runs + 1
        ran = state.ran | {config_key(event.config)}
        if event.step == 0:
            ok = event.status == "ok"
            return replace(
                state,
                version=seq,
                runs=runs,
                ran=ran,
                start_runtime_s=event.runtime_s,
                best_config=event.config if ok else None,
                best_runtime_s=event.runtime_s if ok else None,
                best_spread=event.spread if ok else None,
                best_runs=_samples([event]) if ok else (),
            )
        if state.pending is not None and event.race is not None:
            pairs = state.race_pairs + (event.race == "candidate")
            pending = replace(state.pending, race=(*state.pending.race, event))
            return replace(
                state, version=seq, runs=runs, ran=ran, pending=pending, race_pairs=pairs
            )
        if state.pending is not None:
            pending = replace(state.pending, run=event)
            return replace(state, version=seq, runs=runs, ran=ran, pending=pending)
        return replace(state, version=seq, runs=runs, ran=ran)
    if isinstance(event, SessionMoveDecided):
        tried = state.tried | {(config_key(event.config), event.move)}
        pending = PendingMove(
            event.step,
            event.move,
            event.decision_id,
            event.mode,
            event.confidence,
            approved=event.mode == "auto",
            target=event.target,
        )
        picked = state.picked or event.move == PICK
        return replace(state, version=seq, tried=tried, pending=pending, picked=picked)
    if isinstance(event, SessionPaused):
        return replace(state, version=seq, status="paused", awaiting=event.approval_id)
    if isinstance(event, SessionResumed):
        return replace(
            state,
            version=seq,
            status="running",
            awaiting=None,
            pending=_after_verdict(state.pending, event.approved),
        )
    if isinstance(event, SessionMoveResolved):
        was = state.pending
        run = was.run if was else None
        if event.kept:
            candidate = _samples([run, *_raced(was, "candidate")]) if was and run else ()
            return replace(
                state,
                version=seq,
                pending=None,
                misses=0,
                best_config=event.config,
                best_runtime_s=event.runtime_s,
                best_spread=run.spread if run else None,
                best_runs=candidate,
            )
        # the incumbent's re-runs stay its evidence
        more = _samples(_raced(was, "incumbent")) if was else ()
        return replace(
            state,
            version=seq,
            pending=None,
            misses=event.misses_in_a_row,
            best_runs=state.best_runs + more,
        )
    if isinstance(event, SessionFinished):
        return replace(
            state,
            version=seq,
            status="finished",
            finish_reason=event.reason,
            pending=None,
            awaiting=None,
        )
    return replace(state, version=seq)


def _after_verdict(pending: PendingMove | None, approved: bool) -> PendingMove | None:
    if pending is None:
        return None
    if approved:
        return replace(pending, approved=True)
    if pending.move == STOP:
        return None  # the engineer wants to go on: STOP stays tried from here
    return replace(pending, rejected=True)


def replay(events: list[tuple[int, Event]]) -> SessionState:
    state = SessionState()
    for seq, event in events:
        state = evolve(state, seq, event)
    return state


def _samples(runs: Any) -> tuple[Sample, ...]:
    return tuple(
        Sample(r.runtime_s, r.spread)
        for r in runs
        if r is not None and r.status == "ok" and r.runtime_s is not None and r.runtime_s > 0
    )


def _raced(pending: PendingMove, role: str) -> list[SessionStepRun]:
    return [r for r in pending.race if r.race == role]


@dataclass(frozen=True)
class Resolution:
    """What the keep rule says of the pending move's runs so far."""

    kept: bool
    misses: int  # misses in a row after this move (a within-noise revert leaves them as they were)
    race: Literal["incumbent", "candidate"] | None  # the next run the race needs; None: decided
    runtime_s: float | None  # the candidate's runtime: geometric mean of its runs
    verdict: Verdict | None  # None: the candidate failed (or there is no incumbent)


def resolve(state: SessionState, rule: KeepRule = DEFAULT_RULE) -> Resolution:
    """Keep the move when P(candidate faster) reaches the rule's confidence, from every run of
    the incumbent (the best so far) and of the candidate; race an ambiguous one, a pair at a
    time, incumbent first; a failed or clearly slower candidate is a miss, a within-noise one
    is not (runner/keep.py); a PICK that ends within the noise is kept (`keeps_a_tied_pick`)."""
    pending = state.pending
    assert pending is not None and pending.run is not None, "no run to resolve"
    run = pending.run
    inc_runs, cand_runs = _raced(pending, "incumbent"), _raced(pending, "candidate")
    if len(inc_runs) > len(cand_runs):
        return Resolution(False, state.misses, "candidate", None, None)  # finish the pair
    known = state.best_runs
    if not known and state.best_runtime_s:
        known = (Sample(state.best_runtime_s, state.best_spread),)  # a log from before best_runs
    incumbent = known + _samples(inc_runs)
    candidate = _samples([run, *cand_runs])
    if run.status != "ok" or not candidate or not incumbent:
        missed = 0 if pending.move == WARM else 1
        return Resolution(False, state.misses + missed, None, run.runtime_s, None)
    verdict = judge(incumbent, candidate, len(cand_runs), rule, state.race_pairs)
    runtime = geometric_mean(candidate)
    if verdict.outcome == "race":
        return Resolution(False, state.misses, "incumbent", runtime, verdict)
    if verdict.kept or keeps_a_tied_pick(pending, verdict):
        return Resolution(True, 0, None, runtime, verdict)
    missed = verdict.miss and pending.move != WARM  # a sibling's best is not the model's miss
    return Resolution(False, state.misses + (1 if missed else 0), None, runtime, verdict)


def keeps_a_tied_pick(pending: PendingMove, verdict: Verdict) -> bool:
    """A PICK whose runs cannot be told from the incumbent's is kept. System 1 offered it as
    clearly faster (`pick_to_offer`), and a measurement that cannot tell the two apart leaves
    that prediction standing. Reverting instead left sessions 20-23 % slower than a pick whose
    one noisy observation had tied it with their incumbent; on the development set not one tied
    PICK kept this way was slower on the truth pass (docs/evaluation.md, section 24)."""
    return pending.move == PICK and verdict.outcome == "revert" and verdict.within_noise


def pick_to_offer(
    state: SessionState, system1: dict[str, Any] | None, min_gain: float | None = PICK_MIN_GAIN
) -> dict[str, Any] | None:
    """The configuration a PICK would run where the session would stop: System 1's for the job,
    once a session, only where the session never ran it and (with `min_gain`) where System 1's
    predicted runtimes put it at least that much faster than the best so far; None otherwise."""
    config = (system1 or {}).get("config")
    if not config or state.picked or state.best_config is None:
        return None
    # through Config: a dump with or without defaulted fields is the same configuration
    pick, best = Config.model_validate(config), Config.model_validate(state.best_config)
    if config_key(pick.model_dump()) in state.ran or pick == best:
        return None
    if min_gain is not None:
        predicted = (system1 or {}).get("predicted_runtimes_s") or {}
        here, there = predicted.get(best.label()), predicted.get(pick.label())
        if here is None or there is None or here < (1.0 + min_gain) * there:
            return None
    return pick.model_dump()


def warm_to_offer(state: SessionState) -> dict[str, Any] | None:
    """The configuration a WARM move would run next: the first of the warm start's plan that
    the session has not run (None: a cold session, or its plan is spent). Through Config: a
    dump with or without defaulted fields is the same configuration."""
    if state.best_config is None:
        return None
    for planned in state.warm_plan:
        config = Config.model_validate(planned).model_dump()
        if config_key(config) not in state.ran:
            return config
    return None


def choose_move(
    state: SessionState,
    choice: str,
    alternatives: dict[str, float],
    explore_first: bool = False,
) -> tuple[str, float] | None:
    """The model's choice (STOP included) unless already proposed from the best configuration,
    else the likeliest untried move; None when nothing untried is left. With `explore_first`,
    a session never stops before it has tried a move: a STOP as the first decision gives way
    to the likeliest move."""
    tried = state.tried_from_best()
    if explore_first and choice == STOP and not state.tried:
        tried = {*tried, STOP}
    if choice not in tried:
        return choice, alternatives.get(choice, 0.0)
    untried = sorted(
        ((m, p) for m, p in alternatives.items() if m != STOP and m not in tried),
        key=lambda mp: -mp[1],
    )
    return untried[0] if untried else None
