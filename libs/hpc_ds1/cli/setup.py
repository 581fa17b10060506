"""`hpc-ds1 setup [--quick]`: measure this machine for real, then train and publish its model."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from ..eventlog.subjects import train_subject
from ..settings import Settings
from ..setup import PROFILES, Campaign, plan_jobs
from ..setup.budget import Budget, BudgetError, run_budgeted
from ..setup.warm import PriorOf, WarmError, from_projection, from_server
from ..stack import open_stack
from . import CommandFailed, PreconditionError, UsageError
from .common import (
    add_home_argument,
    add_json_argument,
    load_settings,
    print_json,
    run_campaign,
    with_run_progress,
)

TRAIN_TIMEOUT_S = 1800.0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("setup", help="measure this machine and train its model")
    parser.add_argument("--quick", action="store_true", help="three sizes per workload")
    parser.add_argument(
        "--workload",
        action="append",
        dest="workloads",
        help="only this workload (repeatable; default: every registered one)",
    )
    parser.add_argument(
        "--workload-file",
        action="append",
        dest="workload_files",
        metavar="PATH",
        help="a TOML workload file (docs/plugins.md) to measure too (repeatable; with no "
        "--workload, only the files' workloads are measured)",
    )
    parser.add_argument(
        "--sizes",
        help="comma-separated sizes for every selected workload, instead of the profile's",
    )
    parser.add_argument(
        "--budget",
        metavar="RUNS|DURATION",
        help="measure at most RUNS configurations in all (600), or for at most DURATION (30m, "
        "2h), chosen by what they are expected to teach (active learning), instead of every "
        "configuration",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="with --budget: start from what the fleet measured of the same workload on other "
        "devices (this home's projection: every joined device's measurements), not from scratch",
    )
    parser.add_argument(
        "--warm-from",
        metavar="WORKLOAD[,WORKLOAD…]",
        help="with --budget: also start from these workloads' measurements, on any device "
        "(recorded GPUs of the same kernel, each a workload file); implies --warm",
    )
    parser.add_argument(
        "--server",
        help="with --warm: the fleet's coordinator to read the siblings' measurements from "
        "(GET /v1/measurements); default: this home's own projection",
    )
    parser.add_argument(
        "--token",
        help="bearer token for --server, of role viewer or above (default: this home's own, "
        "when the server is this home's)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="timed repeats per configuration (default: a workload's own `repeats`, else 2)",
    )
    parser.add_argument("--no-train", action="store_true", help="measure only")
    add_json_argument(parser, "what was measured and the trained model")
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def _sizes(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--sizes {text!r}: give whole numbers separated by commas") from None
    if not sizes or min(sizes) <= 0:
        raise UsageError(f"--sizes {text!r}: every size must be a positive integer")
    return sizes


def handle(args: argparse.Namespace) -> int:
    from ..workloads import (
        UnknownWorkload,
        WorkloadFileError,
        get_workload,
        list_workloads,
        load_file,
    )

    settings = load_settings(quiet=True, home=args.home)
    profile = PROFILES["quick" if args.quick else "full"]
    if args.repeats is not None and args.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    try:
        from_files = [load_file(path).name for path in args.workload_files or ()]
    except WorkloadFileError as error:
        raise UsageError(str(error)) from None
    names = args.workloads or ([] if from_files else list_workloads())
    names += [n for n in from_files if n not in names]
    try:
        workloads = [get_workload(name) for name in names]
    except UnknownWorkload as error:
        raise UsageError(str(error)) from None
    sizes = _sizes(args.sizes)
    budget = None
    if args.budget is not None:
        try:
            budget = Budget.parse(args.budget)
        except BudgetError as error:
            raise UsageError(str(error)) from None
    warm_from = _warm_from(args, budget)
    server = _server(args, warm_from, settings.home)
    try:
        return asyncio.run(
            _setup(
                settings,
                profile,
                workloads,
                sizes,
                not args.no_train,
                as_json=args.json,
                budget=budget,
                repeats=args.repeats,
                warm_from=warm_from,
                server=server,
            )
        )
    except WarmError as error:  # what was measured before it is in the log already
        raise PreconditionError(str(error)) from None


def _server(
    args: argparse.Namespace, warm_from: list[str] | None, home: Path
) -> tuple[str, str | None] | None:
    """(URL, bearer) of --server for a warm setup; None: this home's projection."""
    if args.server is None:
        if args.token is not None:
            raise UsageError("--token goes with --server")
        return None
    if warm_from is None:
        raise UsageError("--server is where a warm setup reads the fleet from: give --warm too")
    from ..security.credentials import CredentialError, bearer_for

    try:
        return args.server, bearer_for(home, args.server, args.token)
    except CredentialError as error:
        raise UsageError(str(error)) from None


def _warm_from(args: argparse.Namespace, budget: Budget | None) -> list[str] | None:
    """None: a cold start; else the workloads whose measurements are siblings too."""
    if not args.warm and args.warm_from is None:
        return None
    if budget is None:
        raise UsageError(
            "--warm and --warm-from choose a budgeted setup's first runs: give --budget too "
            "(a whole setup measures every configuration, so it has nothing to choose)"
        )
    names = [n.strip() for n in (args.warm_from or "").split(",") if n.strip()]
    if args.warm_from is not None and not names:
        raise UsageError(f"--warm-from {args.warm_from!r}: give workload names, comma-separated")
    return names


async def _setup(
    settings: Settings,
    profile: Any,
    workloads: list[Any],
    sizes: list[int] | None,
    train: bool,
    as_json: bool = False,
    budget: Budget | None = None,
    repeats: int | None = None,
    warm_from: list[str] | None = None,
    server: tuple[str, str | None] | None = None,
) -> int:
    """`repeats`: `--repeats`, for every workload; None: each workload's own, else the
    profile's (plan_jobs). `warm_from`: a warm budgeted setup (setup/warm.py), from `server`
    ((URL, bearer) of the coordinator) or this home's projection; None: cold."""
    from ..machine.hardware import fingerprint
    from ..space import ConfigSpace

    fp = await asyncio.to_thread(fingerprint)
    spaces = {w.name: ConfigSpace.for_device(fp, w) for w in workloads}
    chunks = plan_jobs(workloads, spaces, profile, sizes, repeats)
    declared = sorted({c[0].repeats for c in chunks if c})
    times = "/".join(map(str, declared)) if declared else str(repeats or profile.repeats)
    out = sys.stderr if as_json else sys.stdout  # --json: stdout holds the JSON only
    found: dict[str, Any] = {"profile": profile.name, "model": None}
    async with open_stack(settings, ("projector", "agent", "trainer"), "setup") as stack:
        device_id = await stack.local_device()
        whole = sum(len(c) for c in chunks)
        planned = f"{whole} runs planned · {times} timed repeats in interleaved rounds"
        if budget is not None:
            limit = f"{budget.runs} runs" if budget.runs else f"{budget.seconds:g} s"
            planned = (
                f"budget {limit} of the {whole} configurations, chosen by active learning · "
                f"{times} timed repeats each"
            )
        print(
            f"setup ({profile.name}) of device {device_id} · {fp.cpu_model} · {planned}, "
            f"seed 0 · home {settings.home}",
            flush=True,
            file=out,
        )
        if budget is None:
            report = await run_campaign(Campaign(stack, device_id), chunks)
        else:
            cells = [(c[0].workload, c[0].size, spaces[c[0].workload]) for c in chunks if c]
            report = await with_run_progress(
                budget.runs or whole,
                lambda p: run_budgeted(
                    Campaign(stack, device_id),
                    cells,
                    budget,
                    repeats,
                    p,
                    default_repeats=profile.repeats,
                    prior_of=_prior_of(stack, device_id, warm_from, server),
                ),
            )
            for name, count in report.siblings.items():
                start = f"the top of {count} siblings' consensus" if count else "scratch"
                print(f"warm start of {name}: from {start}", flush=True, file=out)
        print(
            f"measured {report.measured} runs in {report.seconds:.0f} s "
            f"({report.skipped} already in the log; by status {report.by_status})",
            flush=True,
            file=out,
        )
        found.update(
            device_id=device_id,
            planned=sum(len(c) for c in chunks),
            measured=report.measured,
            skipped=report.skipped,
            by_status=report.by_status,
            seconds=report.seconds,
        )
        if warm_from is not None:
            found["siblings"] = report.siblings
        await stack.caught_up()  # every measurement in the home's database (an agent reads it)
        if not train:
            if as_json:
                print_json(found)
            return 0
        started = time.monotonic()
        reply = await stack.bus.nc.request(
            train_subject(settings),
            orjson.dumps({"device_id": device_id}),
            timeout=TRAIN_TIMEOUT_S,
        )
    answer = orjson.loads(reply.data)
    if not answer.get("ok"):
        raise CommandFailed(f"training failed: {answer.get('error')}")
    took = time.monotonic() - started
    if as_json:
        found["model"] = {
            "version": answer["version"],
            "path": answer["path"],
            "train_seconds": took,
            "metrics": answer["metrics"],
        }
        print_json(found)
        return 0
    print(f"trained model {answer['version']} in {took:.1f} s: {answer['path']}")
    for key, value in _headline(answer["metrics"]).items():
        print(f"  {key}: {value}")
    return 0


def _headline(metrics: dict[str, Any]) -> dict[str, Any]:
    """The scalar training metrics, for the terminal; the full set is in the model event."""
    return {k: v for k, v in metrics.items() if isinstance(v, int | float | str)}


def _prior_of(
    stack: Any, device_id: str, warm_from: list[str] | None, server: tuple[str, str | None] | None
) -> PriorOf | None:
    if warm_from is None:
        return None
    if server is not None:
        return from_server(server[0], server[1], device_id, warm_from)
    return from_projection(stack.engine, device_id, warm_from)
