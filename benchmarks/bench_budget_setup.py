"""`setup --budget` against a whole setup, through the product (issue 42, item 2's target).

    .venv/bin/python benchmarks/bench_budget_setup.py RECORDED [RECORDED ...] [--kernel T1]
        [--fraction 0.15] [--seeds 3] [--json OUT]

For each recorded file (a Kernel Tuner cache or T4 file, replayed as a workload:
hpc_ds1.workloads.recorded) and seed, two fresh homes run the real CLI: `hpc-ds1 setup`
(every configuration) and `hpc-ds1 setup --budget N` (N = fraction x the configurations,
chosen by active learning), each followed by `hpc-ds1 recommend` (System 1: the trained model's
pick over the whole space, before anything else runs). The seed is the replay's
(HPC_DS1_REPLAY_SEED): which recorded repeat each run draws. A pick is scored by its recorded
mean (the truth) as the fraction of the optimum. Printed per file: both picks' fractions per
seed, their medians, the runs each setup made and its wall time; then the paired difference
(budgeted - whole) over every file and seed with a bootstrap 95 % interval (seeded)."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hpc_ds1.workloads.recorded_files import hub_kernel_for
from hpc_ds1.workloads.recorded_space import RecordedSpace

ROOT = Path(__file__).resolve().parents[1]
HPC_DS1 = str(Path(sys.executable).with_name("hpc-ds1"))


def run_cli(home: Path, seed: int, *args: str) -> subprocess.CompletedProcess[str]:
    """`hpc-ds1 ARGS` on `home` with its embedded servers, the replay drawing from `seed`."""
    env = {**os.environ, "HPC_DS1_HOME": str(home), "HPC_DS1_REPLAY_SEED": str(seed)}
    env.pop("HPC_DS1_NATS_URL", None)
    env.pop("HPC_DS1_DATABASE_URL", None)
    done = subprocess.run([HPC_DS1, *args], env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"hpc-ds1 {' '.join(args)}: {done.stdout}{done.stderr}")
    return done


def one_setup(recorded: Path, kernel: Path | None, seed: int, budget: int | None) -> dict[str, Any]:
    """A fresh home, a setup (budgeted or whole) and System 1's pick."""
    home = Path(tempfile.mkdtemp(prefix="hpc-ds1-budget-"))
    try:
        (home / "workloads").mkdir()
        lines = ["[workload]", 'name = "replayed"', f'recorded = "{recorded}"']
        lines += [f'kernel = "{kernel}"'] if kernel else []
        (home / "workloads" / "replayed.toml").write_text("\n".join(lines) + "\n")
        started = time.perf_counter()
        args = ["setup", "--workload", "replayed", "--json"]
        args += ["--budget", str(budget)] if budget else []
        setup = json.loads(run_cli(home, seed, *args).stdout)
        took = time.perf_counter() - started
        rec = json.loads(
            run_cli(
                home, seed, "recommend", "--workload", "replayed", "--size", "1", "--json"
            ).stdout
        )
        return {"measured": setup["measured"], "seconds": took, "pick": rec["config"]["knobs"]}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def bootstrap(values: list[float], seed: int = 0, resamples: int = 2000) -> tuple[float, float]:
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choice(values) for _ in values) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recorded", nargs="+")
    parser.add_argument("--kernel")
    parser.add_argument("--fraction", type=float, default=0.15)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {}
    differences: list[float] = []
    for name in args.recorded:
        path = Path(name).resolve()
        kernel = Path(args.kernel).resolve() if args.kernel else hub_kernel_for(path)
        space = RecordedSpace.load(path, kernel=kernel)
        _, optimum = space.optimum()
        budget = max(2, round(args.fraction * space.count))
        rows = []
        for seed in range(args.seeds):
            whole = one_setup(path, kernel, seed, None)
            part = one_setup(path, kernel, seed, budget)
            row = {}
            for label, found in (("whole", whole), ("budget", part)):
                mean = space.mean(space.space.config(found["pick"]))
                row[label] = {
                    "fraction": 0.0 if mean is None else optimum / mean,
                    "measured": found["measured"],
                    "seconds": round(found["seconds"], 1),
                }
            differences.append(row["budget"]["fraction"] - row["whole"]["fraction"])
            rows.append(row)
            print(f"{path.name} seed {seed}: {json.dumps(row)}", flush=True)
        med = {k: statistics.median(r[k]["fraction"] for r in rows) for k in ("whole", "budget")}
        print(
            f"{path}: {space.device}, {space.count} configurations, budget {budget} "
            f"({budget / space.count:.0%}): System 1 median fraction of the optimum "
            f"whole {med['whole']:.3f} budget {med['budget']:.3f}",
            flush=True,
        )
        out[str(path)] = {"budget": budget, "count": space.count, "rows": rows, "median": med}
    lo, hi = bootstrap(differences)
    print(
        f"budget - whole, mean over {len(differences)} (file, seed) pairs: "
        f"{statistics.fmean(differences):+.4f} [{lo:+.4f}, {hi:+.4f}] (bootstrap 95 %)"
    )
    out["difference"] = {"mean": statistics.fmean(differences), "interval": [lo, hi]}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
