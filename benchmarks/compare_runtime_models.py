"""Models trained on the SAME measurements, one per variant of the runtime model (issue 13,
part 2: "a runtime model made for ranking": how it is chosen, what columns it sees), and each
model's sessions replayed on the SAME development cells, scored on the truth pass. The home's
training measurements are trained once per variant (the current code, the same seed); then
every start of every development cell is replayed with each model (the session fold the
coordinator runs), as is `tune`'s path from the model's own recommend, and System 1. Nothing is
measured; the final held-out set is left out. Run, after `benchmarks/compare_policies.py --cache
FILE` wrote the measurements (`hpc-ds1 setup`, then `hpc-ds1 evaluate --quick --truth-all`):

    HPC_DS1_HOME=/tmp/home .venv/bin/python benchmarks/compare_runtime_models.py --cache FILE
        [--seeds 0,1,2] [--variants NAME=SELECTION:COLUMNS:CANDIDATES,...] [--json]

SELECTION is one of estimators.RUNTIME_SELECTIONS; COLUMNS `all` (features.BASE_FEATURES) or
`default` (features.DEFAULT_BASE_FEATURES: all but the working-set ones); CANDIDATES `all`
(every runtime model of estimators.regressor_candidates) or `absolute` (the four before the
size-relative ones). The first variant is the base of the paired differences (mean true % of
best per cell, with a 90 % bootstrap interval over the cells); the default's first is the code
before section 8 of docs/evaluation.md."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from hpc_ds1.cli.common import load_settings
from hpc_ds1.evaluation.compare import (
    Variant,
    _row,
    _sessions,
    _system1,
    cached_landscape,
    development_cells,
    paired_difference,
)
from hpc_ds1.evaluation.plan import final_sizes
from hpc_ds1.evaluation.truth import TRUTH_REPEATS, truth_points
from hpc_ds1.model import Measurement, Model, aggregate, train
from hpc_ds1.model import features as ft
from hpc_ds1.model.transfer import relative_table
from hpc_ds1.runner.keep import DEFAULT_RULE

DEFAULT_VARIANTS = (
    "before=rmse:default:absolute,working_set=rmse:all:absolute,order=order:default:absolute,"
    "relative=rmse:default:all,relative_order=order:default:all,everything=order:all:all"
)
CANDIDATES = {
    "all": None,
    "absolute": ["gradient_boosting", "random_forest", "ridge", "ridge_poly2"],
}
COLUMNS = {"all": list(ft.BASE_FEATURES), "default": list(ft.DEFAULT_BASE_FEATURES)}
VARIANTS = (
    Variant("from every start", DEFAULT_RULE, False),
    Variant("from its recommend (tune)", DEFAULT_RULE, False, True),
)


def replay(
    models: dict[str, Model],
    observed: Sequence[Measurement],
    truth_rows: Sequence[Measurement],
    seeds: Sequence[int],
) -> dict[str, Any]:
    """Every model's sessions on the development cells, per seed, and the paired differences
    from the first model."""
    first = next(iter(models.values()))
    final = {(w, s) for w in first.workloads for s in final_sizes(_workload(w))}
    cells = development_cells(first, observed, final)
    if not cells:
        raise ValueError("no complete development cell in these measurements")
    truth = truth_points(m for m in truth_rows if (m.workload, m.size) not in final)
    training = [m for m in observed if not m.held_out and m.size in first.sizes.get(m.workload, ())]
    transfer = relative_table(aggregate(training))
    out: dict[str, Any] = {"cells": [f"{c.workload} {c.size}" for c in cells], "seeds": {}}
    for seed in seeds:
        rows, diffs = [], {}
        for variant in VARIANTS:
            sessions = {
                name: _sessions(m, cells, variant, seed, transfer) for name, m in models.items()
            }
            base_name = next(iter(sessions))
            for name, got in sessions.items():
                rows.append(_row(f"{name}: {variant.name}", got, truth, TRUTH_REPEATS))
                if name != base_name:
                    diffs[f"{name} - {base_name}: {variant.name}"] = paired_difference(
                        sessions[base_name], got, truth, seed
                    )
        out["seeds"][seed] = {"rows": rows, "differences": diffs}
    out["system1"] = {
        name: _system1(m, cells, training, transfer, truth) for name, m in models.items()
    }
    return out


def _workload(name: str) -> Any:
    from hpc_ds1.workloads import get_workload

    return get_workload(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, required=True, help="compare_policies' cache")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the races' re-runs")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--train-seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    home, home_model, observed, truth_rows = cached_landscape(
        args.cache, Path(load_settings(quiet=True).home)
    )
    training = [m for m in observed if not m.held_out]
    models: dict[str, Model] = {}
    trained_info: dict[str, Any] = {}
    for spec in args.variants.split(","):
        name, _, rest = spec.partition("=")
        selection, columns, candidates = [*rest.split(":"), "all", "all"][:3]
        started = time.perf_counter()
        trained = train(
            training,
            home_model.fingerprint,
            seed=args.train_seed,
            runtime_selection=selection,
            features=COLUMNS[columns],
            runtime_candidates=CANDIDATES[candidates],
        )
        model = Model.from_onnx(trained.to_onnx(), home_model.thresholds)
        models[name] = model
        chosen = trained.metrics["runtime_model"]
        trained_info[name] = {
            "variant": rest,
            "model_version": model.version,
            "runtime_model": chosen["chosen"],
            "scores": chosen["candidates"][chosen["chosen"]],
            "train_seconds": round(time.perf_counter() - started, 1),
        }
    seeds = [int(s) for s in args.seeds.split(",")]
    result = {"home": str(home), "trained": trained_info}
    result |= replay(models, observed, truth_rows, seeds)
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
        return 0
    print(f"home {result['home']} · {len(training)} training measurements")
    for name, info in trained_info.items():
        s = info["scores"]
        print(
            f"  {name:14} {info['variant']:22} {info['model_version']} runtime model "
            f"{info['runtime_model']}: RMSE "
            f"{s['rmse_log10']}, pairwise order {s['pairwise_order']}, System 1 "
            f"{s['system1_pct_of_best']} % (leave one size out) · {info['train_seconds']} s"
        )
    print(f"development cells: {', '.join(result['cells'])}")
    for seed, got in result["seeds"].items():
        print(f"\nseed {seed}")
        print(f"  {'':44} {'true med':>8} {'p10':>6} {'mean':>6} {'in noise':>8} {'runs':>5}")
        for r in got["rows"]:
            print(
                f"  {r['variant']:44} {r.get('true_pct_median', '-'):>8} "
                f"{r.get('true_pct_p10', '-'):>6} {r.get('true_pct_mean', '-'):>6} "
                f"{r.get('within_noise_share', '-'):>8} {r['runs_median']:>5}"
            )
        for name, d in got["differences"].items():
            print(f"  {name}: {d}")
    print("\nSystem 1 (0 runs), true % of best:")
    for name, rows_ in result["system1"].items():
        for r in rows_:
            print(
                f"  {name:14} {r['approach']:16} median {r['true_pct_median']} p10 "
                f"{r['true_pct_p10']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
