"""Live tuning sessions with and without a launch floor on the keep rule (docs/evaluation.md
section 17; not adopted): on the development cells of a home, from the model's recommendation
and N seeded starts per cell, each start run twice for real (every run a launch, as `tune`'s
agent makes it): once with the keep rule's floor on a run's sigma at the workload's spread
between launches in setup (evaluation/live.launch_spread), once with the rule as the
coordinator has it; which goes first alternates from start to start. Both are scored on the
truth pass already in the log; the final held-out set is left out. It measures: keep the
machine quiet.

    HPC_DS1_HOME=/tmp/home .venv/bin/python benchmarks/live_sessions.py [--starts 4]
        [--seed 0] [--json]

after `hpc-ds1 setup` and `hpc-ds1 evaluate --quick --truth-all` on that home."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson

from hpc_ds1.evaluation.headline import versus
from hpc_ds1.evaluation.live import (
    FLOORED,
    LiveRun,
    RunFn,
    _figures,
    device_runs,
    launch_spread,
    live_sessions,
)
from hpc_ds1.evaluation.truth import Key, TruePoint, score_sessions
from hpc_ds1.model.replay import Cell, SessionOutcome
from hpc_ds1.space import Config

FLOOR, NONE = "with the launch floor", "without it"


def _side(policy: str) -> str:
    return FLOOR if policy.endswith(FLOORED) else NONE


def compare_floors(
    model: Any,
    cells: Sequence[Cell],
    truth: dict[Key, dict[Config, TruePoint]],
    starts: int,
    run_fn: RunFn,
    floor: Mapping[str, float | None],
    *,
    seed: int = 0,
    on_session: Callable[[SessionOutcome, list[LiveRun]], None] | None = None,
) -> dict[str, Any]:
    """The paired live sessions, scored on `truth`: each side's figures, and the side with
    the floor (`floor`: per workload) minus the one without (90 % bootstrap over cells)."""
    outcomes = live_sessions(
        model,
        cells,
        model.thresholds,
        starts,
        run_fn,
        seed=seed,
        on_session=on_session,
        floor=floor,
    )
    scores = score_sessions(cells, outcomes, truth)
    side = [replace(s, outcome=replace(s.outcome, policy=_side(s.outcome.policy))) for s in scores]
    finals = {(o.workload, o.size, o.start, o.policy): o.final for o in outcomes}
    agree = [
        final == finals.get((w, size, start, policy + FLOORED))
        for (w, size, start, policy), final in finals.items()
        if not policy.endswith(FLOORED)
    ]
    return {
        "starts_per_cell": starts,
        "cells": len(cells),
        "seed": seed,
        FLOOR: _figures([s for s in side if s.outcome.policy == FLOOR]),
        NONE: _figures([s for s in side if s.outcome.policy == NONE]),
        "same_final_share": round(statistics.fmean(agree), 4) if agree else None,
        "floor_minus_none": versus(side, FLOOR, NONE, seed=seed),
        "launch_spread": {w: floor.get(w) for w in sorted({c.workload for c in cells})},
    }


async def _rows(settings: Any, device_id: str) -> list[dict[str, Any]]:
    from hpc_ds1.services.trainer.training import load_measurements
    from hpc_ds1.stack import open_stack

    async with open_stack(settings, ("projector",), "live-sessions") as stack:
        await stack.caught_up()
        return await asyncio.to_thread(load_measurements, stack.engine, device_id)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=4, help="seeded starts per cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not 1 <= args.starts <= 20:
        parser.error(f"--starts {args.starts}: accepted is 1 to 20")

    from hpc_ds1.api import load
    from hpc_ds1.cli.common import load_settings
    from hpc_ds1.evaluation.compare import development_cells
    from hpc_ds1.evaluation.plan import final_sizes
    from hpc_ds1.evaluation.run import training_of
    from hpc_ds1.evaluation.truth import split_passes, truth_points
    from hpc_ds1.workloads import get_workload

    settings = load_settings(quiet=True)
    model = load(settings.home, log_decisions=False)
    observed, measured_truth = split_passes(asyncio.run(_rows(settings, model.device_id)))
    final = {(w, s) for w in model.workloads for s in final_sizes(get_workload(w))}
    cells = development_cells(model, observed, final)
    truth = truth_points(m for m in measured_truth if (m.workload, m.size) not in final)
    if not cells or not truth:
        parser.error(
            "no development cell with a truth pass: run `hpc-ds1 evaluate --quick "
            "--truth-all` on this home first"
        )

    def show(o: SessionOutcome, runs: list[LiveRun]) -> None:
        print(
            f"{o.workload} {o.size} {o.policy} from {o.start.label()}: {o.final.label()} in "
            f"{o.runs} runs, {sum(r.seconds for r in runs):.1f} s",
            file=sys.stderr,
            flush=True,
        )

    training = training_of(model, observed)
    floor = {w: launch_spread(training, w) for w in model.workloads}
    try:
        result = compare_floors(
            model,
            cells,
            truth,
            args.starts,
            device_runs(settings.home, model.space_for, settings.max_run_s),
            floor,
            seed=args.seed,
            on_session=show,
        )
    except ValueError as error:  # a final configuration the truth pass never measured
        parser.error(str(error))
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(
        f"model {model.version}, {result['cells']} development cells, {args.starts} seeded "
        f"starts and the recommendation each, seed {args.seed}; launch spread "
        f"{result['launch_spread']}"
    )
    for name in (FLOOR, NONE):
        f = result[name]
        print(
            f"  {name:22} true median {f['pct_median']:6} p10 {f['pct_p10']:6} mean "
            f"{f['pct_mean']:6} within noise {f['within_noise_share']:.3f} runs median "
            f"{f['runs_median']} mean {f['runs_mean']} cost s median {f['cost_s_median']}"
        )
    print(f"  same final: {result['same_final_share']}")
    print(f"  floor - none: {result['floor_minus_none']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
