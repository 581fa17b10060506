"""Transfer through the fleet, through the product (issue 42, item 5): a new device's
`hpc-ds1 setup --budget B --warm-from SIBLINGS` against the same setup cold, one GPU left out.

    .venv/bin/python benchmarks/bench_warm_setup.py <hub>/cachefiles/convolution_milo \
        [--gpus A100,A4000,A6000,MI250X,W6600,W7800] [--sibling-fraction 0.15] \
        [--budgets 5,20] [--seeds 3] [--json OUT]

One home per kernel folder, the coordinator's: every GPU's recorded cache is a workload of its
own, set up there with a budget of `--sibling-fraction` of its space (a fleet whose devices
ran budgeted setups). That is what the coordinator knows. Then for each GPU left out, budget B
and replay seed (HPC_DS1_REPLAY_SEED: which recorded repeat each run draws), the left-out GPU's
cache under a fresh workload name is set up twice with the real CLI: `setup --budget B
--warm-from <the other GPUs>` (its first runs are the top of their consensus) and `setup
--budget B` (cold). Each is scored as the yardstick scores its baselines: the best recorded
mean among the configurations it ran, as the fraction of the optimum (docs/yardstick.md). The
configurations come from the audit file (every event the projector folded).

Printed per GPU and budget: warm and cold per seed; per budget: the spaces whose warm median
reaches 0.90, the median over every (GPU, seed), and warm - cold with a bootstrap 95 %
interval (seeded). The siblings' setups take most of the wall time."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_budget_setup import bootstrap, run_cli
from hpc_ds1.workloads.recorded_files import hub_kernel_for
from hpc_ds1.workloads.recorded_space import RecordedSpace

GPUS = ("A100", "A4000", "A6000", "MI250X", "W6600", "W7800")


def _workload(home: Path, name: str, recorded: Path, kernel: Path | None) -> None:
    lines = ["[workload]", f'name = "{name}"', f'recorded = "{recorded}"']
    lines += [f'kernel = "{kernel}"'] if kernel else []
    (home / "workloads" / f"{name}.toml").write_text("\n".join(lines) + "\n")


def ran(home: Path, workload: str) -> list[dict[str, Any]]:
    """The knob values of every configuration `workload` ran, from the home's audit file."""
    found = []
    for line in (home / "audit.jsonl").read_text().splitlines():
        data = json.loads(line).get("data")
        if isinstance(data, dict) and data.get("workload") == workload and "config" in data:
            found.append(dict(data["config"]["knobs"]))
    return found


def score(space: RecordedSpace, configs: list[dict[str, Any]]) -> float:
    """The best recorded mean among `configs`, as the fraction of the optimum; 0 for none."""
    _, optimum = space.optimum()
    means = [m for c in configs if (m := space.mean(space.space.config(c))) is not None]
    return optimum / min(means) if means else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a folder of recorded caches, <GPU>.json[.gz] each")
    parser.add_argument("--gpus", default=",".join(GPUS))
    parser.add_argument("--pattern", default="{gpu}.json*", help="a GPU's file in the folder")
    parser.add_argument("--kernel", help="the T1 kernel file (default: the hub's, found)")
    parser.add_argument("--sibling-fraction", type=float, default=0.15)
    parser.add_argument("--budgets", default="5,20")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    folder = Path(args.folder).resolve()
    gpus = [g for g in args.gpus.split(",") if g]
    budgets = [int(b) for b in args.budgets.split(",")]
    files = {g: next(folder.glob(args.pattern.format(gpu=g))) for g in gpus}
    kernel = Path(args.kernel).resolve() if args.kernel else hub_kernel_for(files[gpus[0]])
    spaces = {g: RecordedSpace.load(files[g], kernel=kernel) for g in gpus}
    home = Path(tempfile.mkdtemp(prefix="hpc-ds1-warm-"))
    out: dict[str, Any] = {"folder": str(folder), "gpus": {}, "budgets": {}}
    try:
        (home / "workloads").mkdir()
        started = time.perf_counter()
        for g in gpus:  # the fleet: every GPU set up on a budget, as the coordinator knows it
            _workload(home, g, files[g], kernel)
            budget = max(2, round(args.sibling_fraction * spaces[g].count))
            run_cli(home, 0, "setup", "--workload", g, "--budget", str(budget), "--no-train")
        out["siblings_seconds"] = round(time.perf_counter() - started, 1)
        print(f"siblings set up in {out['siblings_seconds']} s", flush=True)
        for g in gpus:
            others = ",".join(o for o in gpus if o != g)
            rows: dict[str, Any] = {}
            for b in budgets:
                for seed in range(args.seeds):
                    row = {}
                    for mode in ("warm", "cold"):
                        name = f"{g}-{mode}-b{b}-s{seed}"
                        _workload(home, name, files[g], kernel)
                        cli = ["setup", "--workload", name, "--budget", str(b), "--no-train"]
                        cli += ["--warm-from", others] if mode == "warm" else []
                        run_cli(home, seed, *cli)
                        configs = ran(home, name)
                        row[mode] = {"fraction": score(spaces[g], configs), "runs": len(configs)}
                    rows.setdefault(str(b), []).append(row)
                    print(f"{g} budget {b} seed {seed}: {json.dumps(row)}", flush=True)
            out["gpus"][g] = rows
    finally:
        shutil.rmtree(home, ignore_errors=True)
    for b in budgets:
        key = str(b)
        warm = {g: [r["warm"]["fraction"] for r in out["gpus"][g][key]] for g in gpus}
        cold = {g: [r["cold"]["fraction"] for r in out["gpus"][g][key]] for g in gpus}
        diffs = [w - c for g in gpus for w, c in zip(warm[g], cold[g], strict=True)]
        lo, hi = bootstrap(diffs)
        reached = sum(statistics.median(warm[g]) >= 0.90 for g in gpus)
        summary = {
            "warm_median": statistics.median(v for g in gpus for v in warm[g]),
            "cold_median": statistics.median(v for g in gpus for v in cold[g]),
            "spaces_at_0.90": reached,
            "warm_minus_cold": statistics.fmean(diffs),
            "interval": [lo, hi],
        }
        out["budgets"][key] = summary
        print(
            f"budget {b}: warm median {summary['warm_median']:.3f}, cold "
            f"{summary['cold_median']:.3f}; spaces whose warm median reaches 0.90: "
            f"{reached} of {len(gpus)}; warm - cold {summary['warm_minus_cold']:+.3f} "
            f"[{lo:+.3f}, {hi:+.3f}] (bootstrap 95 %)",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
