"""HPC-DS1's tuning of a `KnobSpace` on one device under a budget of runs (issue 42).

`tune(space, device, budget, seed, prior=None) -> Trace` is the product's answer to a space of
thousands of configurations, built from its own parts:

- **Budgeted setup by active learning.** A space-filling start (`spread`: a Latin hypercube
  over every knob's positions, each row moved to the nearest valid configuration), then a
  surrogate (`Surrogate`: extremely randomised trees on log runtime, whose per-tree spread is
  the uncertainty) chooses the next run by expected improvement over the best so far. A
  failed configuration is fed back as a slow one (`FAIL_PENALTY` above the slowest that ran),
  so the search learns where the failures lie without a second model.
- **System 1.** The surrogate's predicted fastest configuration not yet run is offered as a
  PICK (`session.PICK`) and judged against the best so far by the keep rule.
- **The session.** From the best so far, the KnobSpace's moves are tried in the order of the
  surrogate's predicted runtime (as `session.choose_move` takes the model's alternatives);
  each candidate is judged against the incumbent with `runner.keep.judge` (an ambiguous one is
  raced: incumbent and candidate re-run, a pair at a time); the session stops after
  `session.MAX_MISSES` misses in a row, or where the model predicts no untried move faster.
  Budget left: refit, PICK again, a few more active-learning runs, a new session.
- **Warm start (transfer through the fleet).** `prior`: other devices' measurements of the
  same kernel (their setups, as the coordinator holds them). Their log runtimes, each centred
  on its device's mean, give a consensus ranking; the new device runs the consensus best
  first (System 1), then configurations of the consensus's top `Settings.pool` spread apart
  (`prior_start`, `Settings.prior_runs` in all), and its surrogate takes the siblings'
  runtimes as extra features from then on.

Every run sent to the device counts against the budget: setup runs, PICKs, session moves and
race re-runs alike. A configuration is run once, except the deliberate re-runs of a race.
No decision reads the budget: the trace of a budget B is the first B runs of any larger
budget's trace, so a yardstick can score several budgets from one run.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
from sklearn.ensemble import ExtraTreesRegressor

from hpc_ds1.knobs import KnobConfig, KnobSpace
from hpc_ds1.runner.keep import DEFAULT_RULE, KeepRule, Sample, Verdict, geometric_mean, judge

from .session import MAX_MISSES, PICK, PendingMove, keeps_a_tied_pick

FAIL_PENALTY = math.log(2.0)  # a failure is fed back as twice as slow as the slowest run
Kind = Literal["setup", "learn", "prior", "pick", "move", "race"]
Prior = Sequence[Mapping[KnobConfig, float | None]]  # per sibling device: config -> s or None


class Outcome(Protocol):
    """What a device's run returns (`recorded.Recorded` is one)."""

    @property
    def seconds(self) -> float | None: ...

    @property
    def failure(self) -> str | None: ...


class Device(Protocol):
    def run(self, config: KnobConfig) -> Outcome: ...


@dataclass(frozen=True)
class Step:
    """One run on the device: what ran, why (`kind`), and what it returned."""

    config: KnobConfig
    kind: Kind
    seconds: float | None  # None: the run failed
    failure: str | None = None


@dataclass(frozen=True)
class Trace:
    """Every run of a tuning, in order, and the configuration it ends on (the incumbent)."""

    steps: tuple[Step, ...]
    best: KnobConfig | None

    @property
    def configs(self) -> tuple[KnobConfig, ...]:
        return tuple(s.config for s in self.steps)


@dataclass(frozen=True)
class Settings:
    """The search's hyperparameters (chosen on the convolution spaces, docs/yardstick.md)."""

    start: int = 6  # space-filling runs before the first surrogate (cold)
    learn: int = 4  # active-learning runs after the start, and again after each session
    prior_runs: int = 4  # warm: first runs from the consensus (`prior_start`; 12 spaces)
    pool: int = 10  # warm: the consensus's top configurations those runs are spread over
    trees: int = 32
    leaf: int = 2  # min_samples_leaf: smooths predictions, so a run point is not exact
    rule: KeepRule = field(default_factory=lambda: KeepRule(session_pairs=2))
    run_default: bool = False  # cold: run the space's default first (a job's current config)


# --- features ------------------------------------------------------------------------------


class Features:
    """Every valid configuration of a space, once, as a feature matrix (and its positions).

    Ordered knobs give their position and, for positive numbers, the log of their value;
    categories are one-hot; bools 0/1. Worked out once a space (`features_of`): the search
    predicts on every configuration at each step, vectorised."""

    def __init__(self, space: KnobSpace) -> None:
        self.configs = space.configs()
        self.index = {c: i for i, c in enumerate(self.configs)}
        columns: list[np.ndarray] = []
        positions: list[np.ndarray] = []
        for j, knob in enumerate(space.knobs):
            where = {v: i for i, v in enumerate(knob.values)}
            pos = np.array([where[c[j]] for c in self.configs], dtype=float)
            positions.append(pos / max(len(knob.values) - 1, 1))
            if knob.kind == "category":
                columns += [(pos == i).astype(float) for i in range(len(knob.values))]
                continue
            columns.append(pos)
            values = np.array([float(v) if not isinstance(v, str) else np.nan for v in knob.values])
            if np.all(values > 0):
                columns.append(np.log2(values)[pos.astype(int)])
        self.X = np.column_stack(columns) if columns else np.zeros((len(self.configs), 1))
        self.positions = np.column_stack(positions) if positions else self.X


_FEATURES: weakref.WeakKeyDictionary[KnobSpace, Features] = weakref.WeakKeyDictionary()


def features_of(space: KnobSpace) -> Features:
    """The space's `Features`, cached as long as the space lives."""
    if space not in _FEATURES:
        _FEATURES[space] = Features(space)
    return _FEATURES[space]


# --- the surrogate -------------------------------------------------------------------------


class Surrogate:
    """Extremely randomised trees on log runtime; the spread of the trees' predictions is the
    uncertainty that expected improvement needs (no Gaussian process: thousands of
    configurations, categories and holes from constraints are what trees take in their
    stride). scikit-learn habits: `__init__` stores, `fit` returns self."""

    def __init__(
        self, trees: int = 32, leaf: int = 2, seed: int = 0, bootstrap: bool = True
    ) -> None:
        self.trees, self.leaf, self.seed, self.bootstrap = trees, leaf, seed, bootstrap

    def fit(self, X: np.ndarray, y: np.ndarray) -> Surrogate:
        self.forest_ = ExtraTreesRegressor(
            n_estimators=self.trees,
            min_samples_leaf=min(self.leaf, max(1, len(y) // 4)),
            bootstrap=self.bootstrap and len(y) >= 8,
            random_state=self.seed,
        ).fit(X, y)
        return self

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation over the trees (log runtime)."""
        X32 = np.ascontiguousarray(X, dtype=np.float32)
        per_tree = np.stack([t.tree_.predict(X32)[:, 0] for t in self.forest_.estimators_])
        return per_tree.mean(axis=0), per_tree.std(axis=0)


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """EI below `best` (minimising log runtime); where the trees agree, the plain gain."""
    from scipy.stats import norm

    gain = best - mean
    safe = np.where(std > 1e-12, std, 1.0)
    z = gain / safe
    ei = gain * norm.cdf(z) + safe * norm.pdf(z)
    return np.where(std > 1e-12, ei, np.maximum(gain, 0.0))


def spread(
    positions: np.ndarray, n: int, rng: np.random.Generator, candidates: int = 16
) -> list[int]:
    """`n` valid configurations spread over the knobs' positions: each the farthest (L1 in
    position space, from those chosen) of `candidates` drawn at random from the valid ones.
    Drawn from the valid set, so the start follows where the valid configurations lie; a
    Latin hypercube over positions moved to the nearest valid configuration was tried first
    and piled the start onto the constraints' edges (extreme block sizes), slower than random
    search's first runs on four of the six convolution spaces (docs/yardstick.md)."""
    rows = positions.shape[0]
    n = min(n, rows)
    chosen = [int(rng.integers(rows))]
    nearest = np.abs(positions - positions[chosen[0]]).sum(axis=1)
    while len(chosen) < n:
        draw = rng.choice(rows, size=min(candidates, rows), replace=False)
        draw = draw[~np.isin(draw, chosen)]
        if not len(draw):
            draw = np.setdiff1d(np.arange(rows), chosen)
        i = int(draw[np.argmax(nearest[draw])])
        chosen.append(i)
        nearest = np.minimum(nearest, np.abs(positions - positions[i]).sum(axis=1))
    return chosen


def consensus(features: Features, prior: Prior) -> np.ndarray:
    """Per sibling device, each configuration's log runtime centred on that device's mean
    (a failure: `FAIL_PENALTY` above its slowest), one column a device. Centring lets
    devices of very different speeds agree on shape (as `model.transfer`'s relative runtimes
    do across sizes)."""
    columns = []
    for device in prior:
        logs = np.array(
            [
                math.log(s) if (s := device.get(c)) is not None and s > 0 else np.nan
                for c in features.configs
            ]
        )
        if np.isnan(logs).all():
            continue
        logs = np.where(np.isnan(logs), np.nanmax(logs) + FAIL_PENALTY, logs)
        columns.append(logs - logs.mean())
    return np.column_stack(columns) if columns else np.zeros((len(features.configs), 0))


def prior_start(columns: np.ndarray, positions: np.ndarray, runs: int, pool: int) -> list[int]:
    """The warm start's first `runs` rows: the consensus best (the lowest mean of `columns`,
    one a sibling device), then each the farthest (L1 in `positions`, from those chosen) of
    the consensus's `pool` best, ties to the better in consensus. Where the siblings agree on
    one region their best configurations are near copies of each other; spread over the top
    of the consensus, the start covers the few regions the fleet rates highly instead of
    spending its runs in one (docs/yardstick.md)."""
    if runs <= 0 or not len(columns):
        return []
    agreed = columns.mean(axis=1)
    top = np.argsort(agreed, kind="stable")[: max(pool, 1)]
    chosen = [int(top[0])]
    nearest = np.abs(positions[top] - positions[top[0]]).sum(axis=1)
    while len(chosen) < min(runs, len(top)):
        i = int(np.argmax(nearest))
        chosen.append(int(top[i]))
        nearest = np.minimum(nearest, np.abs(positions[top] - positions[top[i]]).sum(axis=1))
    return chosen


# --- the tuning ----------------------------------------------------------------------------


class _Spent(Exception):
    """The budget is used up: the tuning ends where it stands."""


class _Tuning:
    """One tuning's state: the runs so far, the incumbent and its samples, and the budget."""

    def __init__(
        self,
        space: KnobSpace,
        device: Device,
        budget: int,
        seed: int,
        settings: Settings,
        prior_columns: np.ndarray | None,
    ) -> None:
        self.space, self.device, self.budget, self.settings = space, device, budget, settings
        self.features = features_of(space)
        self.X = self.features.X
        if prior_columns is not None and prior_columns.shape[1]:
            self.X = np.column_stack([self.X, prior_columns, prior_columns.mean(axis=1)])
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.steps: list[Step] = []
        self.logs: dict[int, list[float]] = {}  # row -> log seconds of each ok run
        self.failed: set[int] = set()
        self.best: int | None = None  # the incumbent (a row)
        self.best_runs: list[Sample] = []
        self.fits = 0
        self.race_pairs = 0  # pairs raced in the current session (the rule's session budget)

    # runs

    def run(self, row: int, kind: Kind) -> float | None:
        """One run on the device (counted), recorded; its seconds, None when it failed."""
        if len(self.steps) >= self.budget:
            raise _Spent
        config = self.features.configs[row]
        outcome = self.device.run(config)
        ok = outcome.failure is None and outcome.seconds is not None and outcome.seconds > 0
        seconds = outcome.seconds if ok else None
        self.steps.append(Step(config, kind, seconds, None if ok else outcome.failure or "fail"))
        if seconds is None:
            self.failed.add(row)
        else:
            self.logs.setdefault(row, []).append(math.log(seconds))
        return seconds

    def ran(self, row: int) -> bool:
        return row in self.logs or row in self.failed

    def explore(self, row: int, kind: Kind) -> None:
        """A setup run: the fastest run so far becomes the incumbent (no keep rule: a setup
        measures, it does not change the job)."""
        seconds = self.run(row, kind)
        if seconds is None:
            return
        if self.best is None or math.log(seconds) < self._mean(self.best):
            self.best, self.best_runs = row, [Sample(seconds)]

    def _mean(self, row: int) -> float:
        return float(np.mean(self.logs[row]))

    # the model

    def fit(self) -> tuple[np.ndarray, np.ndarray]:
        """Refit on every run so far; mean and std of log runtime for every configuration."""
        rows = list(self.logs)
        y = [self._mean(r) for r in rows]
        failed = sorted(self.failed - set(self.logs))
        if failed:
            worst = max(y) if y else 0.0
            rows += failed
            y += [worst + FAIL_PENALTY] * len(failed)
        self.fits += 1
        model = Surrogate(self.settings.trees, self.settings.leaf, self.seed * 7919 + self.fits)
        model.fit(self.X[rows], np.array(y))
        return model.predict(self.X)

    def untried(self) -> np.ndarray:
        mask = np.ones(len(self.features.configs), dtype=bool)
        mask[list(self.logs)] = False
        mask[list(self.failed)] = False
        return mask

    def learn(self, runs: int) -> None:
        """Active learning: run what the surrogate expects to improve on most."""
        for _ in range(runs):
            if not self.logs:
                self._random_run("learn")
                continue
            mean, std = self.fit()
            ei = expected_improvement(mean, std, min(self._mean(r) for r in self.logs))
            ei[~self.untried()] = -np.inf
            if not np.isfinite(ei.max()):
                return
            self.explore(int(np.argmax(ei)), "learn")

    def _random_run(self, kind: Kind) -> None:
        free = np.flatnonzero(self.untried())
        if len(free):
            self.explore(int(self.rng.choice(free)), kind)

    # the keep rule

    def challenge(self, row: int, kind: Kind) -> bool | None:
        """Run `row` against the incumbent by the product's keep rule, racing an ambiguous
        candidate (incumbent, then candidate, each counted). True: kept (the new incumbent);
        False: a miss (failed, or slower beyond the noise); None: reverted within the noise."""
        seconds = self.run(row, kind)
        if seconds is None:
            return False
        if self.best is None:
            self.best, self.best_runs = row, [Sample(seconds)]
            return True
        candidate, pairs = [Sample(seconds)], 0
        raced_incumbent: list[Sample] = []
        while True:
            verdict = judge(
                self.best_runs + raced_incumbent,
                candidate,
                pairs,
                self.settings.rule,
                self.race_pairs + pairs,
            )
            if verdict.outcome != "race":
                break
            pairs += 1
            inc = self.run(self.best, "race")
            cand = self.run(row, "race")
            if inc is not None:
                raced_incumbent.append(Sample(inc))
            if cand is not None:
                candidate.append(Sample(cand))
        self.race_pairs += pairs
        return self._resolve(row, kind, verdict, candidate, raced_incumbent)

    def _resolve(
        self,
        row: int,
        kind: Kind,
        verdict: Verdict,
        candidate: list[Sample],
        raced_incumbent: list[Sample],
    ) -> bool | None:
        tied_pick = kind == "pick" and keeps_a_tied_pick(
            PendingMove(0, PICK, "", "auto", 0.0), verdict
        )
        if verdict.kept or tied_pick:
            self.best, self.best_runs = row, candidate
            return True
        self.best_runs = self.best_runs + raced_incumbent
        return False if verdict.miss else None

    # System 1 and the session

    def pick(self, mean: np.ndarray) -> None:
        """System 1: the predicted fastest configuration not yet run, judged as a PICK."""
        free = self.untried()
        if free.any():
            self.challenge(int(np.flatnonzero(free)[np.argmin(mean[free])]), "pick")

    def session(self, mean: np.ndarray) -> None:
        """From the incumbent, its moves in the order of predicted runtime; the model's STOP
        where no untried move is predicted faster than the incumbent (after one move at
        least); the session's end after MAX_MISSES misses in a row."""
        misses, moved = 0, False
        tried: set[int] = set()
        while misses < MAX_MISSES and self.best is not None:
            here = self.best
            moves = [
                self.features.index[c]
                for c in self.space.neighbours(self.features.configs[here]).values()
            ]
            moves = [m for m in moves if not self.ran(m) and m not in tried]
            if not moves:
                return
            nxt = min(moves, key=lambda m: mean[m])
            if moved and mean[nxt] >= mean[here]:
                return  # the model's STOP
            tried.add(nxt)
            moved = True
            kept = self.challenge(nxt, "move")
            if kept:
                misses = 0
                mean, _ = self.fit()
            elif kept is False:
                misses += 1

    def warm(self, prior_columns: np.ndarray) -> None:
        """System 1 from the fleet (the consensus best), then the top of the consensus spread
        apart (`prior_start`)."""
        s = self.settings
        for row in prior_start(prior_columns, self.features.positions, s.prior_runs, s.pool):
            self.explore(row, "prior")

    def cold(self) -> None:
        s = self.settings
        rows = spread(self.features.positions, s.start, self.rng)
        if s.run_default:
            default = self.features.index.get(self.space.default())
            if default is not None:
                rows = [default, *[r for r in rows if r != default]][: s.start]
        for row in rows:
            self.explore(row, "setup")
        self.learn(s.learn)

    def loop(self) -> None:
        """PICK, session, active learning, again, until the budget or the space runs out."""
        while self.untried().any():
            self.race_pairs = 0  # a new session: the rule's session budget starts again
            mean, _ = self.fit()
            self.pick(mean)
            mean, _ = self.fit()
            self.session(mean)
            self.learn(self.settings.learn)


def tune(
    space: KnobSpace,
    device: Device,
    budget: int,
    seed: int = 0,
    prior: Prior | None = None,
    settings: Settings | None = None,
) -> Trace:
    """HPC-DS1's tuning of `space` on `device` with at most `budget` runs (see the module).
    `prior`: other devices' measurements of the same kernel, one mapping per device (a
    configuration's seconds, None where it failed); None: a cold start."""
    settings = settings or Settings()
    features = features_of(space)
    columns = consensus(features, prior) if prior else None
    if columns is not None and not columns.shape[1]:
        columns = None
    tuning = _Tuning(space, device, budget, seed, settings, columns)
    try:
        if columns is not None:
            tuning.warm(columns)
        else:
            tuning.cold()
        tuning.loop()
    except _Spent:
        pass
    best = None if tuning.best is None else features.configs[tuning.best]
    return Trace(tuple(tuning.steps), best)


def budgeted_setup(
    space: KnobSpace,
    device: Device,
    budget: int,
    seed: int = 0,
    rounds: int = 10,
    prior: Prior | None = None,
) -> Trace:
    """`setup --budget`: measure at most `budget` configurations, each once, chosen by what
    the surrogate expects to learn: a space-filling start of a tenth of the budget, then
    `rounds` batches, each the configurations of highest expected improvement under a refit.
    Batches, not one run a fit: a setup of hundreds of runs would otherwise spend more time
    fitting than measuring. `prior` (`setup --budget --warm`): the fleet's measurements of the
    same kernel, one mapping per sibling device; the start is then the top of their consensus
    spread apart (`prior_start`: `Settings.prior_runs` runs, or a tenth of a larger budget),
    and the surrogate reads the consensus as features."""
    settings = Settings()
    columns = consensus(features_of(space), prior) if prior else None
    if columns is not None and not columns.shape[1]:
        columns = None
    tuning = _Tuning(space, device, budget, seed, settings, columns)
    features = tuning.features
    budget = min(budget, len(features.configs))
    try:
        if columns is not None:  # as `tune`'s warm start, or a tenth of a larger budget
            runs = max(settings.prior_runs, budget // 10)
            for row in prior_start(columns, features.positions, runs, max(settings.pool, runs)):
                tuning.explore(row, "prior")
        else:
            for row in spread(features.positions, max(2, budget // 10), tuning.rng):
                tuning.explore(row, "setup")
        while len(tuning.steps) < budget and tuning.untried().any():
            batch = max(1, math.ceil((budget - len(tuning.steps)) / max(rounds, 1)))
            batch = max(batch, math.ceil(budget / (2 * max(rounds, 1))))
            mean, std = tuning.fit()
            best = min(tuning._mean(r) for r in tuning.logs) if tuning.logs else 0.0
            ei = expected_improvement(mean, std, best)
            ei[~tuning.untried()] = -np.inf
            for row in np.argsort(-ei, kind="stable")[:batch]:
                if np.isfinite(ei[row]):
                    tuning.explore(int(row), "learn")
    except _Spent:
        pass
    return Trace(
        tuple(tuning.steps), None if tuning.best is None else features.configs[tuning.best]
    )


def system1(space: KnobSpace, steps: Sequence[Step], seed: int = 0) -> KnobConfig | None:
    """System 1's answer after a setup: the configuration the surrogate trained on `steps`
    predicts fastest, over the whole space (measured or not). The trees here interpolate
    (leaves of one run, no bootstrap): a setup's runs are the evidence, and the smoothing the
    search wants for its uncertainty left System 1 at 0.81-0.97 of the optimum after an
    exhaustive setup of the convolution spaces, not at its best run (docs/yardstick.md)."""
    features = features_of(space)
    logs: dict[int, list[float]] = {}
    failed: set[int] = set()
    for s in steps:
        row = features.index[s.config]
        if s.seconds:
            logs.setdefault(row, []).append(math.log(s.seconds))
        else:
            failed.add(row)
    if not logs:
        return None
    rows = list(logs)
    y = [float(np.mean(logs[r])) for r in rows]
    worst = max(y)
    rows += sorted(failed - set(logs))
    y += [worst + FAIL_PENALTY] * (len(rows) - len(y))
    mean, _ = (
        Surrogate(Settings().trees, leaf=1, seed=seed, bootstrap=False)
        .fit(features.X[rows], np.array(y))
        .predict(features.X)
    )
    return features.configs[int(np.argmin(mean))]


def incumbent_seconds(trace: Trace) -> float | None:
    """The geometric mean of the runs of the configuration a trace ends on."""
    runs = [Sample(s.seconds) for s in trace.steps if s.config == trace.best and s.seconds]
    return geometric_mean(runs) if runs else None


__all__ = [
    "DEFAULT_RULE",
    "Features",
    "Settings",
    "Step",
    "Surrogate",
    "Trace",
    "budgeted_setup",
    "consensus",
    "expected_improvement",
    "features_of",
    "prior_start",
    "spread",
    "system1",
    "tune",
]
