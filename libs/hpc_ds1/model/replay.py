"""A tuning session replayed against a measured landscape: the coordinator's own session fold
(`tuning.session`: `evolve`, `choose_move`, `resolve`) driven by a decider's answers, each run
answered from the landscape's measurements. Training scores its candidate blends with it (the
mean % of best its out-of-fold decisions reach); the evaluation replays the model's sessions
and the baselines' with it. Below both: it knows a decider only by its `decide`."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from hpc_ds1.events import SessionMoveDecided, SessionMoveResolved, SessionStarted, SessionStepRun
from hpc_ds1.model.schema import State, Thresholds, waits_for_engineer
from hpc_ds1.runner import is_faster
from hpc_ds1.runner.keep import DEFAULT_RULE, KeepRule
from hpc_ds1.space import STOP, Config, ConfigSpace, apply_move, neighbours
from hpc_ds1.tuning.session import (
    MAX_MISSES,
    PICK,
    PICK_MIN_GAIN,
    SessionState,
    choose_move,
    config_key,
    evolve,
    pick_to_offer,
    resolve,
)

REPLAY_ID = "replay"


@dataclass(frozen=True)
class Point:
    runtime_s: float
    spread: float | None
    throughput: float | None


@dataclass(frozen=True)
class Cell:
    """One (workload, size): the measured median of every configuration; failed ones apart."""

    workload: str
    size: int
    points: dict[Config, Point]
    failed: frozenset[Config]

    @functools.cached_property  # a cell is built once and replayed from every start
    def best_config(self) -> Config:
        return min(self.points, key=lambda c: (self.points[c].runtime_s, c.label()))

    @property
    def best_runtime_s(self) -> float:
        return self.points[self.best_config].runtime_s

    def state(self, config: Config) -> State:
        """A measured configuration as the model sees it: with its measured telemetry."""
        point = self.points[config]
        return State(
            workload=self.workload,
            size=self.size,
            config=config,
            runtime_s=point.runtime_s,
            throughput=point.throughput,
        )

    def tied_with_best(self) -> list[Config]:
        """Configurations the best does not beat by more than the measured noise."""
        best = self.points[self.best_config]
        return [
            c
            for c, p in self.points.items()
            if not is_faster(best.runtime_s, best.spread, p.runtime_s, p.spread)
        ]

    def pct_of_best(self, config: Config) -> float:
        """best runtime / runtime of `config`, in %; 0 for a failed or unmeasured one."""
        point = self.points.get(config)
        return 0.0 if point is None else 100.0 * self.best_runtime_s / point.runtime_s


@dataclass(frozen=True)
class SessionOutcome:
    policy: str
    workload: str
    size: int
    start: Config
    final: Config
    runs: int  # real runs the session made (each run of a configuration counts)
    pct_of_best: float
    finish: str = ""
    engineer_moves: int = 0  # proposals that would have waited for an engineer
    engineer_rejected: int = 0  # of those, the ones the replayed engineer turned down
    ran: tuple[Config, ...] = ()  # every configuration it ran, in order (its tuning cost)
    cost_s: float | None = None  # measured seconds of its runs, where it ran for real

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "workload": self.workload,
            "size": self.size,
            "start": self.start.label(),
            "final": self.final.label(),
            "runs": self.runs,
            "pct_of_best": round(self.pct_of_best, 3),
            "finish": self.finish,
            "engineer_moves": self.engineer_moves,
            "engineer_rejected": self.engineer_rejected,
            "ran": [c.label() for c in self.ran],
            **({} if self.cost_s is None else {"cost_s": round(self.cost_s, 3)}),
        }


def session_outcome(
    policy: str, cell: Cell, start: Config, final: Config, runs: int, **kw: Any
) -> Any:
    return SessionOutcome(
        policy, cell.workload, cell.size, start, final, runs, cell.pct_of_best(final), **kw
    )


@dataclass(frozen=True)
class Run:
    """One run of a configuration as a session sees it: median runtime, relative spread."""

    runtime_s: float
    spread: float | None
    throughput: float | None = None


# The `rerun`-th run of a configuration in one session: 0 for a move's own run, k >= 1 for its
# k-th re-run while the keep rule races. None: the run failed.
Measure = Callable[[Config, int], Run | None]


def replay_measure(cell: Cell, seed: int, sigma_floor: float) -> Measure:
    """A session replayed on the observed pass: a move's run is the configuration's measured
    median; a race's re-run is drawn around it (`rerun`)."""

    def measure(config: Config, k: int) -> Run | None:
        if k == 0:
            point = cell.points.get(config)
            return None if point is None else Run(point.runtime_s, point.spread, point.throughput)
        again = rerun(cell, config, k, seed, sigma_floor)
        return None if again is None else Run(*again)

    return measure


def _step_run(
    step: int,
    move: str | None,
    config: Config,
    run: Run | None,
    race: Literal["incumbent", "candidate"] | None = None,
) -> SessionStepRun:
    return SessionStepRun(
        session_id=REPLAY_ID,
        step=step,
        move=move,
        config=config.model_dump(),
        status="ok" if run else "failed",
        runtime_s=run.runtime_s if run else None,
        spread=run.spread if run else None,
        race=race,
    )


def rerun(
    cell: Cell, config: Config, k: int, seed: int, sigma_floor: float = DEFAULT_RULE.sigma_floor
) -> tuple[float, float | None] | None:
    """The k-th re-run (k >= 1) of a measured configuration while the keep rule races: the
    landscape holds one measured median per configuration, so a re-run is modelled as that
    median times exp(sigma * z), sigma its measured spread (at least the rule's floor), z a
    standard normal drawn from (seed, workload, size, configuration, k) alone; every policy and
    every rule sees the same k-th re-run. None for a failed configuration."""
    point = cell.points.get(config)
    if point is None:
        return None
    z = random.Random(f"{seed}:{cell.workload}:{cell.size}:{config.label()}:{k}").gauss(0.0, 1.0)
    sigma = max(point.spread or 0.0, sigma_floor)
    return point.runtime_s * math.exp(sigma * z), point.spread


# An engineer's answer to a proposal that waits for one: (the best so far, the move, its
# target; None for STOP) -> approved
Engineer = Callable[[Config, str, Config | None], bool]


def landscape_engineer(cell: Cell, space: ConfigSpace, tolerance: float = 0.02) -> Engineer:
    """An engineer who knows the landscape (the replay's stand-in for the one asked): a move
    is approved when its target is faster than the best so far, a STOP when no neighbour is
    more than `tolerance` faster; a failing target is turned down."""

    def answer(best: Config, move: str, target: Config | None) -> bool:
        here = cell.points.get(best)
        if here is None:
            return True
        if move == STOP:
            around = (cell.points.get(c) for c in neighbours(best, space).values())
            return all(p is None or p.runtime_s >= here.runtime_s * (1 - tolerance) for p in around)
        there = cell.points.get(target) if target is not None else None
        return there is not None and there.runtime_s < here.runtime_s

    return answer


class Decider(Protocol):
    """What a session asks for its next move: a Model, or out-of-fold predictions in training."""

    device_id: str

    def decide(self, state: State, *, space: ConfigSpace, thresholds: Thresholds) -> Any: ...


def model_session(
    model: Decider,
    cell: Cell,
    start: Config,
    space: ConfigSpace,
    thresholds: Thresholds,
    *,
    rule: KeepRule = DEFAULT_RULE,
    seed: int = 0,
    policy: str = "model",
    explore_first: bool = False,
    system1: Mapping[str, Any] | None = None,
    pick_after_misses: bool = True,
    pick_gain: float | None = PICK_MIN_GAIN,
    measure: Measure | None = None,
    engineer: Engineer | None = None,
) -> SessionOutcome:
    """One change at a time from `start`, as the coordinator runs a session, with the
    coordinator's keep rule; a race's re-runs come from `rerun` (seeded). `system1`: the
    model's System 1 answer for the job (`system1_answer`), run once as the move PICK where
    the session would end (the model's STOP, no untried move or, with `pick_after_misses`, two
    misses in a row) and System 1 predicts it at least `pick_gain` faster than the best so far
    (None: ungated), as the coordinator does (domain.pick_to_offer); None: no PICK, the
    coordinator's session before docs/evaluation.md section 16. `measure`: where the runs come
    from (None: the replay, `replay_measure`); a session that measures for real asks the model
    from its own best runtime, as the coordinator does. `engineer`: who answers a proposal
    that waits for one (None: every proposal approved); as the coordinator does, a rejected
    move ends the session there, and a rejected STOP goes on with the next move."""
    started = SessionStarted(
        session_id=REPLAY_ID,
        device_id=model.device_id,
        workload=cell.workload,
        size=cell.size,
        start=start.model_dump(),
    )
    replayed = measure is None
    measure = measure or replay_measure(cell, seed, rule.sigma_floor)
    s = evolve(SessionState(), 1, started)
    first = measure(start, 0)
    s = evolve(s, 2, _step_run(0, None, start, first))
    if first is None:
        return session_outcome(policy, cell, start, start, 1, finish="failed", ran=(start,))
    seen = {start: first}
    ran = [start]
    reruns: dict[Config, int] = {}
    asked, rejected, finish = 0, 0, "max_runs"
    # a bound only: choose_move never repeats a move, and a move races at most max_pairs pairs
    limit = (2 + 2 * rule.max_pairs) * len(space.configs())
    while s.runs < limit:
        assert s.best_config is not None and s.best_runtime_s is not None
        if s.misses >= MAX_MISSES and (s.picked or not system1):
            finish = "two_misses"  # no PICK left to offer: the model is not asked
            break
        best = Config.model_validate(s.best_config)
        decision = model.decide(
            # the best so far, with its measured runtime
            cell.state(best) if replayed else _state(cell, best, s.best_runtime_s, seen[best]),
            space=space,
            thresholds=thresholds,
        )
        picked = choose_move(s, decision.choice, decision.alternatives, explore_first)
        target: Config | None = None
        two_misses = s.misses >= MAX_MISSES
        if two_misses or picked is None or picked[0] == STOP:
            offered = pick_to_offer(s, dict(system1), pick_gain) if system1 else None
            if offered is not None and system1 is not None:
                target = Config.model_validate(offered)
                picked = (PICK, float(system1["confidence"]))
            elif two_misses:
                finish = "two_misses"
                break
        if picked is None:
            finish = "no_moves"
            break
        move, confidence = picked
        own = move == decision.choice
        # as the coordinator does: another move than the model's first choice is judged on
        # its own confidence, and stays escalated when the decision was; a PICK has System 1's
        mode = decision.mode
        if move == PICK and system1 is not None:
            mode = "escalate" if decision.mode == "escalate" else system1["mode"]
        elif not own and decision.mode != "escalate":
            mode = thresholds.mode(confidence, [])[0]
            if mode == "auto" and waits_for_engineer(list(decision.reasons or [])):
                mode = "confirm"
        asked += mode != "auto"
        if move != PICK and move != STOP:
            target = apply_move(best, move, space)
        if mode != "auto" and engineer is not None and not engineer(best, move, target):
            rejected += 1
            if move != STOP:
                finish = "rejected"
                break
            # the engineer wants to go on: STOP stays tried from here (tuning/session.py)
            s = replace(s, tried=s.tried | {(config_key(best.model_dump()), STOP)})
            continue
        if move == STOP:
            finish = "stop"
            break
        step = s.runs
        assert s.best_config is not None
        s = evolve(
            s,
            s.version + 1,
            SessionMoveDecided(
                session_id=REPLAY_ID,
                step=step,
                decision_id=REPLAY_ID,
                move=move,
                confidence=confidence,
                mode="auto",  # approved
                config=s.best_config,
                target=target.model_dump() if move == PICK and target is not None else None,
            ),
        )
        assert target is not None  # alternatives hold only the feasible moves
        tried = measure(target, 0)
        if tried is not None:
            seen.setdefault(target, tried)
        ran.append(target)
        s = evolve(s, s.version + 1, _step_run(step, move, target, tried))
        r = resolve(s, rule)
        while r.race is not None:
            config = best if r.race == "incumbent" else target
            reruns[config] = reruns.get(config, 0) + 1
            again = measure(config, reruns[config])
            ran.append(config)
            s = evolve(s, s.version + 1, _step_run(s.runs, move, config, again, r.race))
            r = resolve(s, rule)
        s = evolve(
            s,
            s.version + 1,
            SessionMoveResolved(
                session_id=REPLAY_ID,
                step=step,
                move=move,
                kept=r.kept,
                config=target.model_dump(),
                runtime_s=r.runtime_s,
                best_runtime_s=s.best_runtime_s,
                misses_in_a_row=r.misses,
                p_faster=r.verdict.p_faster if r.verdict else None,
                within_noise=bool(r.verdict and r.verdict.within_noise),
            ),
        )
        if r.misses >= MAX_MISSES and not pick_after_misses:
            finish = "two_misses"  # the variant without the PICK after two misses
            break
    final = Config.model_validate(s.best_config)
    return session_outcome(
        policy,
        cell,
        start,
        final,
        s.runs,
        finish=finish,
        engineer_moves=asked,
        engineer_rejected=rejected,
        ran=tuple(ran),
    )


def _state(cell: Cell, config: Config, runtime_s: float, run: Run) -> State:
    return State(
        workload=cell.workload,
        size=cell.size,
        config=config,
        runtime_s=runtime_s,
        throughput=run.throughput,
    )
