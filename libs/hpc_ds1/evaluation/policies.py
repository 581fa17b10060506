"""Tuning policies replayed against a measured landscape, each from the same start configuration.

The model's policy is the coordinator's own session fold (`evolve`, `choose_move`, `resolve`), so
its stopping rules are exactly those of `hpc-ds1 tune`; the replayed engineer approves every
proposal, STOP included, so the figures measure the model's own moves."""

from __future__ import annotations

import random
from typing import Any

from hpc_ds1.model.replay import (
    Cell,
    SessionOutcome,
    session_outcome,
)
from hpc_ds1.model.schema import Thresholds
from hpc_ds1.runner import is_faster
from hpc_ds1.space import Config, ConfigSpace, neighbours

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
