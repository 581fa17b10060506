"""The keep rules and transfer compared offline on the SAME recorded landscapes (issue 13,
part 2). Nothing is measured: the held-out development cells and the truth pass already in a
home's log are replayed with every variant (evaluation/compare.py) and scored on the truth pass.
The final held-out set is left out. Run:

    HPC_DS1_HOME=/tmp/home .venv/bin/python benchmarks/compare_policies.py [--seeds 0,1,2]
        [--cache FILE] [--json] [--weight W] [--bandwidth H] [--decide-share S]
        [--simulate-sigma S]
        [--only TEXT]

after `hpc-ds1 setup --quick` and `hpc-ds1 evaluate --quick --truth-all` on that home.
`--cache FILE` keeps the loaded measurements (JSON) and reads them from there next time, so a
rerun needs no running stack. `--simulate-sigma 0.015` replays the sessions on the truth pass
seen through a 1.5 % run-to-run spread instead of the observed pass (what a steadier machine
would show on the same landscapes; compare.simulated_cells). `--only PICK` keeps the
coordinator's session (the new keep rule from every start; then the baseline of the
differences) and the variants whose name holds the text."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson

from hpc_ds1.api import load
from hpc_ds1.cli.common import load_settings
from hpc_ds1.evaluation.compare import compare, default_variants
from hpc_ds1.evaluation.plan import final_sizes
from hpc_ds1.evaluation.truth import split_passes
from hpc_ds1.settings import Settings

COORDINATOR = "model, new keep rule"  # the variant that replays what the coordinator does


async def _rows(settings: Settings, device_id: str) -> list[dict[str, Any]]:
    from hpc_ds1.services.trainer.training import load_measurements
    from hpc_ds1.stack import open_stack

    async with open_stack(settings, ("projector",), "compare-policies") as stack:
        await stack.caught_up()
        rows = await asyncio.to_thread(load_measurements, stack.engine, device_id)
    return [
        {
            k: r.get(k)
            for k in (
                "workload",
                "size",
                "config",
                "status",
                "runtime_s",
                "spread",
                "throughput",
                "held_out",
                "purpose",
            )
        }
        for r in rows
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the races' re-runs")
    parser.add_argument("--cache", type=Path, help="measurements cache (JSON)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--without-prior",
        action="store_true",
        help="the same model with its transfer prior and calibration taken out of its metadata "
        "(System 1 and confidences as before issue 13 part 2), for a before/after",
    )
    parser.add_argument(
        "--weight",
        type=float,
        help="replay with this transfer weight inside and outside the trained range (0 to 1) "
        "instead of the model file's",
    )
    parser.add_argument(
        "--bandwidth",
        type=float,
        help="replay with the transfer table smoothed at this bandwidth (ln size; 0: as "
        "measured) instead of the model file's",
    )
    parser.add_argument(
        "--decide-share",
        type=float,
        help="replay with this share of the transfer weight in decide (0 to 1) instead of the "
        "model file's",
    )
    parser.add_argument(
        "--simulate-sigma",
        type=float,
        help="sessions observe the truth pass through this relative spread (0.015: 1.5 %%) "
        "instead of the observed pass",
    )
    parser.add_argument("--only", help="only the variants whose name holds this text")
    args = parser.parse_args()
    if args.simulate_sigma is not None and not 0.0 <= args.simulate_sigma <= 1.0:
        parser.error(f"--simulate-sigma must be within 0 and 1, not {args.simulate_sigma}")
    settings = load_settings(quiet=True)
    model = load(settings.home, log_decisions=False)
    if args.without_prior:
        from hpc_ds1.model import Model
        from hpc_ds1.models_store import latest_path

        sys.path.insert(0, str(Path(__file__).parent))
        from bench_recommend import stripped

        path = latest_path(settings.models_dir)
        assert path is not None  # load() found it
        model = Model.from_onnx(stripped(path.read_bytes()), model.thresholds).bind(model.host)
    try:
        if args.weight is not None:
            model = model.reweighted({"inside": args.weight, "outside": args.weight})
        if args.decide_share is not None:
            model = model.with_decide_share(args.decide_share)
        if args.bandwidth is not None:
            model = model.with_bandwidth(args.bandwidth)
    except ValueError as error:
        parser.error(str(error))
    if args.cache and args.cache.exists():
        rows = orjson.loads(args.cache.read_bytes())
    else:
        rows = asyncio.run(_rows(settings, model.device_id))
        if args.cache:
            args.cache.write_bytes(orjson.dumps(rows))
    from hpc_ds1.workloads import get_workload

    final = {(w, s) for w in model.workloads for s in final_sizes(get_workload(w))}
    observed, truth = split_passes(rows)
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = default_variants()
    if args.only:
        base = next(v for v in variants if v.name == COORDINATOR)
        variants = [base, *(v for v in variants if v is not base and args.only in v.name)]
    result = compare(
        model,
        observed,
        truth,
        final=final,
        seeds=seeds,
        variants=variants,
        simulate_sigma=args.simulate_sigma,
    )
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
        return 0
    print(f"model {result['model_version']} · seeds {result['seeds']} · home {settings.home}")
    if args.simulate_sigma is not None:
        print(f"simulated: the truth pass seen through a {args.simulate_sigma:.1%} spread")
    print(f"development cells: {', '.join(result['cells'])}")
    print(f"truth-measured configurations per cell: {result['truth_measured']}")
    for seed, rows_ in result["table"].items():
        print(f"\nseed {seed}")
        print(
            f"  {'variant':52} {'true med':>8} {'p10':>6} {'mean':>6} {'in noise':>8} "
            f"{'runs med':>8} {'mean':>5} {'obs med':>7} {'unscored':>8}"
        )
        for r in rows_:
            print(
                f"  {r['variant']:52} {r.get('true_pct_median', '-'):>8} "
                f"{r.get('true_pct_p10', '-'):>6} {r.get('true_pct_mean', '-'):>6} "
                f"{r.get('within_noise_share', '-'):>8} {r['runs_median']:>8} "
                f"{r['runs_mean']:>5} {r['observed_pct_median']:>7} {r['unscored']:>8}"
            )
        for name, d in result["difference_from_first"][seed].items():
            print(f"  vs first row: {name}: {d}")
    print("\nSystem 1 (0 runs), true % of best:")
    for r in result["system1"]:
        print(f"  {r['approach']:16} median {r['true_pct_median']} p10 {r['true_pct_p10']}")
    print(f"\nrecommend at each transfer weight (the model carries {result['transfer_weights']}):")
    for r in result["system1_by_weight"]:
        print(
            f"  w={r['weight']:.1f}  median {r['true_pct_median']:6}  p10 {r['true_pct_p10']:6}  "
            f"mean {r['true_pct_mean']:6}  ({r['sizes']} sizes)"
        )
    print(f"\nrecommend at each bandwidth (the model carries {result['transfer_bandwidth']}):")
    for r in result["system1_by_bandwidth"]:
        print(
            f"  h={r['bandwidth']:<4}  median {r['true_pct_median']:6}  p10 "
            f"{r['true_pct_p10']:6}  mean {r['true_pct_mean']:6}  ({r['sizes']} sizes)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
