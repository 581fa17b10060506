"""Baselines given the information the model has (issue 43, item 4), over any configuration
space, its own knobs included.

- `lookup`: the fastest configuration this machine's setup measured, with no run: what an
  engineer who reads the setup's table would run.
- `start_then_lookup`: run the start and the lookup, keep the faster as measured.
- `knob_tpe_session`: Optuna's TPE over the space's knobs (every knob of `knob_view`, so a
  job's own knobs and constraints too); with `prior`, the setup's measurements enter the study
  as completed trials first ("warm"): they cost nothing, and only what it runs here counts.

A configuration the constraints refuse is never run and costs nothing (its trial is pruned);
a configuration run before is answered from the study's history, as Kernel Tuner counts."""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from hpc_ds1.model.replay import Cell, Measure, SessionOutcome, session_outcome
from hpc_ds1.space import Config, ConfigSpace, knob_view

from .policies import fastest_ran

STALE = 100  # TPE suggestions in a row that bring no new configuration before it stops
# A prior of thousands of trials costs TPE a pass over all of them at every suggestion (0.24 s
# an ask at 4,362). Its density of good configurations is fitted on its best min(10 %, 25)
# trials only (optuna's default gamma), so the prior keeps its best PRIOR_BEST, which hold
# those whole, and a seeded sample of PRIOR_REST of the others for the density of the rest.
PRIOR_BEST, PRIOR_REST = 100, 300


def lookup_session(cell: Cell, start: Config, setup_best: Config | None) -> SessionOutcome:
    """The setup's fastest configuration, no run (the start where the setup has none)."""
    final = setup_best if setup_best is not None else start
    return session_outcome("lookup", cell, start, final, 0, finish="lookup")


def start_then_lookup_session(
    cell: Cell, start: Config, setup_best: Config | None, measure: Measure
) -> SessionOutcome:
    """Run the start and the setup's fastest; keep the faster as this run measured them."""
    ran = [start] if setup_best in (None, start) else [start, setup_best]
    seen = {c: measure(c, 0) for c in ran}
    ok = {c: r.runtime_s for c, r in seen.items() if r is not None}
    final = min(ok, key=lambda c: ok[c]) if ok else start
    return session_outcome(
        "start_then_lookup", cell, start, final, len(ran), finish="lookup", ran=tuple(ran)
    )


def knob_tpe_session(
    cell: Cell,
    start: Config,
    space: ConfigSpace,
    budget: int,
    seed: int,
    *,
    prior: Mapping[Config, float | None] | None = None,
    policy: str = "optuna_tpe",
    truth: Callable[[Config], float | None] | None = None,
) -> SessionOutcome:
    """A real Optuna TPE study, seeded, over the space's knobs (an ordered knob as an integer
    position, a category as a categorical); the start is its first trial; `prior`
    (configuration -> measured seconds, None for a failure) enters as completed trials before
    it. It runs at most `budget` configurations of the cell; `truth` (default: the cell's
    runtime) is what a run returns."""
    import optuna
    from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    view = knob_view(space)
    knobs = view.knobs.knobs
    stepped = [k.ordered and len(k.values) > 1 for k in knobs]
    distributions: dict[str, BaseDistribution] = {
        k.name: IntDistribution(0, len(k.values) - 1)
        if step
        else CategoricalDistribution(list(range(len(k.values))))
        for k, step in zip(knobs, stepped, strict=True)
    }
    index = [{v: i for i, v in enumerate(k.values)} for k in knobs]

    def params(config: Config) -> dict[str, int]:
        values = view.values(config)
        return {k.name: index[i][v] for i, (k, v) in enumerate(zip(knobs, values, strict=True))}

    slowest = max(p.runtime_s for p in cell.points.values())
    penalty = 10.0 * slowest  # a failed configuration, as TPE must rank it somewhere
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna's experimental-feature notes
        if prior:
            prior = thinned(prior, seed)
            study.add_trials(
                [
                    create_trial(
                        params=params(c),
                        distributions=distributions,
                        value=penalty if s is None or not math.isfinite(s) else s,
                    )
                    for c, s in prior.items()
                ]
            )
        study.enqueue_trial(params(start))
        answer = truth or (lambda c: p.runtime_s if (p := cell.points.get(c)) else None)
        ran: dict[Config, float | None] = {}
        asks, stale, wanted = 0, 0, min(budget, len(space.configs()))
        while len(ran) < wanted and asks < 20 * max(budget, 1) and stale < STALE:
            asks += 1
            trial = study.ask()
            values = tuple(
                k.values[
                    trial.suggest_int(k.name, 0, len(k.values) - 1)
                    if step
                    else trial.suggest_categorical(k.name, list(range(len(k.values))))
                ]
                for k, step in zip(knobs, stepped, strict=True)
            )
            stale += 1
            if not view.knobs.contains(values):
                study.tell(trial, state=TrialState.PRUNED)
                continue
            config = view.config(values)
            if config not in ran:
                stale = 0
                ran[config] = answer(config)
            value = ran[config]
            study.tell(trial, penalty if value is None else value)
    final = fastest_ran(cell, ran) or start
    return session_outcome(policy, cell, start, final, len(ran), finish="budget", ran=tuple(ran))


def thinned(prior: Mapping[Config, float | None], seed: int) -> dict[Config, float | None]:
    """At most PRIOR_BEST + PRIOR_REST trials of a prior: its fastest PRIOR_BEST, and a
    seeded sample of the others (failures among them)."""
    if len(prior) <= PRIOR_BEST + PRIOR_REST:
        return dict(prior)
    ranked = sorted(prior, key=lambda c: (prior[c] is None, prior[c] or 0.0, c.label()))
    rest = random.Random(f"prior:{seed}").sample(ranked[PRIOR_BEST:], PRIOR_REST)
    return {c: prior[c] for c in (*ranked[:PRIOR_BEST], *rest)}


def always_stop_session(cell: Cell, start: Config) -> SessionOutcome:
    """Keep the start: the session that stops at once (its one run is the start's)."""
    return session_outcome("always_stop", cell, start, start, 1, finish="stop", ran=(start,))


def scaled_to(
    prior: Mapping[Config, float | None], cell: Cell, start: Config
) -> dict[Config, float | None]:
    """Another size's measurements on this cell's scale: times the start's runtime here over
    its runtime there (unchanged where the prior lacks the start), so TPE ranks the prior's
    trials and its own runs on one scale."""
    there, here = prior.get(start), cell.points.get(start)
    if not there or here is None:
        return dict(prior)
    ratio = here.runtime_s / there
    return {c: None if s is None else s * ratio for c, s in prior.items()}


def setup_best(measured: Mapping[Config, float | None]) -> Config | None:
    """The fastest configuration among the setup's measurements (None: none ran)."""
    ok = {c: s for c, s in measured.items() if s is not None}
    return min(ok, key=lambda c: (ok[c], c.label())) if ok else None


def as_prior(measured: Mapping[Config, Any]) -> dict[Config, float | None]:
    """Aggregated outcomes (model.labels.aggregate) as TPE's prior: seconds, None if failed."""
    return {c: o.runtime_s if o.ok else None for c, o in measured.items()}
