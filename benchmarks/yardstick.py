"""The yardstick (issue 42, items 4 and 5): HPC-DS1's tuning and the baselines, side by side on
recorded spaces, with bootstrap intervals on every paired difference.

    .venv/bin/python benchmarks/yardstick.py SPACE [SPACE ...] [--kernel T1.json]
        [--budgets 5,10,20,50,100] [--seeds 3] [--seed-start 0] [--setup-check SEEDS]
        [--policies hpcds1,hpcds1_warm,random,optuna_tpe,kt:greedy_ils,...] [--json OUT]
        [--home HOME]

SPACE is a recorded file (a Kernel Tuner cache or a T4 file, plain or `.gz`, see
`hpc_ds1.workloads.recorded_space`) or a folder of them; `--kernel` names the T1 kernel file whose
`Conditions` are the constraints (needed for T4 files; for a hub cache under
`cachefiles/<name>/` the hub's `kernels/<name>.json` is found by itself).

Counting: every run on the device counts against the budget, a failed configuration too. A
configuration a policy has already run is not run again (each baseline keeps its results, as
Kernel Tuner's cache does), so it costs nothing. Constraint-violating suggestions are never sent
to the device and cost nothing either. Each found configuration is scored by its recorded mean
(the truth), not by the noisy draw the policy saw.

Policies:
- `hpcds1`: HPC-DS1 from cold, `hpc_ds1.tuning.search.tune` (budgeted setup by active learning,
  System 1's PICK, sessions under the keep rule) on `RecordedDevice(space, seed)`: it sees the
  recorded noise. Its race re-runs are runs: each counts, so its runs may repeat a
  configuration. No decision of it reads the budget: the run at B is the first B runs.
- `hpcds1_warm`: the same, leaving this GPU out: the other recorded devices of the kernel in the
  same folder (`siblings_of`: same knobs and configurations, another GPU; a T4 twin is the same
  GPU) are its prior, each as an exhaustive setup would have measured it (one drawn repeat a
  configuration, `fleet_prior`). Only this device's runs count. Skipped without siblings.
- `random`: random search without replacement over the valid configurations (recorded failures
  included: they cost a run).
- `optuna_tpe`: Optuna's TPE sampler (seeded); an ordered knob is an integer index, a category
  a categorical. A suggestion the constraints refuse is told PRUNED and not run; a repeat is told
  its earlier value and not run; a failure is told FAIL. It sees the draw of
  `RecordedDevice(space, seed)`, i.e. the recorded noise. It stops after 20 x budget
  suggestions, or 100 in a row without a new valid configuration (shown as fewer runs).
- `kt:<strategy>`: Kernel Tuner's strategy in simulation mode on the (ungzipped, copied) cache,
  with `max_fevals=B`, one tuning run per budget and seed (a strategy's behaviour depends on its
  budget), `numpy`/`random` seeded. Kernel Tuner counts each configuration the first time it
  is served from the cache, failures included, and serves repeats and refused configurations
  without counting: that is this script's counting. Its runs are read back from the results in
  order (first visits only) and checked against the budget. It sees the cache's `time`, the
  recorded mean (no noise). Kernel Tuner reads only its own cache format: T4 files skip it.

Scores, per policy and budget B over the seeds: the fraction of the optimum (optimum mean /
best found mean; 0 while nothing has run successfully), median and p10; and the
autotuning-methodology performance score (`autotuning_methodology.baseline.
RandomSearchCalculatedBaseline`, its default `include_nan=False`: the calculated random search
over the configurations that ran): the standardised curve (found - random) / (optimum - random)
at each of 1..B runs, averaged over 1..B, on the curve of the mean over seeds of the best found
so far (the methodology's mean curve). A seed enters the mean from its first success on; fevals
where no seed has a success yet, or where the random curve already equals the optimum (0/0,
small spaces), are left out of the average. `-` where the methodology package is not installed.

Intervals: seeds are resampled with replacement (`RESAMPLES` = 2000, seeded, so they repeat),
the same seeds for both policies of a pair (seed s of each ran on the same draws of the device),
and the score recomputed on each resample; 95 % percentile intervals. Across spaces, the mean
of the per-space differences, each space's seeds resampled on their own. `--setup-check`: per
space, System 1's pick (`search.system1`) from a surrogate trained on every configuration (one
drawn repeat each) against one trained on an active-learning setup of 15 % of the runs
(`search.budgeted_setup`), fraction of the optimum, paired over seeds. Several spaces end with
a summary (one row a space, Kernel Tuner's best strategy chosen by its mean score over them)
and the pooled lines; `--json` writes every figure, the per-seed fractions and the intervals.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "libs"))

from hpc_ds1.knobs import KnobConfig  # noqa: E402
from hpc_ds1.tuning import search  # noqa: E402
from hpc_ds1.workloads.recorded_files import hub_kernel_for  # noqa: E402
from hpc_ds1.workloads.recorded_space import RecordedDevice, RecordedSpace  # noqa: E402

BUDGETS = (5, 10, 20, 50, 100)
KT_STRATEGIES = (
    "genetic_algorithm",
    "dual_annealing",
    "greedy_ils",
    "simulated_annealing",
    "bayes_opt",
)
STALE = 100  # TPE suggestions in a row without a new valid configuration before it stops
HPCDS1 = ("hpcds1", "hpcds1_warm")
POLICIES = (*HPCDS1, "random", "optuna_tpe", *(f"kt:{s}" for s in KT_STRATEGIES))
RESAMPLES = 2000
SETUP_FRACTION = 0.15


@dataclass(frozen=True)
class Run:
    """One policy's runs on the device for one seed and budget, in order."""

    policy: str
    seed: int
    budget: int
    configs: tuple[KnobConfig, ...]  # HPC-DS1's hold a race's re-runs: each one counted
    reported: int | None = None  # the policy's own count of runs (Kernel Tuner's), if any


def best_curve(space: RecordedSpace, run: Run, upto: int) -> list[float | None]:
    """The best recorded mean found after 1..upto runs (None before the first success)."""
    best: float | None = None
    curve: list[float | None] = []
    for i in range(upto):
        if i < len(run.configs):
            mean = space.mean(run.configs[i])
            if mean is not None and (best is None or mean < best):
                best = mean
        curve.append(best)
    return curve


# --- policies ------------------------------------------------------------------------------


def random_search(space: RecordedSpace, seed: int, budget: int) -> Run:
    configs = list(space.space.configs())
    random.Random(seed).shuffle(configs)
    return Run("random", seed, budget, tuple(configs[:budget]))


def optuna_tpe(space: RecordedSpace, seed: int, budget: int) -> Run:
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    knobs = space.space.knobs
    device = RecordedDevice(space, seed)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    seen: dict[KnobConfig, float | None] = {}
    order: list[KnobConfig] = []
    asks, limit, stale = 0, 20 * budget, 0
    budget = min(budget, space.space.count())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while len(order) < budget and asks < limit and stale < STALE:
            asks += 1
            trial = study.ask()
            values = []
            for k in knobs:
                if k.ordered and len(k.values) > 1:
                    values.append(k.values[trial.suggest_int(k.name, 0, len(k.values) - 1)])
                else:
                    index = trial.suggest_categorical(k.name, list(range(len(k.values))))
                    values.append(k.values[index])
            config = tuple(values)
            stale += 1
            if not space.space.contains(config):
                study.tell(trial, state=TrialState.PRUNED)
                continue
            if config not in seen:
                stale = 0
                result = device.run(config)
                seen[config] = result.seconds
                order.append(config)
            value = seen[config]
            if value is None:
                study.tell(trial, state=TrialState.FAIL)
            else:
                study.tell(trial, value)
    return Run("optuna_tpe", seed, budget, tuple(order))


def hpcds1(space: RecordedSpace, seed: int, budget: int) -> Run:
    """HPC-DS1 from cold: `hpc_ds1.tuning.search.tune` on the recorded device, no prior."""
    trace = search.tune(space.space, RecordedDevice(space, seed), budget, seed=seed)
    return Run("hpcds1", seed, budget, trace.configs)


def siblings_of(
    space: RecordedSpace, candidates: Sequence[Path], kernel: Path | None = None
) -> list[RecordedSpace]:
    """The other recorded devices of the same kernel: files beside `space` with the same knobs
    and the same recorded configurations, of another device (a T4 twin of the same GPU is
    not a sibling): the leave-one-GPU-out fleet."""
    out: list[RecordedSpace] = []
    seen = {space.device, gpu_of(Path(space.path))}
    for path in candidates:
        if gpu_of(Path(path)) in seen:
            continue
        try:
            other = RecordedSpace.load(path, kernel=kernel or hub_kernel_for(Path(path)))
        except (ValueError, KeyError):
            continue  # not a recorded space of this kernel
        if (
            other.device not in seen
            and other.space.names == space.space.names
            and set(other.records) == set(space.records)
        ):
            out.append(other)
            seen |= {other.device, gpu_of(Path(path))}
    return out


def gpu_of(path: Path) -> str:
    """The GPU a recorded file names: `A100` for A100.json.gz and its T4 twin A100_T4.json.gz
    (a T4 file records no device name)."""
    name = path.name.removesuffix(".gz").removesuffix(".json")
    return name.removesuffix("_T4")


def fleet_prior(siblings: Sequence[RecordedSpace], seed: int) -> search.Prior:
    """What the coordinator knows of the siblings: an exhaustive setup of each, one run a
    configuration (one recorded repeat drawn, seeded), failures as failed."""
    prior = []
    for k, sibling in enumerate(siblings):
        device = RecordedDevice(sibling, 10_000 + 100 * seed + k)
        prior.append({c: device.run(c).seconds for c in sibling.records})
    return prior


def hpcds1_warm(
    space: RecordedSpace, seed: int, budget: int, siblings: Sequence[RecordedSpace]
) -> Run:
    """HPC-DS1 leaving this GPU out: the siblings' setups are its prior; only this device's
    runs count."""
    prior = fleet_prior(siblings, seed)
    trace = search.tune(space.space, RecordedDevice(space, seed), budget, seed=seed, prior=prior)
    return Run("hpcds1_warm", seed, budget, trace.configs)


class KernelTunerCache:
    """The space's Kernel Tuner cache, ungzipped into a temporary folder (KT may write to it)."""

    def __init__(self, space: RecordedSpace) -> None:
        self.space = space
        self.folder = tempfile.TemporaryDirectory(prefix="yardstick-kt-")
        self.path = Path(self.folder.name) / "cache.json"
        source = Path(space.path)
        opener: Callable[..., Any] = gzip.open if source.suffix == ".gz" else open
        with opener(source, "rb") as fin, open(self.path, "wb") as fout:
            shutil.copyfileobj(fin, fout)
        with open(self.path) as f:
            data = json.load(f)
        self.kernel_name = data["kernel_name"]
        self.problem_size = data.get("problem_size")
        keys = data["tune_params_keys"]
        self.tune_params = {k: list(data["tune_params"][k]) for k in keys}
        self.restrictions = [c.text for c in space.space.constraints]

    def run(self, strategy: str, seed: int, budget: int) -> Run:
        import kernel_tuner
        import numpy as np

        random.seed(seed)
        np.random.seed(seed)
        problem_size = self.problem_size
        if isinstance(problem_size, list):
            problem_size = tuple(problem_size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results, _env = kernel_tuner.tune_kernel(
                self.kernel_name,
                "// simulation mode: the cache answers",
                problem_size,
                [],
                self.tune_params,
                restrictions=self.restrictions or None,
                cache=str(self.path),
                simulation_mode=True,
                strategy=strategy,
                strategy_options={"max_fevals": budget},
                verbose=False,
                quiet=True,
            )
        names = list(self.tune_params)
        order: list[KnobConfig] = []
        seen: set[KnobConfig] = set()
        for result in results:
            config = self.space.space.config({n: result[n] for n in names})
            if config not in seen:
                seen.add(config)
                order.append(config)
        return Run(f"kt:{strategy}", seed, budget, tuple(order), reported=len(order))

    def close(self) -> None:
        self.folder.cleanup()


# --- scores --------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of a non-empty sequence."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def fraction(optimum: float, found: float | None) -> float:
    return 0.0 if found is None else optimum / found


def random_curve(space: RecordedSpace, budget: int) -> Any:
    """The methodology's calculated random search over 1..budget runs (None: not installed)."""
    try:
        import numpy as np
        from autotuning_methodology.baseline import RandomSearchCalculatedBaseline
    except ImportError:
        return None
    means = sorted(m for c in space.records if (m := space.mean(c)) is not None)
    optimum = means[0]
    ascending = np.array(means)
    failed = len(space.records) - len(means)
    stats = SimpleNamespace(
        objective_performances_total_sorted=ascending,
        objective_performances_total_sorted_nan=np.concatenate(
            [ascending, np.full(failed, np.nan)]
        ),
        minimization=True,
        total_performance_absolute_optimum=lambda: optimum,
    )
    baseline = RandomSearchCalculatedBaseline(stats)  # type: ignore[arg-type]
    return baseline.get_curve_over_fevals(np.arange(1, budget + 1))


def curves(space: RecordedSpace, runs: Sequence[Run], budget: int) -> Any:
    """Best recorded mean found after 1..budget runs, one row a seed (NaN before a success)."""
    import numpy as np

    return np.array(
        [[np.nan if v is None else v for v in best_curve(space, r, budget)] for r in runs],
        dtype=float,
    )


def scores_of(found: Any, rand: Any, optimum: float) -> Any:
    """The methodology score of seed-sets: `found` (..., seeds, fevals) -> (...). The mean
    curve over the seeds, standardised against random search and the optimum, averaged over
    the fevals where it is defined (see the module)."""
    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean_curve = np.nanmean(found, axis=-2)
        division = optimum - rand
        standard = np.where(
            division != 0, (mean_curve - rand) / np.where(division, division, 1), np.nan
        )
        return np.nanmean(standard, axis=-1)


def methodology_scores(
    space: RecordedSpace, runs_by_budget: dict[int, list[Run]]
) -> dict[int, float] | None:
    """The autotuning-methodology performance score per budget (see the module)."""
    optimum = space.optimum()[1]
    out: dict[int, float] = {}
    for budget, runs in runs_by_budget.items():
        rand = random_curve(space, budget)
        if rand is None:
            return None
        out[budget] = float(scores_of(curves(space, runs, budget), rand, optimum))
    return out


def resamples(n_seeds: int, n: int, seed: int) -> Any:
    """`n` bootstrap resamples of seed indices (n, n_seeds), seeded: intervals repeat."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, n_seeds, size=(n, n_seeds))


def interval(draws: Any) -> tuple[float, float]:
    """The 95 % percentile interval of bootstrap draws."""
    import numpy as np

    lo, hi = np.nanpercentile(draws, [2.5, 97.5])
    return float(lo), float(hi)


def score_draws(
    space: RecordedSpace, ours: Sequence[Run], theirs: Sequence[Run], budget: int, index: Any
) -> Any:
    """Bootstrap draws of score(ours) - score(theirs): the same resampled seeds for both (a
    paired difference: seed s of each policy ran on the same draws of the device)."""
    rand = random_curve(space, budget)
    optimum = space.optimum()[1]
    a, b = curves(space, ours, budget), curves(space, theirs, budget)
    return scores_of(a[index], rand, optimum) - scores_of(b[index], rand, optimum)


def fraction_draws(space: RecordedSpace, runs: Sequence[Run], budget: int, index: Any) -> Any:
    """Bootstrap draws of the median fraction of the optimum over the seeds."""
    import numpy as np

    optimum = space.optimum()[1]
    fr = np.array([fraction(optimum, best_curve(space, r, budget)[-1]) for r in runs])
    return np.median(fr[index], axis=-1)


def setup_check(
    space: RecordedSpace, seeds: Sequence[int], share: float = SETUP_FRACTION
) -> dict[str, Any]:
    """Budgeted setup against an exhaustive one (issue 42's target): per seed, the fraction of
    the optimum of System 1's pick from a surrogate trained on every configuration (one draw
    each) and from active learning with `share` of the runs; the paired difference with its
    bootstrap interval."""
    import numpy as np

    optimum = space.optimum()[1]
    configs = list(space.records)
    budget = max(1, int(share * len(configs)))
    full, budgeted = [], []
    for seed in seeds:
        device = RecordedDevice(space, seed)
        steps = [search.Step(c, "setup", (r := device.run(c)).seconds, r.failure) for c in configs]
        pick = search.system1(space.space, steps, seed)
        full.append(fraction(optimum, space.mean(pick) if pick else None))
        trace = search.budgeted_setup(space.space, RecordedDevice(space, seed), budget, seed)
        assert len(trace.steps) <= budget and len(set(trace.configs)) == len(trace.configs)
        pick = search.system1(space.space, trace.steps, seed)
        budgeted.append(fraction(optimum, space.mean(pick) if pick else None))
    diff = np.array(budgeted) - np.array(full)
    index = resamples(len(diff), RESAMPLES, 42)
    return {
        "runs": budget,
        "of": len(configs),
        "exhaustive": float(np.median(full)),
        "budgeted": float(np.median(budgeted)),
        "difference": float(diff.mean()),
        "interval": interval(diff[index].mean(axis=1)),
    }


# --- driver --------------------------------------------------------------------------------


def evaluate(
    space: RecordedSpace,
    budgets: Sequence[int],
    seeds: Sequence[int],
    policies: Sequence[str],
    siblings: Sequence[RecordedSpace] = (),
    timings: dict[str, float] | None = None,
) -> dict[str, dict[int, list[Run]]]:
    """Every policy's runs, by budget, one per seed. `hpcds1_warm` needs `siblings` (skipped
    without); `timings` collects each policy's wall seconds."""
    out: dict[str, dict[int, list[Run]]] = {}
    top = max(budgets)
    kt: KernelTunerCache | None = None
    try:
        for policy in policies:
            started = time.perf_counter()
            by_budget: dict[int, list[Run]] = {b: [] for b in budgets}
            if policy.startswith("kt:"):
                if space.format != "kernel_tuner":
                    continue
                if kt is None:
                    kt = KernelTunerCache(space)
                for budget in budgets:
                    for seed in seeds:
                        by_budget[budget].append(kt.run(policy[3:], seed, budget))
            else:
                if policy == "hpcds1_warm" and not siblings:
                    continue
                makers: dict[str, Callable[[RecordedSpace, int, int], Run]] = {
                    "random": random_search,
                    "optuna_tpe": optuna_tpe,
                    "hpcds1": hpcds1,
                    "hpcds1_warm": lambda sp, seed, b: hpcds1_warm(sp, seed, b, siblings),
                }
                for seed in seeds:
                    # budget-free (no decision reads the budget): a prefix is the run at B
                    run = makers[policy](space, seed, top)
                    for budget in budgets:
                        by_budget[budget].append(
                            Run(policy, seed, budget, run.configs[:budget], run.reported)
                        )
            out[policy] = by_budget
            if timings is not None:
                timings[policy] = time.perf_counter() - started
    finally:
        if kt is not None:
            kt.close()
    return out


def comparisons(
    space: RecordedSpace,
    results: dict[str, dict[int, list[Run]]],
    budgets: Sequence[int],
    seed: int = 0,
) -> dict[str, Any]:
    """Bootstrap draws for one space (resampled seeds, `RESAMPLES`, seeded): per HPC-DS1
    policy, baseline and budget, the paired score difference; per policy and budget, the
    median fraction of the optimum. Draws, so that spaces can be pooled afterwards."""
    import numpy as np

    n_seeds = len(next(iter(next(iter(results.values())).values())))
    index = resamples(n_seeds, RESAMPLES, seed)
    everyone = np.arange(n_seeds)[None, :]
    diffs: dict[str, dict[str, dict[int, Any]]] = {}
    for ours in (p for p in HPCDS1 if p in results):
        diffs[ours] = {}
        for theirs in (p for p in results if p not in HPCDS1):
            diffs[ours][theirs] = {
                b: (
                    float(score_draws(space, results[ours][b], results[theirs][b], b, everyone)[0]),
                    score_draws(space, results[ours][b], results[theirs][b], b, index),
                )
                for b in budgets
            }
    fractions = {
        policy: {b: fraction_draws(space, by_budget[b], b, index) for b in budgets}
        for policy, by_budget in results.items()
    }
    return {"diffs": diffs, "fractions": fractions}


def table(
    space: RecordedSpace, results: dict[str, dict[int, list[Run]]], budgets: Sequence[int]
) -> tuple[str, dict[str, dict[int, dict[str, Any]]]]:
    """The printed table and its figures: per policy and budget, median, p10, score, runs."""
    _, optimum = space.optimum()
    figures: dict[str, dict[int, dict[str, Any]]] = {}
    lines = [
        f"{space.path}: {space.device}, {space.space.count()} valid configurations, "
        f"{len(space.failures())} recorded failures, optimum {optimum * 1e3:.4f} ms",
        "fraction of the optimum, median / p10 over seeds  [methodology score]  (max runs)",
        f"{'policy':28s}" + "".join(f"{'B=' + str(b):>30s}" for b in budgets),
    ]
    for policy, by_budget in results.items():
        scores = methodology_scores(space, by_budget)
        figures[policy] = {}
        cells = []
        for b in budgets:
            runs = by_budget[b]
            fr = [fraction(optimum, best_curve(space, r, b)[-1]) for r in runs]
            med, p10 = statistics.median(fr), percentile(fr, 0.10)
            score = scores[b] if scores is not None else float("nan")
            most = max(len(r.configs) for r in runs)
            figures[policy][b] = {
                "median": med,
                "p10": p10,
                "score": score,
                "runs": most,
                "per_seed": [round(f, 4) for f in fr],
            }
            s = "-" if scores is None else f"{score:+.2f}"
            cells.append(f"{med:.3f}/{p10:.3f} [{s}] ({most})")
        lines.append(f"{policy:28s}" + "".join(f"{c:>30s}" for c in cells))
    return "\n".join(lines), figures


def spaces(paths: Sequence[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(
                f for f in p.iterdir() if f.name.endswith((".json", ".json.gz")) and f.is_file()
            )
        else:
            found.append(p)
    return found


def comparison_lines(compared: dict[str, Any], budgets: Sequence[int]) -> list[str]:
    """Per HPC-DS1 policy and baseline: score difference [95 % interval] at each budget."""
    lines = ["paired score difference, HPC-DS1 minus baseline [95 % bootstrap interval]"]
    for ours, against in compared["diffs"].items():
        for theirs, by_budget in against.items():
            cells = []
            for b in budgets:
                point, draws = by_budget[b]
                lo, hi = interval(draws)
                cells.append(f"{point:+.2f} [{lo:+.2f},{hi:+.2f}]")
            lines.append(f"{ours + ' - ' + theirs:40s}" + "".join(f"{c:>22s}" for c in cells))
    return lines


def pooled(per_space: dict[str, dict[str, Any]], budgets: Sequence[int]) -> dict[str, Any]:
    """Across spaces: the mean over spaces of each paired score difference (each space's seeds
    resampled on their own), and, per policy, the median over spaces of the median fraction
    of the optimum, with 95 % intervals."""
    import numpy as np

    out: dict[str, Any] = {"diffs": {}, "fraction": {}}
    names = list(per_space)
    first = per_space[names[0]]["compared"]
    for ours, against in first["diffs"].items():
        for theirs in against:
            have = [n for n in names if theirs in per_space[n]["compared"]["diffs"].get(ours, {})]
            if len(have) != len(names):
                continue  # not every space has it (Kernel Tuner skips T4 files)
            for b in budgets:
                cells = [per_space[n]["compared"]["diffs"][ours][theirs][b] for n in names]
                point = float(np.mean([c[0] for c in cells]))
                lo, hi = interval(np.mean([c[1] for c in cells], axis=0))
                key = f"{ours} - {theirs}"
                out["diffs"].setdefault(key, {})[b] = {"difference": point, "interval": [lo, hi]}
    for policy in first["fractions"]:
        have = [n for n in names if policy in per_space[n]["compared"]["fractions"]]
        if len(have) != len(names):
            continue
        for b in budgets:
            medians = [per_space[n]["figures"][policy][b]["median"] for n in names]
            draws = np.median([per_space[n]["compared"]["fractions"][policy][b] for n in names], 0)
            lo, hi = interval(draws)
            out["fraction"].setdefault(policy, {})[b] = {
                "median_of_medians": float(np.median(medians)),
                "interval": [lo, hi],
                "spaces_at_least_0.9": int(sum(m >= 0.9 for m in medians)),
                "spaces_at_least_0.95": int(sum(m >= 0.95 for m in medians)),
            }
    return out


def summary(per_space: dict[str, dict[str, Any]], budgets: Sequence[int]) -> str:
    """One row a space: HPC-DS1's score against Kernel Tuner's best strategy (chosen across
    all spaces, per budget), the warm start's median fraction, then the pooled lines."""
    import numpy as np

    names = list(per_space)
    kt = sorted({p for n in names for p in per_space[n]["figures"] if p.startswith("kt:")})
    best_kt = {}
    for b in budgets:
        means = {
            p: np.mean([per_space[n]["figures"][p][b]["score"] for n in names])
            for p in kt
            if all(p in per_space[n]["figures"] for n in names)
        }
        if means:
            best_kt[b] = max(means, key=lambda p: means[p])
    lines = [
        "Kernel Tuner's best strategy by mean score across these spaces: "
        + ", ".join(f"B={b}: {p}" for b, p in best_kt.items())
    ]
    cols = [b for b in (20, 50) if b in budgets] or list(budgets)[-1:]
    head = (
        f"{'space':34s}"
        + "".join(
            f"{'cold B=' + str(b):>12s}{'KT B=' + str(b):>10s}{'diff [95 %]':>22s}" for b in cols
        )
        + "".join(f"{'warm fr B=' + str(b):>14s}" for b in budgets if b <= 20)
    )
    lines.append(head)
    for n in names:
        fig, cmp = per_space[n]["figures"], per_space[n]["compared"]["diffs"]
        row = f"{n:34s}"
        for b in cols:
            ours = fig.get("hpcds1", {}).get(b, {}).get("score", float("nan"))
            theirs_p = best_kt.get(b)
            theirs = fig.get(theirs_p, {}).get(b, {}).get("score", float("nan"))
            if theirs_p and "hpcds1" in cmp and theirs_p in cmp["hpcds1"]:
                point, draws = cmp["hpcds1"][theirs_p][b]
                lo, hi = interval(draws)
                d = f"{point:+.2f} [{lo:+.2f},{hi:+.2f}]"
            else:
                d = "-"
            row += f"{ours:>+12.2f}{theirs:>+10.2f}{d:>22s}"
        for b in (b for b in budgets if b <= 20):
            warm = fig.get("hpcds1_warm", {}).get(b, {}).get("median", float("nan"))
            row += f"{warm:>14.3f}"
        lines.append(row)
    if len(names) > 1:
        p = pooled(per_space, budgets)
        lines.append("pooled over the spaces (mean of per-space differences, 95 % interval):")
        for key, by_budget in p["diffs"].items():
            lines.append(
                f"  {key:38s}"
                + "".join(
                    f"  B={b}: {v['difference']:+.2f} [{v['interval'][0]:+.2f},"
                    f"{v['interval'][1]:+.2f}]"
                    for b, v in by_budget.items()
                )
            )
        lines.append("median over spaces of the median fraction [95 %] (spaces >= 0.9):")
        for policy, by_budget in p["fraction"].items():
            lines.append(
                f"  {policy:38s}"
                + "".join(
                    f"  B={b}: {v['median_of_medians']:.3f} [{v['interval'][0]:.3f},"
                    f"{v['interval'][1]:.3f}] ({v['spaces_at_least_0.9']})"
                    for b, v in by_budget.items()
                )
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("space", nargs="+", help="a recorded file or a folder of them")
    parser.add_argument("--kernel", help="the T1 kernel file (its Conditions: the constraints)")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed-start", type=int, default=0, help="first seed (100+: development)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument(
        "--setup-check",
        type=int,
        default=0,
        metavar="SEEDS",
        help=f"also compare System 1 after a setup of {SETUP_FRACTION:.0%} of the runs with an "
        "exhaustive one, over this many seeds",
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument(
        "--home",
        help="also write them to HOME/evaluation/yardstick.json, where the console's "
        "Evaluation section reads them (GET /v1/evaluation/yardstick)",
    )
    args = parser.parse_args(argv)
    budgets = sorted({int(b) for b in args.budgets.split(",")})
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        if p not in (*HPCDS1, "random", "optuna_tpe") and not p.startswith("kt:"):
            parser.error(
                f"--policies: {p!r}: accepted: {', '.join(HPCDS1)}, random, optuna_tpe, "
                "kt:<strategy>"
            )
    seeds = range(args.seed_start, args.seed_start + args.seeds)
    per_space: dict[str, dict[str, Any]] = {}
    out: dict[str, Any] = {"seeds": list(seeds), "budgets": budgets, "spaces": {}}
    begun = time.perf_counter()
    for path in spaces(args.space):
        kernel = Path(args.kernel) if args.kernel else hub_kernel_for(path)
        started = time.perf_counter()
        space = RecordedSpace.load(path, kernel=kernel)
        siblings = (
            siblings_of(space, spaces([str(path.parent)]), kernel)
            if "hpcds1_warm" in policies
            else []
        )
        timings: dict[str, float] = {}
        results = evaluate(space, budgets, seeds, policies, siblings, timings)
        text, figures = table(space, results, budgets)
        compared = comparisons(space, results, budgets)
        print(text)
        print("\n".join(comparison_lines(compared, budgets)))
        name = f"{path.parent.name}/{path.name}"
        record: dict[str, Any] = {
            "device": space.device,
            "configurations": space.space.count(),
            "siblings": [o.device for o in siblings],
            "figures": figures,
            "seconds": {p: round(t, 1) for p, t in timings.items()},
            "differences": {
                ours: {
                    theirs: {
                        b: {"difference": point, "interval": list(interval(draws))}
                        for b, (point, draws) in by_budget.items()
                    }
                    for theirs, by_budget in against.items()
                }
                for ours, against in compared["diffs"].items()
            },
        }
        if args.setup_check:
            record["setup_check"] = setup_check(space, range(args.setup_check))
            c = record["setup_check"]
            print(
                f"setup check: System 1 after {c['runs']} of {c['of']} runs (AL) "
                f"{c['budgeted']:.3f} vs exhaustive {c['exhaustive']:.3f}, difference "
                f"{c['difference']:+.3f} [{c['interval'][0]:+.3f},{c['interval'][1]:+.3f}]"
            )
        print(f"({time.perf_counter() - started:.1f} s)\n", flush=True)
        per_space[name] = {"figures": figures, "compared": compared}
        out["spaces"][name] = record
    print(summary(per_space, budgets))
    out["pooled"] = pooled(per_space, budgets) if len(per_space) > 1 else None
    out["seconds"] = round(time.perf_counter() - begun, 1)
    print(f"({out['seconds']:.1f} s in all)")
    text = json.dumps(out, indent=1, default=float)
    if args.json:
        Path(args.json).write_text(text)
    if args.home:
        folder = Path(args.home) / "evaluation"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "yardstick.json").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
