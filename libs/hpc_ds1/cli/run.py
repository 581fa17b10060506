"""`hpc-ds1 run`: run one job for real on this machine and print its result."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from hpc_ds1.cli import UsageError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run one job for real (MPI ranks x numba threads) and print its result",
        description="Run a workload at one size and configuration on this machine.",
    )
    parser.add_argument(
        "--workload",
        help="gemm, stencil, nbody, montecarlo, a workload file's, ... (with --command: a new "
        "name for it)",
    )
    parser.add_argument("--size", required=True, help="problem size (a positive integer)")
    parser.add_argument("--ranks", type=int, default=1, help="MPI ranks (default 1)")
    parser.add_argument("--threads", type=int, default=None, help="numba threads per rank")
    parser.add_argument("--tile", type=int, default=None, help="tile (default: the workload's)")
    parser.add_argument(
        "--block",
        type=int,
        default=None,
        help="the kernel's second block, where it has one (default: the workload's)",
    )
    parser.add_argument("--gpu", action="store_true", help="use the CUDA kernels")
    parser.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a knob of the workload's own (repeat for each, e.g. --knob nb=64 --knob p=1); "
        "default: each knob's default",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed repeats (default: the workload's own `repeats`, else 3)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds one run may take (default: the workload's own `timeout`, else 300)",
    )
    parser.add_argument(
        "--launcher",
        choices=("mpiexec", "srun"),
        default=None,
        help="how the ranks start: mpiexec, or srun (a job step of the Slurm allocation this "
        "runs in, or a new one); default $HPC_DS1_LAUNCHER, else mpiexec",
    )
    parser.add_argument(
        "--command",
        dest="command_template",
        default=None,
        help="run an external command template instead ({ranks} {threads} {tile} {size}); it "
        "must print a line 'runtime_s=<seconds>'",
    )
    parser.add_argument(
        "--workload-file",
        metavar="PATH",
        help="a TOML workload file (docs/plugins.md): run the workload it declares",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=handle)


def _workload(args: argparse.Namespace) -> Any:
    """The workload --workload, --workload-file or --command name (one of them, clearly)."""
    from hpc_ds1.workloads import (
        UnknownWorkload,
        WorkloadFileError,
        command_workload,
        get_workload,
        list_workloads,
        load_file,
        source_of,
    )

    if args.command_template is not None and args.workload_file is not None:
        raise UsageError("give --command or --workload-file, not both")
    if args.workload_file is not None:
        try:
            loaded = load_file(args.workload_file)
        except WorkloadFileError as error:
            raise UsageError(str(error)) from None
        if args.workload is not None and args.workload != loaded.name:
            raise UsageError(
                f"--workload {args.workload} and --workload-file {args.workload_file} disagree: "
                f"the file declares {loaded.name!r}; drop --workload"
            )
        return loaded
    if args.workload is None:
        raise UsageError("give --workload NAME (or --workload-file PATH)")
    if args.command_template is not None:
        if args.workload in list_workloads():
            raise UsageError(
                f"--workload {args.workload} with --command: {args.workload!r} is already a "
                f"workload ({source_of(args.workload)}), and --command would run instead of it; "
                "give the command a name of its own, or drop --command to run the workload"
            )
        try:
            return command_workload(args.workload, args.command_template)
        except ValueError as error:
            raise UsageError(f"--command: {error}") from None
    try:
        return get_workload(args.workload)
    except UnknownWorkload as error:
        raise UsageError(str(error)) from None


def _result(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from hpc_ds1.runner import InvalidJob, run
    from hpc_ds1.space import Config, ConfigSpace

    workload = _workload(args)
    space = ConfigSpace.for_device(workload=workload)
    threads = args.threads if args.threads is not None else max(space.threads)
    tile = args.tile if args.tile is not None else workload.default_tile
    block = args.block if args.block is not None else workload.default_block
    from hpc_ds1.cli.common import knob_assignments

    knobs = {k.name: k.default for k in workload.knobs}  # what the run would take without any
    given = knob_assignments(args.knob, "--knob")
    unknown = sorted(set(given) - set(knobs))
    if unknown:
        accepted = ", ".join(knobs) or "none: it has no knobs of its own"
        raise UsageError(f"--knob {', '.join(unknown)}: not a knob of {workload.name}; {accepted}")
    knobs.update(given)
    try:
        config = Config(
            ranks=args.ranks,
            threads=threads,
            tile=tile,
            block=block,
            gpu=args.gpu,
            knobs=tuple(knobs.items()),
        )
    except ValidationError as error:
        first = error.errors()[0]
        raise UsageError(f"{first['loc'][0]}: {first['msg']}") from None
    if args.repeats is not None and args.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, not {args.repeats}")
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError(f"--timeout must be positive, not {args.timeout}")
    from hpc_ds1.machine.devicelock import device_lock
    from hpc_ds1.settings import Settings

    try:
        # One job at a time on this machine: a run queues behind a served job or a setup.
        with device_lock(Settings().home), _elapsed(workload, args) as on_start:
            return run(
                workload,
                args.size,
                config,
                repeats=args.repeats,
                timeout_s=args.timeout,
                space=space,
                launcher=args.launcher,
                on_start=on_start,
            )
    except InvalidJob as error:
        raise UsageError(str(error)) from None
    except KeyboardInterrupt:
        # Ctrl-C: the runner's `with Process` has killed the run's whole process group (its
        # guard, the launcher, every rank) on the way out; say so, then exit 130
        print("hpc-ds1 run: cancelled (Ctrl-C); the run's processes were killed", file=sys.stderr)
        raise


@contextlib.contextmanager
def _elapsed(workload: Any, args: argparse.Namespace) -> Iterator[Callable[[Any], None]]:
    """For a person watching (stderr a terminal), a line that says how long the run in flight
    has run, redrawn every second: a real application's run takes minutes."""
    from hpc_ds1.cli.common import show_progress
    from hpc_ds1.runner import run_timeout
    from hpc_ds1.runner.inflight import InFlight, elapsed_words, job_words

    inflight = InFlight()
    if not show_progress():
        yield inflight.start
        return
    stop = threading.Event()
    limit = elapsed_words(run_timeout(workload, args.timeout))

    def draw() -> None:
        while not stop.wait(1.0):
            now = inflight.now()
            if now is not None:
                line = f"{job_words(now.job)} · {elapsed_words(now.elapsed_s)} (timeout {limit})"
                sys.stderr.write(f"\r\x1b[K{line}")
                sys.stderr.flush()

    drawer = threading.Thread(target=draw, daemon=True)
    drawer.start()
    try:
        yield inflight.start
    finally:
        stop.set()
        drawer.join()
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()


def _text(r: Any) -> str:
    lines = [f"{r.workload} size={r.size} {r.config.label()}: {r.status.value}"]
    if r.runtime_s is not None:
        tp = f"{r.throughput:.2f} {r.throughput_unit}" if r.throughput is not None else "n/a"
        lines.append(
            f"  runtime {r.runtime_s:.6f} s (median of {r.repeats}, min {r.min_runtime_s:.6f} s, "
            f"spread {100 * (r.spread or 0):.1f}%)  throughput {tp}"
        )
    if r.check_ok is not None:
        verdict = "passed" if r.check_ok else "FAILED"
        lines.append(f"  check {verdict}: error {r.check_error:.3e} ({r.check_detail})")
    if r.peak_memory_bytes:
        lines.append(f"  memory {r.peak_memory_bytes / 2**20:.0f} MiB resident (all ranks)")
    timing = []
    if r.startup_s is not None:
        timing.append(f"startup {r.startup_s:.3f} s")
    if r.jit_s is not None:
        timing.append(f"jit {r.jit_s:.3f} s")
    if timing:
        lines.append("  " + ", ".join(timing))
    if r.error:
        lines.append(f"  error: {r.error}")
    lines.append(f"  command: {r.command}")
    return "\n".join(lines)


def handle(args: argparse.Namespace) -> int:
    result = _result(args)
    if args.json:
        print(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        print(_text(result))
    return 0 if result.ok else 1
