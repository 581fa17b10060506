"""`evaluate` on a recorded GPU (issue 42, item 3): the home's model tunes the recorded
landscape from seeded starts, beside the baselines with the same budget and the same
information, and every figure is scored on the recorded means.

A recorded workload has one size, the one setup measured, so nothing is held out: the
landscape is the one the model was trained on (every configuration of it after a whole setup,
a share after `setup --budget`). What this scores is how well the product tunes the device it
was set up on, run by run; generalisation to a GPU never seen is the yardstick's leave-one-out
(benchmarks/yardstick.py, docs/yardstick.md).

- The landscape: each recorded configuration's mean over its repeats is its truth; a recorded
  failure is a failed configuration.
- A run, in a replayed session, draws RUN_REPEATS of the recorded repeats (seeded by the seed,
  the configuration and which run of it this is) and reports their median and spread, as
  `tune` reports an agent's run: the noise the model's sessions and the keep rule see is the
  hardware's. Random search, greedy and TPE see the recorded means (no noise), as Kernel
  Tuner does in its simulation mode.
- Runs are counted as they are made: a race's re-runs count; the budget of random search and
  TPE is the model's mean runs per session, rounded up (issue 43: the mean, not the median).
- The lookup (the setup's fastest, no run), start-then-lookup, and TPE warm-started with the
  setup's measurements are the baselines with the model's information; random search and
  TPE from cold are beside them."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpc_ds1.model import Measurement, Model, Thresholds, aggregate, replay
from hpc_ds1.model.replay import Cell, Point
from hpc_ds1.requests import RUN_REPEATS
from hpc_ds1.runner.noise import relative_spread
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads.recorded import RecordedWorkload
from hpc_ds1.workloads.recorded_space import RecordedSpace

from . import baselines as bl
from . import decisions as dc
from . import policies as pol
from .landscape import EvaluationError
from .run import session_table

Progress = Callable[[str, int, int], None]
STARTS = 50  # seeded starts: each policy tunes from each
CHECKS = 500  # states decided once for the calibration figures (a seeded sample)
POLICIES = (
    "model",
    "model_engineer",
    "model_recommend",
    "lookup",
    "start_then_lookup",
    "optuna_tpe_warm",
    "greedy",
    "random",
    "optuna_tpe",
)


@dataclass(frozen=True)
class RecordedLandscape:
    cell: Cell
    repeats: dict[Config, tuple[float, ...]]  # the recorded repeats of each that ran
    recorded: RecordedSpace


def landscape_of(workload: RecordedWorkload, space: ConfigSpace) -> RecordedLandscape:
    """The recorded file as a Cell over `space`'s configurations (size 1)."""
    recorded = workload.landscape()
    points: dict[Config, Point] = {}
    repeats: dict[Config, tuple[float, ...]] = {}
    failed: set[Config] = set()
    for config in space.configs():
        record = recorded.records.get(recorded.space.config(dict(config.knobs)))
        if record is None:
            raise EvaluationError(
                f"{workload.name}: {config.label()} is in the space but not in "
                f"{recorded.path}; a recorded landscape is scored only on what was recorded"
            )
        if isinstance(record, str):
            failed.add(config)
            continue
        repeats[config] = tuple(record)
        points[config] = Point(statistics.fmean(record), relative_spread(record), None)
    if not points:
        raise EvaluationError(f"{workload.name}: every recorded configuration failed")
    cell = Cell(workload.name, 1, points, frozenset(failed))
    return RecordedLandscape(cell, repeats, recorded)


def recorded_measure(
    land: RecordedLandscape, seed: int, repeats: int = RUN_REPEATS
) -> replay.Measure:
    """The k-th run of a configuration in a session: `repeats` recorded repeats drawn, seeded
    by (seed, configuration, k), their median and relative spread; None for a failure."""

    def measure(config: Config, k: int) -> replay.Run | None:
        recorded = land.repeats.get(config)
        if recorded is None:
            return None
        draw = random.Random(f"{seed}:{config.label()}:{k}")
        times = [recorded[draw.randrange(len(recorded))] for _ in range(repeats)]
        return replay.Run(statistics.median(times), relative_spread(times))

    return measure


def _starts(cell: Cell, n: int, seed: int) -> list[Config]:
    ok = sorted(cell.points, key=Config.label)
    return random.Random(f"starts:{seed}").sample(ok, min(n, len(ok)))


def evaluate_recorded(
    model: Model,
    workload: RecordedWorkload,
    training: Sequence[Measurement],
    *,
    seed: int = 0,
    starts: int = STARTS,
    thresholds: Thresholds | None = None,
    progress: Progress | None = None,
) -> tuple[dict[str, Any], list[replay.SessionOutcome], list[dc.Checked]]:
    """Score the model's tuning of `workload`'s recorded landscape (see the module);
    `training`: this device's setup measurements of it (the baselines' information)."""
    began = time.perf_counter()
    thresholds = thresholds or model.thresholds
    report = progress or (lambda phase, done, total: None)
    space = model.space_for(workload.name)
    land = landscape_of(workload, space)
    cell = land.cell
    measured = {
        c: o
        for (w, _, c), o in aggregate(training).items()
        if w == workload.name and space.contains(c)
    }
    best_seen = bl.setup_best({c: o.runtime_s if o.ok else None for c, o in measured.items()})
    measure = recorded_measure(land, seed)
    answer = pol.system1_answer(model, cell, space, thresholds)
    chosen = _starts(cell, starts, seed)
    engineer = replay.landscape_engineer(cell, space)
    outcomes: list[replay.SessionOutcome] = []
    # System 1's answer is the recommendation `tune` starts from without --start
    recommend = None if answer is None else Config.model_validate(answer["config"])
    for i, start in enumerate(chosen):
        for policy, answers in (("model", None), ("model_engineer", engineer)):
            outcomes.append(
                replay.model_session(
                    model,
                    cell,
                    start,
                    space,
                    thresholds,
                    seed=seed,
                    system1=answer,
                    measure=measure,
                    engineer=answers,
                    policy=policy,
                )
            )
        if recommend is not None and recommend in cell.points:
            outcomes.append(
                replay.model_session(
                    model,
                    cell,
                    recommend,
                    space,
                    thresholds,
                    seed=seed + i,  # the draws differ per start, so the repeats are fair
                    system1=answer,
                    measure=recorded_measure(land, seed + 1_000 + i),
                    policy="model_recommend",
                )
            )
        outcomes.append(bl.lookup_session(cell, start, best_seen))
        outcomes.append(bl.start_then_lookup_session(cell, start, best_seen, measure))
        outcomes.append(pol.greedy_session(cell, start, space))
        report("replaying the model, lookup, greedy", i + 1, 2 * len(chosen))
    model_runs = [o.runs for o in outcomes if o.policy == "model"]
    budget = max(2, math.ceil(statistics.fmean(model_runs)))
    rng = random.Random(seed)
    prior = bl.as_prior(measured)
    for i, start in enumerate(chosen):
        outcomes.append(pol.random_session(cell, start, space, budget, rng))
        outcomes.append(bl.knob_tpe_session(cell, start, space, budget, seed + i))
        outcomes.append(
            bl.knob_tpe_session(
                cell, start, space, budget, seed + i, prior=prior, policy="optuna_tpe_warm"
            )
        )
        report(
            f"replaying random, TPE cold and warm (budget {budget})",
            len(chosen) + i + 1,
            2 * len(chosen),
        )
    checks = _checks(model, cell, thresholds, seed)
    optimum = cell.best_config
    results: dict[str, Any] = {
        "kind": "recorded",
        "model_version": model.version,
        "device_id": model.device_id,
        "seed": seed,
        "thresholds": thresholds.model_dump(),
        "landscape": {
            "workload": workload.name,
            "recorded": land.recorded.path,
            "recorded_device": land.recorded.device,
            "configurations": len(space.configs()),
            "failed_configurations": len(cell.failed),
            "optimum": optimum.label(),
            "optimum_s": cell.best_runtime_s,
            "measurements": len(training),
            "setup_configurations": len(measured),
            "in_sample": "the model was set up on this landscape: nothing is held out",
        },
        "sessions": {
            "starts": len(chosen),
            "start_draw": f"{len(chosen)} configurations that ran, drawn with seed {seed}",
            "budget": budget,
            "budget_means": "the model's mean runs per session, rounded up, re-runs included",
            "run": f"{RUN_REPEATS} recorded repeats drawn, their median",
            "sessions_per_policy": len(chosen),
            "replayed_engineer": "approves every proposal, STOP included (model_engineer: "
            "the recorded means answer: a move approved when its target is faster, a STOP when "
            "no neighbour is more than 2 % faster; a rejected move ends the session)",
            "table": session_table(outcomes, POLICIES),
        },
        "system1": _system1(cell, answer, best_seen),
        "calibration": dc.calibration_summary(checks, thresholds),
        "calibration_states": f"{len(checks)} states drawn with seed {seed}, decided once",
    }
    results["seconds"] = round(time.perf_counter() - began, 2)
    return results, outcomes, checks


def _system1(cell: Cell, answer: Any, best_seen: Config | None) -> dict[str, Any]:
    """What runs before anything is measured: System 1's pick, and the setup's fastest."""
    picked = None if answer is None else Config.model_validate(answer["config"])
    rows = [
        ("System 1 (the model's pick)", "model", picked),
        ("the setup's fastest (lookup)", "lookup", best_seen),
    ]
    table = [
        {
            "approach": approach,
            "key": key,
            "config": config.label(),
            "median": round(cell.pct_of_best(config), 2),
            "p10": round(cell.pct_of_best(config), 2),
            "real_runs": 0,
        }
        for approach, key, config in rows
        if config is not None
    ]
    return {"table": table, "model_mode": None if answer is None else answer["mode"]}


def _checks(model: Model, cell: Cell, thresholds: Thresholds, seed: int) -> list[dc.Checked]:
    """The calibration's states: a seeded sample of the landscape, each decided once."""
    ok = sorted(cell.points, key=Config.label)
    keep = set(random.Random(f"checks:{seed}").sample(ok, min(CHECKS, len(ok))))
    space = model.space_for(cell.workload)
    return dc.check_cell(model, cell, lambda _: space, thresholds, only=keep)


def render(results: Mapping[str, Any]) -> str:
    land, sessions = results["landscape"], results["sessions"]
    lines = [
        f"recorded landscape {land['workload']} ({land['recorded_device']}, "
        f"{land['configurations']} configurations, {land['failed_configurations']} failed): "
        f"optimum {land['optimum_s'] * 1e3:.4g} ms",
        f"  the model was set up on it ({land['setup_configurations']} configurations "
        "measured): in sample, nothing held out",
        f"  {sessions['starts']} starts; budget {sessions['budget']} runs for random search and "
        "TPE (the model's mean, re-runs counted)",
        "",
        f"  {'policy':18} {'median %':>9} {'p10 %':>7} {'>=90 %':>7} {'runs mean':>10} "
        f"{'median':>7}",
    ]
    for row in sessions["table"]:
        lines.append(
            f"  {row['policy']:18} {row['pct_median']:9.2f} {row['pct_p10']:7.2f} "
            f"{row['share_at_least_90']:7.2f} {row['runs_mean']:10.2f} {row['runs_median']:7}"
        )
    lines.append("")
    for row in results["system1"]["table"]:
        lines.append(f"  {row['approach']} (0 runs): {row['median']} % of the optimum")
    cal = results["calibration"]
    lines.append(
        f"  calibration: {cal['decisions']} states, auto {cal['auto_moves']}, auto not slower "
        f"{cal['auto_not_slower']}"
    )
    lines.append(f"  {results['seconds']} s")
    return "\n".join(lines)
