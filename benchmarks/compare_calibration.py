"""What each calibration target makes of the same decisions (issue 13, part 2): the home's
training measurements trained again with the current code, once per target
(model/calibration.py TARGETS), and each model's held-out decisions on the development cells
scored for ECE on "not slower" and on "good", the share that would run by themselves and how
many of those are not slower. The choices are the same under both targets (a calibration maps
the confidence, never the choice), so the sessions are not replayed. Nothing is measured; the
final held-out set is left out. Run, after `benchmarks/compare_policies.py --cache FILE` wrote
the measurements:

    HPC_DS1_HOME=/tmp/home .venv/bin/python benchmarks/compare_calibration.py --cache FILE"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from hpc_ds1.cli.common import load_settings
from hpc_ds1.evaluation.compare import cached_landscape, development_cells
from hpc_ds1.evaluation.decisions import calibration_summary, check_cell
from hpc_ds1.evaluation.plan import final_sizes
from hpc_ds1.model import Measurement, Model, Thresholds, train
from hpc_ds1.model.calibration import TARGETS

FIGURES = (
    "ece_not_slower",
    "ece_not_slower_moves",
    "ece_good",
    "ece_good_moves",
    "not_slower",
    "good",
    "auto_moves",
    "auto_not_slower",
    "auto_good",
)


def scored(model: Model, measurements: list[Measurement], thresholds: Thresholds) -> dict[str, Any]:
    """The calibration summary of `model`'s decisions on the development cells."""
    from hpc_ds1.workloads import get_workload

    final = {(w, s) for w in model.workloads for s in final_sizes(get_workload(w))}
    cells = development_cells(model, measurements, final)
    checks = [c for cell in cells for c in check_cell(model, cell, model.space_for, thresholds)]
    summary = calibration_summary(checks, thresholds)
    return {"cells": len(cells), **{k: summary[k] for k in ("decisions", *FIGURES)}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, required=True, help="compare_policies' cache")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    home, home_model, observed, _ = cached_landscape(
        args.cache, Path(load_settings(quiet=True).home)
    )
    training = [m for m in observed if not m.held_out]
    out: dict[str, Any] = {"home": str(home), "training_rows": len(training)}
    for target in TARGETS:
        started = time.perf_counter()
        trained = train(training, home_model.fingerprint, seed=args.seed, calibrate_on=target)
        model = Model.from_onnx(trained.to_onnx(), home_model.thresholds)
        out[target] = {
            "model_version": model.version,
            "train_seconds": round(time.perf_counter() - started, 1),
            **scored(model, observed, home_model.thresholds),
        }
    if args.json:
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"home {out['home']} · {out['training_rows']} training measurements · seed {args.seed}")
    print(f"  {'calibrated on':16}" + "".join(f"{k:>22}" for k in FIGURES))
    for target in TARGETS:
        r = out[target]
        print(f"  {target:16}" + "".join(f"{r[k]!s:>22}" for k in FIGURES))
        print(f"    model {r['model_version']}, {r['decisions']} decisions in {r['cells']} cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
