"""`hpc-ds1 observe`: record the measured runtime of a production run (a job script's `srun`,
timed by the script) as a measurement of this home's device, in the format setup records them
with purpose "observed", so the next training learns from production runs too.

    hpc-ds1 observe --workload gemm --size 2048 --ranks 4 --threads 2 --runtime-s 12.7"""

from __future__ import annotations

import argparse
import asyncio
import math
import uuid
from typing import Any

from . import UsageError
from .common import add_home_argument, add_json_argument, emit, knob_assignments, load_settings

PURPOSE = "observed"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "observe",
        help="record a production run's measured runtime so the next training learns from it",
        description="Record the runtime of a run made outside hpc-ds1 (a job script's srun) as "
        "a measurement of this home's device (purpose 'observed').",
    )
    parser.add_argument("--workload", required=True, help="the workload that ran (a known one)")
    parser.add_argument("--size", required=True, type=int, help="its problem size")
    parser.add_argument("--ranks", required=True, type=int, help="MPI ranks it ran with")
    parser.add_argument("--threads", required=True, type=int, help="threads per rank")
    parser.add_argument("--tile", type=int, default=None, help="tile (default: the workload's)")
    parser.add_argument(
        "--block",
        type=int,
        default=None,
        help="the kernel's second block, where it has one (default: the workload's)",
    )
    parser.add_argument("--gpu", action="store_true", help="it used the GPU kernels")
    parser.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a knob of the workload's own it ran with (repeat for each, e.g. --knob nb=64; "
        "`recommend --format env` exports them as HPC_DS1_KNOB_<NAME>); default: its default",
    )
    parser.add_argument(
        "--runtime-s", required=True, type=float, help="measured runtime in seconds (> 0)"
    )
    parser.add_argument(
        "--failed", action="store_true", help="the run failed (recorded as a failed run)"
    )
    add_json_argument(parser, "the recorded measurement")
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def _measurement(args: argparse.Namespace) -> tuple[Any, Any]:
    """The workload and the configuration, checked; UsageError saying what is accepted."""
    from pydantic import ValidationError

    from ..space import Config
    from ..workloads import get_workload, list_workloads

    try:
        workload = get_workload(args.workload)
    except KeyError:
        known = ", ".join(sorted(list_workloads()))
        raise UsageError(f"unknown workload {args.workload!r}: known are {known}") from None
    if args.size < 1:
        raise UsageError(f"--size must be a positive integer, not {args.size}")
    if not math.isfinite(args.runtime_s) or args.runtime_s <= 0:
        raise UsageError(f"--runtime-s must be a positive number of seconds, not {args.runtime_s}")
    tile = args.tile if args.tile is not None else workload.default_tile
    block = args.block if args.block is not None else workload.default_block
    knobs = {k.name: k.default for k in workload.knobs}
    given = knob_assignments(args.knob, "--knob")
    unknown = sorted(set(given) - set(knobs))
    if unknown:
        accepted = ", ".join(knobs) or "none: it has no knobs of its own"
        raise UsageError(f"--knob {', '.join(unknown)}: not a knob of {workload.name}; {accepted}")
    for knob in workload.knobs:
        if knob.name in given and given[knob.name] not in knob.values:
            raise UsageError(
                f"--knob {knob.name}={given[knob.name]}: not one of its values {list(knob.values)}"
            )
    knobs.update(given)
    try:
        config = Config(
            ranks=args.ranks,
            threads=args.threads,
            tile=tile,
            block=block,
            gpu=args.gpu,
            knobs=tuple(knobs.items()),
        )
    except ValidationError as error:
        first = error.errors()[0]
        raise UsageError(f"--{first['loc'][0]}: {first['msg']}") from None
    return workload, config


async def _record(settings: Any, event_of: Any) -> tuple[str, Any]:
    from ..events import envelope
    from ..stack import open_stack

    async with open_stack(settings, ("projector", "agent"), "observe") as stack:
        device_id = await stack.local_device()
        event = event_of(device_id)
        await stack.bus.publish(
            envelope(event, actor="observe", source="cli", prefix=settings.subject_prefix)
        )
        await stack.caught_up()
    return device_id, event


def handle(args: argparse.Namespace) -> int:
    from ..events import MeasurementRecorded

    settings = load_settings(quiet=True, home=args.home)
    workload, config = _measurement(args)
    ok = not args.failed
    work = workload.work(args.size)
    measurable = bool(work.flops or work.bytes_moved)

    def event_of(device_id: str) -> MeasurementRecorded:
        return MeasurementRecorded(
            measurement_id=f"{PURPOSE}:{uuid.uuid4().hex}",
            device_id=device_id,
            workload=workload.name,
            size=args.size,
            config=config.model_dump(),
            status="ok" if ok else "failed",
            runtime_s=args.runtime_s if ok else None,
            throughput=workload.throughput(args.size, args.runtime_s)
            if ok and measurable
            else None,
            throughput_unit=workload.throughput_unit or None,
            repeats=1,
            purpose=PURPOSE,
        )

    device_id, event = asyncio.run(_record(settings, event_of))
    emit(
        args,
        event.model_dump(mode="json"),
        f"recorded {event.workload} size={event.size} {config.label()}: "
        f"{f'{args.runtime_s:.6g} s' if ok else 'failed'} on device {device_id} "
        f"(measurement {event.measurement_id}; the next training learns from it)",
    )
    return 0
