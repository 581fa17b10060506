"""The whole evaluation of one model against its held-out landscape: pure over measurements."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hpc_ds1.model import Measurement, Model, Thresholds, aggregate, replay, train
from hpc_ds1.model.replay import Cell
from hpc_ds1.model.transfer import Table, predict, relative_table
from hpc_ds1.runner.keep import DEFAULT_RULE, KeepRule
from hpc_ds1.space import Config

from . import baselines as bl
from . import decisions as dc
from . import policies as pol
from .headline import (
    SYSTEM1_BASELINES,
    VERSUS,
    figure_interval,
    system1_truth,
    system1_versus,
    target_row,
    truth_targets,
    versus,
)
from .landscape import EvaluationError, build_cells, nearest_size, noise_summary, percentile
from .live import LiveRun, RunFn, live_sessions, live_summary
from .system1 import system1
from .truth import (
    NEAR_BEST,
    SESSION_REPEATS,
    TRUTH_REPEATS,
    truth_configs,
    truth_points,
    truth_summary,
)

Progress = Callable[[str, int, int], None]  # phase, done, total


@dataclass
class Evaluation:
    results: dict[str, Any]
    sessions: list[replay.SessionOutcome] = field(default_factory=list)
    checks: list[dc.Checked] = field(default_factory=list)


def _quiet(phase: str, done: int, total: int) -> None:
    return None


def training_of(model: Model, measurements: Sequence[Measurement]) -> list[Measurement]:
    """What `model` was trained on: the non-held-out measurements at its own training sizes."""
    return [m for m in measurements if not m.held_out and m.size in model.sizes.get(m.workload, ())]


def check_honest(
    model: Model, held: Sequence[Measurement], training: Sequence[Measurement]
) -> None:
    """Held-out sizes must be sizes the model never saw."""
    if not held:
        raise EvaluationError(
            "no held-out landscape for this device: run `hpc-ds1 evaluate` (it measures the "
            "held-out sizes first); the evaluation never reports on training data"
        )
    trained = {(m.workload, m.size) for m in training} | {
        (w, s) for w, sizes in model.sizes.items() for s in sizes
    }
    leaked = sorted({(m.workload, m.size) for m in held} & trained)
    if leaked:
        raise EvaluationError(
            "held-out sizes that are also training sizes: "
            + ", ".join(f"{w} {s}" for w, s in leaked)
            + "; evaluate only sizes the model never trained on"
        )


def session_table(
    outcomes: Sequence[replay.SessionOutcome], policies: Sequence[str] = pol.ALL_POLICIES
) -> list[dict[str, Any]]:
    """A row per policy (in `policies`' order) with sessions: % of best, real runs, and for the
    model's own sessions the proposals that waited for an engineer."""
    rows = []
    for policy in policies:
        mine = [o for o in outcomes if o.policy == policy]
        if not mine:
            continue
        pcts = [o.pct_of_best for o in mine]
        runs = [o.runs for o in mine]
        row = {
            "policy": policy,
            "sessions": len(mine),
            "pct_median": round(statistics.median(pcts), 2),
            "pct_p10": round(percentile(pcts, 0.10), 2),
            "share_at_least_98": round(sum(p >= 98.0 for p in pcts) / len(pcts), 4),
            "share_at_least_90": round(sum(p >= 90.0 for p in pcts) / len(pcts), 4),
            "runs_mean": round(statistics.fmean(runs), 2),
            "runs_median": statistics.median(runs),
            "runs_max": max(runs),
        }
        if policy in ("model", "model_engineer"):
            row["engineer_moves_per_session"] = round(
                statistics.fmean(o.engineer_moves for o in mine), 3
            )
            row["engineer_rejected_per_session"] = round(
                statistics.fmean(o.engineer_rejected for o in mine), 3
            )
        rows.append(row)
    return rows


def _trained_best(training: Sequence[Measurement]) -> dict[tuple[str, int], Config]:
    best: dict[tuple[str, int], tuple[float, Config]] = {}
    for (w, s, c), o in aggregate(training).items():
        if (
            o.ok
            and o.runtime_s is not None
            and ((w, s) not in best or o.runtime_s < best[(w, s)][0])
        ):
            best[(w, s)] = (o.runtime_s, c)
    return {k: c for k, (_, c) in best.items()}


def _targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    by = {r["policy"]: r for r in results["sessions"]["table"]}
    s1 = {r["key"]: r for r in results["system1"]["table"]}
    kernels = [k for k in results["guard"]["kernels"] if "states" in k]
    cal = results["calibration"]
    m = by.get("model", {})
    guard = [
        (
            "guard: share of never-seen-kernel states flagged",
            min((k["flagged_by_guard"] for k in kernels), default=None),
            ">=",
            1.0,
        ),
        (
            "guard: false flags on familiar held-out sizes",
            results["guard"]["false_flags"]["rate"],
            "<=",
            0.05,
        ),
        (
            "guard: confidently wrong auto-runs after the guard",
            sum(k["confidently_wrong_after_guard"] for k in kernels) if kernels else None,
            "<=",
            0,
        ),
    ]
    discrimination = cal.get("discrimination") or {}
    trust = [  # issue 43: a confidence that tells the moves an engineer must see
        (
            "confidence: AUROC for ending within 5 % of the best available",
            discrimination.get("auroc"),
            ">=",
            0.75,
        ),
        (
            "auto decisions ending within 5 % of the best available",
            cal.get("auto_within_5"),
            ">=",
            0.99,
        ),
    ]
    if "truth" in results:  # issue 13's targets, on the truth pass
        return truth_targets(results) + [target_row(*row) for row in (*guard, *trust)]
    out = [
        ("model sessions: median % of best", m.get("pct_median"), ">=", 98.0),
        ("model sessions: 10th percentile % of best", m.get("pct_p10"), ">=", 93.0),
        ("model sessions: median real runs", m.get("runs_median"), "<=", 5),
        (
            "model beats random search (median % of best, same budget)",
            m.get("pct_median"),
            ">",
            by.get("random", {}).get("pct_median"),
        ),
        (
            "model beats Optuna TPE (median % of best, same budget)",
            m.get("pct_median"),
            ">",
            by.get("optuna_tpe", {}).get("pct_median"),
        ),
        ("System 1: median % of best with 0 runs", s1.get("model", {}).get("median"), ">=", 95.0),
        *guard,
        ("auto moves right", cal["auto_right"], ">=", 0.95),
        *trust,
    ]
    return [target_row(*row) for row in out]


def evaluate(
    model: Model,
    measurements: Sequence[Measurement],
    fingerprint: Any,
    *,
    seed: int = 0,
    thresholds: Thresholds | None = None,
    guard_retrain: bool = True,
    progress: Progress = _quiet,
    truth: Sequence[Measurement] | None = None,
    truth_repeats: int = TRUTH_REPEATS,
    session_repeats: int = SESSION_REPEATS,
    live: Sequence[replay.SessionOutcome] = (),
) -> Evaluation:
    """Score `model` on the held-out measurements among `measurements` (the device's log).

    Training data for the references and the leave-one-kernel-out retraining is what the model
    was trained on: the non-held-out measurements at the model's own training sizes.
    `truth`: the truth pass's measurements (truth.py); when given, results["truth"] scores
    every session on them (the observed-pass scores stay where they were). `live`: sessions
    run for real on these cells (live.py), scored beside the replay of their starts."""
    started = time.perf_counter()
    thresholds = thresholds or model.thresholds
    training = training_of(model, measurements)
    cells, skipped, held = _cells(model, measurements, training)
    space_for = model.space_for
    transfer = relative_table(aggregate(training))
    outcomes = _replay_sessions(
        model, cells, thresholds, seed, progress, transfer=transfer, training=training
    )
    outcomes += live
    from hpc_ds1.workloads import get_workload

    tiles = {c.workload: get_workload(c.workload).default_tile for c in cells}
    checks = [c for cell in cells for c in dc.check_cell(model, cell, space_for, thresholds)]
    guard_rows = (
        _guard_rows(model, cells, training, fingerprint, seed, thresholds, progress)
        if guard_retrain
        else []
    )
    model_sessions = [o.runs for o in outcomes if o.policy == "model"]
    results: dict[str, Any] = {
        "model_version": model.version,
        "device_id": model.device_id,
        "seed": seed,
        "thresholds": thresholds.model_dump(),
        "landscape": {
            "measurements": len(held),
            "cells": len(cells),
            "sizes": {w: sorted(c.size for c in cells if c.workload == w) for w in sorted(tiles)},
            "configurations_per_size": {w: len(space_for(w).configs()) for w in sorted(tiles)},
            "failed_configurations": sum(len(c.failed) for c in cells),
            "skipped": skipped,
            "noise": noise_summary(cells),
        },
        "sessions": {
            "starts": "every configuration of the space that ran successfully",
            "sessions_per_policy": len(model_sessions),
            "budget": _budget(model_sessions),
            "replayed_engineer": "approves every proposal, STOP included (model_engineer: "
            "the landscape answers: a move approved when its target is faster, a STOP when no "
            "neighbour is more than 2 % faster; a rejected move ends the session)",
            "table": session_table(outcomes),
        },
        "system1": system1(
            model, cells, _trained_best(training), tiles, space_for, thresholds, transfer
        ),
        "guard": {"kernels": guard_rows, "false_flags": dc.false_flags(checks)},
        "calibration": {
            "target": model.calibration_target,
            **dc.calibration_summary(checks, thresholds),
        },
    }
    if truth is not None:
        results["truth"], scores = truth_summary(
            cells, outcomes, truth, repeats=truth_repeats, session_repeats=session_repeats
        )
        results["truth"]["seed"] = seed
        points = truth_points(truth)
        results["truth"]["system1"] = system1_truth(results["system1"], points)
        results["truth"]["system1_versus"] = {
            other: system1_versus(
                results["system1"], points, "model", other, seed=seed, repeats=truth_repeats
            )
            for other in SYSTEM1_BASELINES
        }
        results["truth"]["model_interval"] = figure_interval(scores, "model", seed=seed)
        results["truth"]["versus"] = {
            other: versus(scores, "model", other, seed=seed)
            for other in VERSUS
            if any(o.policy == other for o in outcomes)
        }
        if live:
            results["live"] = live_summary(scores, seed=seed)
    results["targets"] = _targets(results)
    results["seconds"] = round(time.perf_counter() - started, 2)
    return Evaluation(results, outcomes, checks)


def _cells(
    model: Model, measurements: Sequence[Measurement], training: Sequence[Measurement]
) -> tuple[list[Cell], list[str], list[Measurement]]:
    held = [m for m in measurements if m.held_out]
    check_honest(model, held, training)
    cells, skipped = build_cells(
        [m for m in held if m.workload in model.workloads], model.space_for
    )
    if not cells:
        raise EvaluationError(
            "the held-out landscape is incomplete: "
            + ("; ".join(skipped) or "no held-out size of a workload this model knows")
            + "; run `hpc-ds1 evaluate` again to measure what is missing"
        )
    return cells, skipped, held


def truth_plan(
    model: Model,
    measurements: Sequence[Measurement],
    *,
    seed: int = 0,
    thresholds: Thresholds | None = None,
    near: float = NEAR_BEST,
    everything: bool = False,
    progress: Progress = _quiet,
    live: Sequence[replay.SessionOutcome] = (),
) -> dict[tuple[str, int], list[Config]]:
    """What the truth pass must measure: replay every policy on the observed pass (the same
    seeded replay `evaluate` makes), then every configuration within `near` of the observed
    best and every one a session ended on, the `live` ones included (truth.truth_configs)."""
    training = training_of(model, measurements)
    cells, _, _ = _cells(model, measurements, training)
    thresholds = thresholds or model.thresholds
    transfer = relative_table(aggregate(training))
    outcomes = _replay_sessions(
        model, cells, thresholds, seed, progress, transfer=transfer, training=training
    )
    outcomes += live
    plan = truth_configs(cells, outcomes, near=near, everything=everything)
    # System 1's picks too, so that they are scored on the truth pass as the sessions are.
    from hpc_ds1.workloads import get_workload

    tiles = {c.workload: get_workload(c.workload).default_tile for c in cells}
    chosen = system1(
        model, cells, _trained_best(training), tiles, model.space_for, thresholds, transfer
    )
    for cell, row in zip(cells, chosen["per_size"], strict=True):
        labels = {v["config"] for v in row.values() if isinstance(v, dict) and "config" in v}
        key = (cell.workload, cell.size)
        extra = {c for c in cell.points if c.label() in labels}
        plan[key] = sorted(set(plan.get(key, [])) | extra, key=Config.label)
    return plan


def run_live(
    model: Model,
    measurements: Sequence[Measurement],
    n: int,
    run_fn: RunFn,
    *,
    seed: int = 0,
    thresholds: Thresholds | None = None,
    on_session: Callable[[replay.SessionOutcome, list[LiveRun]], None] | None = None,
) -> list[replay.SessionOutcome]:
    """The live sessions (live.py) on the held-out cells among `measurements`."""
    training = training_of(model, measurements)
    cells, _, _ = _cells(model, measurements, training)
    return live_sessions(
        model,
        cells,
        thresholds or model.thresholds,
        n,
        run_fn,
        seed=seed,
        on_session=on_session,
    )


def _budget(model_runs: Sequence[int]) -> int:
    """The model's mean real runs per session, re-runs included, rounded up (issue 43: the
    median understated what the model spends; every policy gets its mean)."""
    return max(2, math.ceil(statistics.fmean(model_runs))) if model_runs else 2


def _replay_sessions(
    model: Model,
    cells: Sequence[Cell],
    thresholds: Thresholds,
    seed: int,
    progress: Progress,
    rule: KeepRule = DEFAULT_RULE,
    transfer: Table | None = None,
    training: Sequence[Measurement] = (),
) -> list[replay.SessionOutcome]:
    """Every policy from every start of every cell; "model_recommend" is the model's session
    from its own recommendation (where `hpc-ds1 tune` starts without --start) and
    "model_transfer" from the interpolated-transfer configuration: the same for every start,
    one per start, so each cell weighs the same in every policy's figures. With `training`
    (the setup's measurements), the baselines given the model's information too: always-STOP,
    the nearest trained size's best (lookup), start-then-lookup and TPE warm-started with
    that size's measurements (evaluation/baselines.py)."""
    starts = {id(c): sorted(c.points, key=Config.label) for c in cells}
    total = 2 * sum(len(s) for s in starts.values())
    done = 0
    outcomes: list[replay.SessionOutcome] = []
    setup = aggregate(training)
    trained: dict[str, list[int]] = {}
    for w, size, _ in setup:
        trained.setdefault(w, []).append(size)
    priors = {id(c): _nearest_prior(c, setup, trained) for c in cells}
    for cell in cells:
        space = model.space_for(cell.workload)
        prior = priors[id(cell)]
        looked_up = bl.setup_best(prior) if prior else None
        engineer = replay.landscape_engineer(cell, space)
        answer = pol.system1_answer(model, cell, space, thresholds)  # a session's PICK
        moved = _transfer_session(
            model, cell, space, thresholds, rule, seed, transfer, system1=answer
        )
        recommended = _recommend_session(model, cell, space, thresholds, rule, seed, answer)
        for start in starts[id(cell)]:
            for policy, answers in (("model", None), ("model_engineer", engineer)):
                outcomes.append(
                    replay.model_session(
                        model,
                        cell,
                        start,
                        space,
                        thresholds,
                        rule=rule,
                        seed=seed,
                        system1=answer,
                        engineer=answers,
                        policy=policy,
                    )
                )
            outcomes += [o for o in (recommended, moved) if o is not None]
            outcomes.append(pol.greedy_session(cell, start, space))
            outcomes.append(pol.exhaustive_session(cell, start, space))
            outcomes.append(bl.always_stop_session(cell, start))
            if prior:
                replayed = replay.replay_measure(cell, seed, rule.sigma_floor)
                outcomes.append(bl.lookup_session(cell, start, looked_up))
                outcomes.append(bl.start_then_lookup_session(cell, start, looked_up, replayed))
            done += 1
            progress("replaying model, greedy, exhaustive", done, total)
    budget = _budget([o.runs for o in outcomes if o.policy == "model"])
    rng = random.Random(seed)
    index = 0
    for cell in cells:
        space = model.space_for(cell.workload)
        for start in starts[id(cell)]:
            outcomes.append(pol.random_session(cell, start, space, budget, rng))
            outcomes.append(pol.tpe_session(cell, start, space, budget, seed + index))
            prior = priors[id(cell)]
            if prior:
                outcomes.append(
                    bl.knob_tpe_session(
                        cell,
                        start,
                        space,
                        budget,
                        seed + index,
                        prior=bl.scaled_to(prior, cell, start),
                        policy="optuna_tpe_warm",
                    )
                )
            index += 1
            done += 1
            progress(f"replaying random, Optuna TPE (budget {budget})", done, total)
    return outcomes


def _nearest_prior(
    cell: Cell, setup: Mapping[tuple[str, int, Config], Any], trained: Mapping[str, list[int]]
) -> dict[Config, float | None]:
    """The setup's measurements at the trained size nearest the cell's (seconds, None for a
    failure): what the model knew of this job before the session."""
    sizes = trained.get(cell.workload)
    if not sizes:
        return {}
    size = nearest_size(cell.size, sorted(set(sizes)))
    return bl.as_prior({c: o for (w, s, c), o in setup.items() if w == cell.workload and s == size})


def _recommend_session(
    model: Model,
    cell: Cell,
    space: Any,
    thresholds: Thresholds,
    rule: KeepRule,
    seed: int,
    system1: Any = None,
) -> replay.SessionOutcome | None:
    """The model's session from its own recommendation, as `hpc-ds1 tune` runs one without
    --start; None where that configuration failed at this size (nothing to replay from)."""
    start = model.recommend(cell.workload, cell.size, space=space, thresholds=thresholds).config
    if start not in cell.points:
        return None
    return replay.model_session(
        model,
        cell,
        start,
        space,
        thresholds,
        rule=rule,
        seed=seed,
        policy="model_recommend",
        system1=system1,
    )


def _transfer_session(
    model: Model,
    cell: Cell,
    space: Any,
    thresholds: Thresholds,
    rule: KeepRule,
    seed: int,
    transfer: Table | None,
    *,
    explore_first: bool = False,
    system1: Any = None,
) -> replay.SessionOutcome | None:
    """The model's session from the interpolated-transfer pick; a pick that fails at this size
    costs its run and the next pick is tried, as a real session would."""
    if not transfer or cell.workload not in transfer:
        return None
    scores = predict(transfer, cell.workload, cell.size, "interpolated")
    ranked = sorted(
        (c for c in scores if c in set(space.configs())), key=lambda c: (scores[c], c.label())
    )
    tried = 0
    for config in ranked:
        tried += 1
        if config in cell.points:
            out = replay.model_session(
                model,
                cell,
                config,
                space,
                thresholds,
                rule=rule,
                seed=seed,
                policy="model_transfer",
                explore_first=explore_first,
                system1=system1,
            )
            return replace(out, runs=out.runs + tried - 1)
    return None


def _guard_rows(
    model: Model,
    cells: Sequence[Cell],
    training: Sequence[Measurement],
    fingerprint: Any,
    seed: int,
    thresholds: Thresholds,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Leave one kernel out: retrain without it (same seed, same move estimator), then decide
    on its held-out states."""
    kernels = sorted({c.workload for c in cells})
    estimator = model.metadata.get("estimators", {}).get("move")
    rows = []
    for i, kernel in enumerate(kernels):
        progress(f"retraining without {kernel}", i, len(kernels))
        rest = [m for m in training if m.workload != kernel]
        try:
            trained = train(
                rest, fingerprint, seed=seed, candidates=[estimator] if estimator else None
            )
        except ValueError as error:
            rows.append({"kernel": kernel, "error": f"could not train without it: {error}"})
            continue
        blind = Model.from_onnx(trained.to_onnx(), thresholds)
        mine = [c for c in cells if c.workload == kernel]
        checks = [
            c for cell in mine for c in dc.check_cell(blind, cell, model.space_for, thresholds)
        ]
        rows.append(
            {**dc.guard_row(kernel, checks, thresholds), "retrained_version": blind.version}
        )
    progress("guard", len(kernels), len(kernels))
    return rows
