"""Transfer through the fleet into a tuning session (issue 42, item 5): a new device's session
started warm from its siblings (`tune --warm-from`) against the same session cold, one GPU
left out.

    .venv/bin/python benchmarks/bench_warm_session.py <hub>/cachefiles/convolution_milo \
        [--gpus A100,A4000,A6000,MI250X,W6600,W7800] [--sibling-fraction 0.15] \
        [--runs 20] [--seeds 100,101,102] [--json OUT]

The fleet: every other GPU of the kernel set up on a budget of `--sibling-fraction` of its
space (`tuning.search.budgeted_setup`, what `setup --budget` runs per cell), seeded by the
session's seed. The session: the coordinator's own rules (`SessionRunner.step`, the session
rules of `hpc_ds1.tuning.session`) on the left-out GPU's recorded cache, each run three timed
repeats drawn from the recorded ones (an agent's run), the log in memory. Its decision service
is a model that knows nothing of the job, the same for warm and cold: the moves from the best so
far in a seeded random order, every one auto, no System 1 (a new device's model has not seen
the workload). Warm: the start and the WARM moves from `setup.warm.session_warm`'s plan (the
top of the siblings' consensus spread apart); cold: the space's default start (what the
coordinator starts from without a model's answer).

Scored per session: the recorded mean of its best configuration (the incumbent) after 5, 10
and `--runs` runs (a session that finished earlier keeps its end), as the fraction of the
optimum, and the runs it took to reach 0.90 of it (none within `--runs`: not reached).
Development seeds are 100 and up; the headline seeds 0-9 are not for tuning this."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_budget_setup import bootstrap
from hpc_ds1.events import Event, SessionStarted, WarmSibling, WarmStart
from hpc_ds1.runner.noise import relative_spread
from hpc_ds1.services.coordinator.sessions import SessionRunner
from hpc_ds1.setup.warm import prior_from_runs, warm_plan
from hpc_ds1.space import STOP, Config, ConfigSpace, knob_view, neighbours
from hpc_ds1.tuning.search import budgeted_setup
from hpc_ds1.tuning.session import evolve
from hpc_ds1.workloads import load_workload_file
from hpc_ds1.workloads.recorded_files import hub_kernel_for
from hpc_ds1.workloads.recorded_space import RecordedDevice, RecordedSpace

GPUS = ("A100", "A4000", "A6000", "MI250X", "W6600", "W7800")
AT = (5, 10)


class Replayed(SessionRunner):
    """The coordinator's session rules on a recorded GPU; log and decision service in memory."""

    def __init__(self, space: ConfigSpace, device: RecordedDevice, seed: int) -> None:
        settings = SimpleNamespace(auto_threshold=0.85, escalate_threshold=0.5)
        super().__init__(SimpleNamespace(settings=settings), "s", "bench", space)  # type: ignore[arg-type]
        self.device, self.order = device, random.Random(seed)
        self.events: list[Event] = []
        self.best_after: list[Config] = []  # the incumbent after each run

    async def append(self, event: Event) -> None:
        self.events.append(event)
        runs = self.state.runs
        self.state = evolve(self.state, len(self.events), event)
        if self.state.runs > runs and self.state.best_config is not None:
            self.best_after.append(Config.model_validate(self.state.best_config))
        elif self.best_after and self.state.best_config is not None:  # a kept move
            self.best_after[-1] = Config.model_validate(self.state.best_config)

    async def run_on_agent(self, config: Config) -> tuple[dict[str, Any], str | None]:
        draws = [self.device.run(dict(config.knobs)) for _ in range(3)]
        times = [d.seconds for d in draws if d.seconds is not None]
        if len(times) < len(draws):
            return {"status": "failed", "error": draws[0].failure}, None
        spread = relative_spread(times)
        return {"status": "ok", "runtime_s": statistics.median(times), "spread": spread}, None

    async def ask_decision(self, config: Config, runtime_s: float) -> dict[str, Any]:
        moves = sorted(neighbours(config, self.space))
        self.order.shuffle(moves)
        alternatives = {m: 0.9 - 0.01 * i for i, m in enumerate(moves)}
        return {
            "decision_id": f"d{len(self.events)}",
            "choice": moves[0] if moves else STOP,
            "confidence": 0.9,
            "alternatives": {**alternatives, STOP: 0.05},
            "mode": "auto",
            "reasons": [],
            "system1": None,
        }


def sibling_runs(space: RecordedSpace, budget: int, seed: int) -> list[Any]:
    """A sibling's budgeted setup, as the projection holds its runs."""
    trace = budgeted_setup(space.space, RecordedDevice(space, seed), budget, seed=seed)
    runs = []
    for step in trace.steps:
        knobs = space.space.as_dict(step.config)
        config = {"ranks": 1, "threads": 1, "tile": 1, "knobs": knobs}
        runs.append((config, "ok" if step.seconds else "failed", step.seconds))
    return runs


async def session(
    space: ConfigSpace, recorded: RecordedSpace, seed: int, runs: int, warm: WarmStart | None
) -> dict[str, Any]:
    """The fraction of the optimum of the incumbent after each run, up to `runs` (a session
    that finished earlier keeps its end), and the runs it made."""
    runner = Replayed(space, RecordedDevice(recorded, seed), seed)
    start = Config.model_validate(warm.plan[0]) if warm else space.default()
    await runner.append(
        SessionStarted(
            session_id="s",
            device_id="new",
            workload="left-out",
            size=1,
            start=start.model_dump(),
            warm=warm,
        )
    )
    while runner.state.status != "finished" and runner.state.runs < runs:
        await runner.step()
    _, optimum = recorded.optimum()
    fractions: list[float] = []
    for best in runner.best_after[:runs]:
        mean = recorded.mean(recorded.space.config(dict(best.knobs)))
        fractions.append(optimum / mean if mean else 0.0)
    made = len(fractions)
    if not fractions:
        fractions = [0.0]  # the start failed
    return {"at": fractions + [fractions[-1]] * (runs - len(fractions)), "runs": made}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a folder of recorded caches, <GPU>.json[.gz] each")
    parser.add_argument("--gpus", default=",".join(GPUS))
    parser.add_argument("--pattern", default="{gpu}.json.gz", help="a GPU's file in the folder")
    parser.add_argument("--kernel", help="the T1 kernel file (default: the hub's, found)")
    parser.add_argument("--sibling-fraction", type=float, default=0.15)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seeds", default="100,101,102")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if any(0 <= s <= 9 for s in seeds):
        parser.error("--seeds: seeds 0-9 are the headline seeds; develop on 100 and up")
    folder = Path(args.folder).resolve()
    gpus = [g for g in args.gpus.split(",") if g]
    files = {g: folder / args.pattern.format(gpu=g) for g in gpus}
    kernel = Path(args.kernel).resolve() if args.kernel else hub_kernel_for(files[gpus[0]])
    recorded = {g: RecordedSpace.load(files[g], kernel=kernel) for g in gpus}
    home = Path(tempfile.mkdtemp(prefix="hpc-ds1-warm-session-"))
    toml = home / "left-out.toml"
    lines = ["[workload]", 'name = "left-out"', f'recorded = "{files[gpus[0]]}"']
    toml.write_text("\n".join(lines + ([f'kernel = "{kernel}"'] if kernel else [])) + "\n")
    space = ConfigSpace.for_device(workload=load_workload_file(toml))  # the kernel's knobs
    view = knob_view(space)
    out: dict[str, Any] = {"folder": str(folder), "seeds": seeds, "runs": args.runs, "gpus": {}}
    started = time.perf_counter()
    for seed in seeds:
        fleet = {
            g: sibling_runs(
                recorded[g], max(2, round(args.sibling_fraction * recorded[g].count)), seed
            )
            for g in gpus
        }
        for g in gpus:
            others = [o for o in gpus if o != g]
            prior = prior_from_runs(view, [fleet[o] for o in others])
            warm = WarmStart(
                siblings=[
                    WarmSibling(device_id="fleet", workload=o, size=1, runs=len(fleet[o]))
                    for o in others
                ],
                plan=[c.model_dump() for c in warm_plan(space, prior)],
                reason="unmeasured",
            )
            row = {
                mode: asyncio.run(session(space, recorded[g], seed, args.runs, w))
                for mode, w in (("warm", warm), ("cold", None))
            }
            out["gpus"].setdefault(g, []).append({"seed": seed, **row})
            print(
                f"{g} seed {seed}: "
                + "; ".join(
                    f"{m} "
                    + " ".join(f"@{k} {row[m]['at'][k - 1]:.3f}" for k in points(args.runs))
                    + f" to-0.90 {reached(row[m]['at'])} ({row[m]['runs']} runs)"
                    for m in row
                ),
                flush=True,
            )
    out["seconds"] = round(time.perf_counter() - started, 1)
    out["summary"] = summary(out, gpus, args.runs)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def points(runs: int) -> list[int]:
    return sorted({*AT, runs})


def reached(fractions: list[float], at: float = 0.90) -> int | None:
    """The runs it took to reach `at` of the optimum (1: the start); None: not within them."""
    return next((i + 1 for i, f in enumerate(fractions) if f >= at), None)


def summary(out: dict[str, Any], gpus: list[str], runs: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for k in points(runs):
        warm = [r["warm"]["at"][k - 1] for g in gpus for r in out["gpus"][g]]
        cold = [r["cold"]["at"][k - 1] for g in gpus for r in out["gpus"][g]]
        lo, hi = bootstrap([w - c for w, c in zip(warm, cold, strict=True)])
        found[str(k)] = {
            "warm_median": statistics.median(warm),
            "cold_median": statistics.median(cold),
            "warm_minus_cold": statistics.fmean(w - c for w, c in zip(warm, cold, strict=True)),
            "interval": [lo, hi],
        }
        print(
            f"after {k} runs: warm median {statistics.median(warm):.3f}, cold "
            f"{statistics.median(cold):.3f}; warm - cold {found[str(k)]['warm_minus_cold']:+.3f} "
            f"[{lo:+.3f}, {hi:+.3f}] (bootstrap 95 %)",
            flush=True,
        )
    for mode in ("warm", "cold"):
        hits = [reached(r[mode]["at"]) for g in gpus for r in out["gpus"][g]]
        within5 = {
            g: statistics.median((reached(r[mode]["at"]) or runs + 1) for r in out["gpus"][g]) <= 5
            for g in gpus
        }
        found[f"{mode}_reached_0.90"] = {
            "sessions": sum(h is not None for h in hits),
            "of": len(hits),
            "median_runs": statistics.median(h if h is not None else runs + 1 for h in hits),
            "spaces_within_5": sum(within5.values()),
        }
        print(
            f"{mode}: {found[f'{mode}_reached_0.90']['sessions']} of {len(hits)} sessions reach "
            f"0.90 within {runs} runs; spaces whose median reaches it within 5 runs: "
            f"{sum(within5.values())} of {len(gpus)}",
            flush=True,
        )
    return found


if __name__ == "__main__":
    raise SystemExit(main())
