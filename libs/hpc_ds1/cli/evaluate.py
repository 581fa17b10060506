"""`hpc-ds1 evaluate [--quick]`: measure the held-out sizes for real, replay every policy on
that landscape, and publish how good this machine's model is."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any, TextIO

import orjson
from tqdm import tqdm

from ..settings import Settings
from . import UsageError
from .common import add_home_argument, load_settings, run_campaign


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "evaluate", help="measure held-out sizes and score the model against baselines"
    )
    parser.add_argument("--quick", action="store_true", help="two held-out sizes per workload")
    parser.add_argument(
        "--workload",
        action="append",
        dest="workloads",
        help="only this workload (repeatable; default: every workload the model knows)",
    )
    parser.add_argument(
        "--sizes",
        help='held-out sizes instead of the profile\'s: "240,300" for every workload, or '
        '"gemm=240,montecarlo=300000"',
    )
    parser.add_argument("--repeats", type=int, help="timed repeats per configuration")
    parser.add_argument("--seed", type=int, default=0, help="seed of random search and TPE")
    parser.add_argument(
        "--no-measure",
        action="store_true",
        help="replay the held-out landscape already in the log; measure nothing",
    )
    parser.add_argument(
        "--no-guard", action="store_true", help="skip the leave-one-kernel-out retraining"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..api import NoModelError, load
    from ..evaluation import EVAL_PROFILES, plan_held_out
    from ..evaluation.plan import parse_sizes
    from ..workloads import UnknownWorkload, get_workload

    settings = load_settings(quiet=True, home=args.home)
    try:
        model = load(settings.home)
    except NoModelError as error:
        raise UsageError(str(error)) from None
    profile = EVAL_PROFILES["quick" if args.quick else "full"]
    if args.repeats is not None:
        if args.repeats < 2:
            raise UsageError("--repeats must be at least 2 (the noise needs two runs)")
        profile = replace(profile, repeats=args.repeats)
    names = args.workloads or sorted(model.workloads)
    unknown = sorted(set(names) - set(model.workloads))
    if unknown:
        raise UsageError(
            f"the model was not trained on {unknown}; it knows {sorted(model.workloads)}"
        )
    try:
        workloads = [get_workload(name) for name in names]
    except UnknownWorkload as error:
        raise UsageError(str(error)) from None
    try:
        sizes = parse_sizes(args.sizes, names) if args.sizes else None
    except ValueError as error:
        raise UsageError(str(error)) from None
    spaces = {w.name: model.space_for(w.name) for w in workloads}
    chunks = plan_held_out(workloads, spaces, profile, sizes)
    trained = {(w, s) for w, ss in model.sizes.items() for s in ss}
    overlap = sorted({(j.workload, j.size) for c in chunks for j in c} & trained)
    if overlap:
        raise UsageError(
            "these sizes were used in training, so they cannot be held out: "
            + ", ".join(f"{w} {s}" for w, s in overlap)
        )
    return asyncio.run(_evaluate(settings, args, model, profile.name, chunks))


async def _evaluate(
    settings: Settings, args: argparse.Namespace, model: Any, profile: str, chunks: list[Any]
) -> int:
    from ..evaluation import EvaluationError, evaluate
    from ..evaluation.report import render
    from ..hardware import Fingerprint
    from ..stack import open_stack

    async with open_stack(settings, ("projector", "agent"), "evaluate") as stack:
        device_id = await stack.local_device()
        if model.device_id != device_id:
            raise UsageError(
                f"the model in {settings.models_dir} was trained on device {model.device_id}, "
                f"not this one ({device_id}): run `hpc-ds1 setup` here first"
            )
        fingerprint = Fingerprint.model_validate(model.fingerprint)
        info = sys.stderr if args.json else sys.stdout  # --json: stdout holds the JSON only
        print(
            f"evaluate ({profile}) model {model.version} on device {device_id} · "
            f"{sum(len(c) for c in chunks)} held-out runs · seed {args.seed} · "
            f"home {settings.home}",
            flush=True,
            file=info,
        )
        if not args.no_measure:
            await _measure(stack, device_id, chunks, info)
        await stack.caught_up()
        wanted = {(j.workload, j.size) for c in chunks for j in c}
        rows = await asyncio.to_thread(_load, stack.engine, device_id, wanted)
        with tqdm(total=1, unit="step", file=sys.stderr, dynamic_ncols=True) as bar:

            def progress(phase: str, done: int, total: int) -> None:
                if bar.desc != phase:
                    bar.reset(total=total)
                    bar.set_description_str(phase)
                bar.update(done - bar.n)

            try:
                evaluation = await asyncio.to_thread(
                    evaluate,
                    model,
                    rows,
                    fingerprint,
                    seed=args.seed,
                    guard_retrain=not args.no_guard,
                    progress=progress,
                )
            except EvaluationError as error:
                raise UsageError(str(error)) from None
        results = evaluation.results
        results["profile"] = profile
        plot = await asyncio.to_thread(_plot, settings.home, model, profile, evaluation)
        evaluation_id = await _publish(stack, device_id, model, profile, args.seed, results, plot)
    if args.json:
        print(
            orjson.dumps(
                {"evaluation_id": evaluation_id, **results}, option=orjson.OPT_INDENT_2
            ).decode()
        )
        return 0
    print(render(results))
    print("\nTargets")
    for t in results["targets"]:
        verdict = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        print(f"  {verdict:7} {t['target']}: {t['value']} (goal {t['goal']})")
    print(f"\nevaluation {evaluation_id} · plot {plot} · {results['seconds']:.0f} s of replay")
    return 0


async def _measure(stack: Any, device_id: str, chunks: list[Any], info: TextIO) -> None:
    from ..setup import Campaign

    campaign = Campaign(stack, device_id, purpose="evaluate", held_out=True)
    report = await run_campaign(campaign, chunks)
    print(
        f"measured {report.measured} held-out runs in {report.seconds:.0f} s "
        f"({report.skipped} already in the log; by status {report.by_status})",
        flush=True,
        file=info,
    )


def _load(engine: Any, device_id: str, held_sizes: set[tuple[str, int]]) -> list[Any]:
    """The device's training measurements, and its held-out ones at the sizes asked for."""
    from ..model import Measurement
    from ..services.trainer.training import load_measurements

    out = []
    for row in load_measurements(engine, device_id):
        if row["held_out"] and (row["workload"], row["size"]) not in held_sizes:
            continue
        out.append(Measurement.model_validate(row))
    return out


def _plot(home: Path, model: Any, profile: str, evaluation: Any) -> str:
    from ..evaluation.plot import write_plot

    name = f"{model.version}-{profile}.png"
    write_plot(
        home / "evaluation" / name,
        evaluation.sessions,
        evaluation.checks,
        evaluation.results["calibration"]["reliability"],
        f"model {model.version} · held-out sizes · seed {evaluation.results['seed']}",
    )
    return name


async def _publish(
    stack: Any,
    device_id: str,
    model: Any,
    profile: str,
    seed: int,
    results: dict[str, Any],
    plot: str,
) -> str:
    from ..events import EvaluationPublished, envelope, new_id

    evaluation_id = new_id()
    event = EvaluationPublished(
        evaluation_id=evaluation_id,
        device_id=device_id,
        model_version=model.version,
        profile=profile,
        seed=seed,
        landscape_runs=results["landscape"]["measurements"],
        results=orjson.loads(orjson.dumps(results, default=str)),
        plots=[plot],
    )
    await stack.bus.publish(
        envelope(event, actor="evaluate", source="evaluate", prefix=stack.settings.subject_prefix)
    )
    await stack.caught_up()
    return evaluation_id
