"""Tuning policies replayed against a measured landscape, each from the same start configuration.

The model's policy is the coordinator's own session fold (`evolve`, `choose_move`, `resolve`), so
its stopping rules are exactly those of `hpc-ds1 tune`; the replayed engineer approves every
proposal, STOP included, so the figures measure the model's own moves."""

from __future__ import annotations

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

from .landscape import Cell

POLICIES = (
    "model",
    "model_recommend",
    "model_transfer",
    "model_engineer",  # the model's sessions with the landscape's engineer answering
    "greedy",
    "random",
    "optuna_tpe",
    "exhaustive",
    # the baselines given the model's information (evaluation/baselines.py, issue 43)
    "always_stop",
    "lookup",
    "start_then_lookup",
    "optuna_tpe_warm",
)
LIVE_POLICIES = ("model_live", "model_recommend_live")  # run for real, not replayed (live.py)
ALL_POLICIES = POLICIES[:4] + LIVE_POLICIES + POLICIES[4:]
REPLAY_ID = "replay"


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


def system1_answer(model: Any, cell: Cell, space: ConfigSpace, thresholds: Thresholds) -> Any:
    """What the decision service answers as `system1` for the cell's job: the model's
    recommendation, its confidence and mode; None where it has no feasible configuration."""
    try:
        rec = model.recommend(cell.workload, cell.size, thresholds=thresholds, space=space)
    except ValueError:
        return None
    return {
        "config": rec.config.model_dump(),
        "confidence": rec.confidence,
        "mode": rec.mode,
        "predicted_runtimes_s": dict(rec.alternatives),
    }


def fastest_ran(cell: Cell, configs: Any) -> Config | None:
    ok = [c for c in configs if c in cell.points]
    return min(ok, key=lambda c: cell.points[c].runtime_s) if ok else None


def greedy_session(cell: Cell, start: Config, space: ConfigSpace) -> SessionOutcome:
    """Steepest descent: run every neighbour not yet run, move to the fastest while it beats
    the current configuration by more than the noise."""
    ran = {start: None}  # a dict: the order they ran in
    current = start
    while True:
        around = list(neighbours(current, space).values())
        ran.update(dict.fromkeys(around))
        best = fastest_ran(cell, around)
        here = cell.points[current]
        if best is None:
            break
        there = cell.points[best]
        if not is_faster(there.runtime_s, there.spread, here.runtime_s, here.spread):
            break
        current = best
    return session_outcome(
        "greedy", cell, start, current, len(ran), finish="no_better_neighbour", ran=tuple(ran)
    )


def random_session(
    cell: Cell, start: Config, space: ConfigSpace, budget: int, rng: random.Random
) -> SessionOutcome:
    """The start plus budget-1 other configurations drawn without replacement; keep the fastest."""
    others = [c for c in space.configs() if c != start]
    drawn = rng.sample(others, min(max(budget - 1, 0), len(others)))
    final = fastest_ran(cell, [start, *drawn]) or start
    return session_outcome(
        "random", cell, start, final, 1 + len(drawn), finish="budget", ran=(start, *drawn)
    )


def tpe_session(
    cell: Cell, start: Config, space: ConfigSpace, budget: int, seed: int
) -> SessionOutcome:
    """A real Optuna study with the TPE sampler, seeded, over ranks, threads (feasible for the
    ranks drawn), tile and block; the start configuration is its first trial. A configuration drawn
    again is answered from the study's own history, not run again."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(1, budget // 2))
    study = optuna.create_study(direction="minimize", sampler=sampler)
    study.enqueue_trial(
        {
            "ranks": start.ranks,
            f"threads_r{start.ranks}": start.threads,
            "tile": start.tile,
            "block": start.block,
        }
    )
    ran: dict[Config, float] = {}
    penalty = 10.0 * max(p.runtime_s for p in cell.points.values())

    def objective(trial: optuna.Trial) -> float:
        ranks = trial.suggest_categorical("ranks", list(space.ranks))
        fit = [t for t in space.threads if ranks * t <= space.max_workers]
        threads = trial.suggest_categorical(f"threads_r{ranks}", fit)
        tile = trial.suggest_categorical("tile", list(space.tiles))
        block = trial.suggest_categorical("block", list(space.blocks))
        config = Config(ranks=ranks, threads=threads, tile=tile, block=block)
        if config not in ran:
            point = cell.points.get(config)
            ran[config] = point.runtime_s if point else penalty
        return ran[config]

    trials = 0
    while len(ran) < min(budget, len(space.configs())) and trials < 20 * budget:
        study.optimize(objective, n_trials=1)
        trials += 1
    final = fastest_ran(cell, ran) or start
    return session_outcome(
        "optuna_tpe", cell, start, final, len(ran), finish="budget", ran=tuple(ran)
    )


def exhaustive_session(cell: Cell, start: Config, space: ConfigSpace) -> SessionOutcome:
    configs = space.configs()
    return session_outcome(
        "exhaustive", cell, start, cell.best_config, len(configs), finish="all", ran=tuple(configs)
    )
