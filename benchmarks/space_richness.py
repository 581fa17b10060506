"""What the stencil's temporal block adds to the space, on a home's truth pass (issue 13, "a
space with something to learn"): per held-out size, the share of configurations within noise of
the true best with the block and without it (block 0, the space before), and how much faster the
best is than the best without it. Nothing is measured here. Run:
    HPC_DS1_HOME=/tmp/home .venv/bin/python benchmarks/space_richness.py [--cache FILE] [--json]
after `hpc-ds1 setup` and `hpc-ds1 evaluate --truth-all` (any size set) on that home; `--cache`
is a file `benchmarks/compare_policies.py --cache` wrote, read instead of the running stack."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import orjson

from hpc_ds1.api import load
from hpc_ds1.cli.common import load_settings
from hpc_ds1.evaluation.richness import richness
from hpc_ds1.model import Measurement

sys.path.insert(0, str(Path(__file__).parent))
from compare_policies import _rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, help="measurements cache (JSON)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.cache and args.cache.exists():
        rows = orjson.loads(args.cache.read_bytes())
    else:
        settings = load_settings(quiet=True)
        model = load(settings.home, log_decisions=False)
        rows = asyncio.run(_rows(settings, model.device_id))
        if args.cache:
            args.cache.write_bytes(orjson.dumps(rows))
    truth = [Measurement.model_validate(r) for r in rows if r.get("purpose") == "truth"]
    result = richness(truth)
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"truth pass, {result['repeats']} repeats; 'without' = block 0 (the space before)")
    print(
        f"{'workload':10} {'size':>6} {'configs':>7} {'in noise':>8} {'without':>7} "
        f"{'in noise':>8} {'speed-up':>8}  best"
    )
    for r in result["per_size"]:
        print(
            f"{r['workload']:10} {r['size']:>6} {r['configurations']:>7} "
            f"{r['within_noise_share']:>8.1%} {r['subspace_configurations']:>7} "
            f"{r['subspace_within_noise_share']:>8.1%} {r['speedup_over_subspace']:>8.3f}  "
            f"{r['best']}"
        )
    for workload, p in result["per_workload"].items():
        print(f"{workload}: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
