"""The yardstick's baselines (issue 42, item 4), side by side on recorded spaces.

    .venv/bin/python benchmarks/yardstick.py SPACE [SPACE ...] [--kernel T1.json]
        [--budgets 5,10,20,50,100] [--seeds 3] [--policies random,optuna_tpe,kt:greedy_ils,...]

SPACE is a recorded file (a Kernel Tuner cache or a T4 file, plain or `.gz`, see
`hpc_ds1.tuning.recorded`) or a folder of them; `--kernel` names the T1 kernel file whose
`Conditions` are the constraints (needed for T4 files; for a hub cache under
`cachefiles/<name>/` the hub's `kernels/<name>.json` is found by itself).

Counting: every run on the device counts against the budget, a failed configuration too. A
configuration a policy has already run is not run again (each baseline keeps its results, as
Kernel Tuner's cache does), so it costs nothing. Constraint-violating suggestions are never sent
to the device and cost nothing either. Each found configuration is scored by its recorded mean
(the truth), not by the noisy draw the policy saw.

Policies:
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

from hpc_ds1.tuning.knobs import KnobConfig  # noqa: E402
from hpc_ds1.tuning.recorded import RecordedDevice, RecordedSpace  # noqa: E402

BUDGETS = (5, 10, 20, 50, 100)
KT_STRATEGIES = (
    "genetic_algorithm",
    "dual_annealing",
    "greedy_ils",
    "simulated_annealing",
    "bayes_opt",
)
STALE = 100  # TPE suggestions in a row without a new valid configuration before it stops
POLICIES = ("random", "optuna_tpe", *(f"kt:{s}" for s in KT_STRATEGIES))


@dataclass(frozen=True)
class Run:
    """One policy's runs on the device for one seed and budget, in order."""

    policy: str
    seed: int
    budget: int
    configs: tuple[KnobConfig, ...]
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


def methodology_scores(
    space: RecordedSpace, runs_by_budget: dict[int, list[Run]]
) -> dict[int, float] | None:
    """The autotuning-methodology performance score per budget (see the module)."""
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
    scores: dict[int, float] = {}
    for budget, runs in runs_by_budget.items():
        fevals = np.arange(1, budget + 1)
        rand = baseline.get_curve_over_fevals(fevals)
        curves = np.array(
            [[np.nan if v is None else v for v in best_curve(space, r, budget)] for r in runs],
            dtype=float,
        )
        division = optimum - rand
        ok = (division != 0) & ~np.isnan(curves).all(axis=0)
        if not ok.any():
            scores[budget] = float("nan")
            continue
        mean_curve = np.nanmean(curves[:, ok], axis=0)
        scores[budget] = float(np.mean((mean_curve - rand[ok]) / division[ok]))
    return scores


# --- driver --------------------------------------------------------------------------------


def kernel_for(path: Path) -> Path | None:
    """The hub's T1 kernel file for `cachefiles/<name>/<GPU>.json(.gz)`, if it is there."""
    candidate = path.parent.parent.parent / "kernels" / f"{path.parent.name}.json"
    return candidate if candidate.is_file() else None


def evaluate(
    space: RecordedSpace,
    budgets: Sequence[int],
    seeds: Sequence[int],
    policies: Sequence[str],
) -> dict[str, dict[int, list[Run]]]:
    """Every policy's runs, by budget, one per seed."""
    out: dict[str, dict[int, list[Run]]] = {}
    top = max(budgets)
    kt: KernelTunerCache | None = None
    try:
        for policy in policies:
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
                make = {"random": random_search, "optuna_tpe": optuna_tpe}[policy]
                for seed in seeds:
                    run = make(space, seed, top)  # budget-free: a prefix is the run at B
                    for budget in budgets:
                        by_budget[budget].append(
                            Run(policy, seed, budget, run.configs[:budget], run.reported)
                        )
            out[policy] = by_budget
    finally:
        if kt is not None:
            kt.close()
    return out


def table(
    space: RecordedSpace, results: dict[str, dict[int, list[Run]]], budgets: Sequence[int]
) -> tuple[str, dict[str, dict[int, dict[str, float]]]]:
    """The printed table and its figures: per policy and budget, median, p10, score, runs."""
    _, optimum = space.optimum()
    figures: dict[str, dict[int, dict[str, float]]] = {}
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
            figures[policy][b] = {"median": med, "p10": p10, "score": score, "runs": most}
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("space", nargs="+", help="a recorded file or a folder of them")
    parser.add_argument("--kernel", help="the T1 kernel file (its Conditions: the constraints)")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    budgets = sorted({int(b) for b in args.budgets.split(",")})
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        if p not in ("random", "optuna_tpe") and not p.startswith("kt:"):
            parser.error(f"--policies: {p!r}: accepted: random, optuna_tpe, kt:<strategy>")
    out: dict[str, Any] = {}
    for path in spaces(args.space):
        kernel = args.kernel or kernel_for(path)
        started = time.perf_counter()
        space = RecordedSpace.load(path, kernel=kernel)
        results = evaluate(space, budgets, range(args.seeds), policies)
        text, figures = table(space, results, budgets)
        print(text)
        print(f"({time.perf_counter() - started:.1f} s)\n", flush=True)
        out[str(path)] = figures
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
