"""run() and run_many(): jobs for real under `mpiexec`, one launch per ranks value, with
timeouts that kill the whole process group. Command workloads run their own command (command.py).

Every launch runs under a guard (see procs.py) with an absolute deadline, and every rank carries
its own deadline too, so a job never outlives its runner nor its timeout. Jobs get a scrubbed
environment (`job_env`): an allowlist, and never a setting of this service nor anything named
like a credential."""

from __future__ import annotations

import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpc_ds1.machine.devicelock import Cancelled
from hpc_ds1.runner import launch, protocol
from hpc_ds1.runner.checks import InvalidJob, check_size, validate
from hpc_ds1.runner.jobenv import GRACE_S, job_env
from hpc_ds1.runner.jobspec import JobSpec, knob_text
from hpc_ds1.runner.noise import coefficient_of_variation, relative_spread
from hpc_ds1.runner.procs import Process
from hpc_ds1.runner.result import Job, RunResult, Status
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import CommandWorkload, Workload
from hpc_ds1.workloads.recorded import RecordedWorkload, replay
from hpc_ds1.workloads.recorded_space import NotRecorded

OnStart = Callable[[Job], None]  # called as each job starts (run_many)

DEFAULT_TIMEOUT_S = 300.0  # a run's, when neither its caller nor its workload says
LAUNCH_TIMEOUT_S = 120.0
BUILTIN_PREFIX = "hpc_ds1.workloads."


def mpiexec_path() -> str:
    return launch.mpiexec_path()


def _declared(workload: str | Workload) -> Workload | None:
    if isinstance(workload, Workload):
        return workload
    from hpc_ds1.workloads import get_workload

    try:
        return get_workload(workload)
    except LookupError:
        return None  # validate() says what is wrong with the name, with what is known


def run_timeout(
    workload: str | Workload,
    given: float | None = None,
    cap: float | None = None,
    default: float = DEFAULT_TIMEOUT_S,
) -> float:
    """The timeout of one run of `workload`: `given` (a caller's explicit one, e.g. `run
    --timeout`), else the workload's own (a workload file's `timeout`), else `default`; never
    past `cap` (a site's HPC_DS1_MAX_RUN_S, which an agent enforces)."""
    wl = _declared(workload)
    own = wl.timeout_s if wl is not None else None
    timeout = given if given is not None else own if own is not None else default
    return min(timeout, cap) if cap is not None else timeout


def run_repeats(workload: str | Workload, given: int | None = None, default: int = 3) -> int:
    """The timed runs of one measurement of `workload`: `given` (a caller's explicit count),
    else the workload's own (a workload file's `repeats`), else `default`."""
    if given is not None:
        return given
    wl = _declared(workload)
    return wl.repeats if wl is not None and wl.repeats is not None else default


def _spec(job: Job, wl: Workload) -> JobSpec:
    module = "" if wl.module.startswith(BUILTIN_PREFIX) else wl.module
    c = job.config
    knobs = tuple((name, knob_text(value)) for name, value in c.knobs)
    return JobSpec(wl.name, job.size, c.threads, c.tile, job.repeats, c.gpu, module, c.block, knobs)


def _result(job: Job, wl: Workload, status: Status, command: str, **fields: Any) -> RunResult:
    work = wl.work(job.size)
    times: list[float] = list(fields.pop("times", []) or [])
    stats: dict[str, Any] = {}
    if times:
        median = statistics.median(times)
        warm = fields.get("warmup_s")
        stats = {
            "runtime_s": median,
            "runtimes_s": tuple(times),
            "min_runtime_s": min(times),
            "spread": relative_spread(times),
            "cv": coefficient_of_variation(times),
            "repeats": len(times),
            "throughput": wl.throughput(job.size, median)
            if work.flops or work.bytes_moved
            else None,
            "items_per_s": work.items / median if median > 0 else None,
            "jit_s": max(warm - median, 0.0) if warm is not None else None,
        }
    return RunResult(
        workload=wl.name,
        size=job.size,
        config=job.config,
        status=status,
        throughput_unit=wl.throughput_unit,
        item_name=wl.item_name,
        flops=work.flops,
        bytes_moved=work.bytes_moved,
        memory_bytes=work.memory_bytes,
        command=command,
        **stats,
        **fields,
    )


def _launch_argv(
    ranks: int, specs: Sequence[JobSpec], launcher: str = "mpiexec", threads: int = 1
) -> list[str]:
    argv = [*launch.prefix(launcher, ranks, threads), sys.executable, "-m", "hpc_ds1.runner.rank"]
    for spec in specs:
        argv += ["--job", spec.encode()]
    return argv


def _early_exit(report: Path, stderr: str) -> tuple[Status, str]:
    """Why a launch ended before its jobs did: the error a rank reported, else its stderr."""
    error = protocol.reported_error(report)
    if error is not None:
        return Status.FAILED, f"rank {error.get('rank')}: {error.get('error')}"
    return Status.FAILED, stderr or "rank program exited early"


def _run_batch(
    ranks: int,
    batch: list[tuple[Job, Workload]],
    timeout_s: float,
    launch_timeout_s: float,
    cancel: threading.Event | None = None,
    launcher: str = "mpiexec",
    on_start: OnStart | None = None,
) -> list[RunResult]:
    """Run jobs in one launch; after a timeout or a crash, relaunch for the jobs left."""
    with tempfile.TemporaryDirectory(prefix="hpc-ds1-launch-") as scratch:
        return _launch_until_done(
            ranks, batch, timeout_s, launch_timeout_s, cancel, launcher, Path(scratch), on_start
        )


def _launch_until_done(
    ranks: int,
    batch: list[tuple[Job, Workload]],
    timeout_s: float,
    launch_timeout_s: float,
    cancel: threading.Event | None,
    launcher: str,
    scratch: Path,
    on_start: OnStart | None = None,
) -> list[RunResult]:
    results: list[RunResult] = []
    pending = list(batch)
    while pending:
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled before the job started")
        specs = [_spec(job, wl) for job, wl in pending]
        threads = max(job.config.threads for job, _ in pending)
        base = _launch_argv(ranks, specs, launcher, threads)
        now = time.time()
        # Each rank kills itself past its own deadline (timeouts plus grace), runner or not.
        limits = ["--job-timeout-s", repr(timeout_s + GRACE_S)]
        limits += ["--launch-deadline", repr(now + launch_timeout_s + GRACE_S)]
        report = scratch / f"report-{len(results)}"  # each launch ends at least one job
        argv = [*base, *limits, "--launched-at", repr(now), "--report-file", str(report)]
        env = job_env(threads, ranks=ranks)
        command = shlex.join(base)
        launched = time.monotonic()
        done = 0
        whole = now + launch_timeout_s + len(pending) * timeout_s + GRACE_S
        with Process(argv, env, deadline=whole, cancel=cancel) as proc:
            startup: float | None = None
            failure: tuple[Status, str] | None = None
            deadline = launched + launch_timeout_s
            while done < len(pending):
                kind, line = proc.next_line(deadline)
                if kind == "cancelled":
                    raise Cancelled("cancelled while the job ran; its processes were killed")
                if kind == "timeout":
                    what = "start" if startup is None else f"finish within {timeout_s:g} s"
                    failure = (Status.TIMED_OUT, f"did not {what}; process group killed")
                    break
                if kind == "eof":
                    failure = _early_exit(report, proc.stderr_text())
                    break
                event = protocol.parse(line or "")
                if event is None:
                    continue
                name = event.get("event")
                if name == "ready":
                    startup = time.monotonic() - launched
                elif name == "start":
                    deadline = time.monotonic() + timeout_s
                    if on_start is not None:
                        on_start(pending[done][0])
                elif name == "error":
                    proc.wait(5)
                    failure = (Status.FAILED, f"rank {event.get('rank')}: {event.get('error')}")
                    break
                elif name == "result":
                    job, wl = pending[done]
                    ok = bool(event["check_ok"])
                    results.append(
                        _result(
                            job,
                            wl,
                            Status.OK if ok else Status.WRONG_ANSWER,
                            command,
                            times=event["times"],
                            warmup_s=event["warmup_s"],
                            check_ok=ok,
                            check_error=event["check_error"],
                            check_detail=event["check_detail"],
                            peak_memory_bytes=event["peak_memory_bytes"],
                            startup_s=startup,
                        )
                    )
                    done += 1
            if failure is None:
                proc.wait(30)
        if failure is not None:
            job, wl = pending[done]
            status, message = failure
            results.append(_result(job, wl, status, command, error=message, startup_s=startup))
            done += 1
        pending = pending[done:]
    return results


def run_many(
    jobs: Sequence[Job],
    *,
    timeout_s: float | None = None,
    launch_timeout_s: float = LAUNCH_TIMEOUT_S,
    space: ConfigSpace | None = None,
    cancel: threading.Event | None = None,
    launcher: str | None = None,
    on_start: OnStart | None = None,
) -> list[RunResult]:
    """Run jobs, one `mpiexec` (or `srun`) launch per ranks value; results in the order of
    `jobs`.

    Every job is validated first (InvalidJob before anything starts). `timeout_s` bounds each
    job (from its start inside the launch, warm-up and JIT included; a command workload's,
    each run of its command); None: each workload's own (`run_timeout`). Setting `cancel`
    kills the running job's whole process group within a fraction of a second and raises
    Cancelled. `launcher`: mpiexec or srun (launch.py); None: HPC_DS1_LAUNCHER. `on_start(job)`
    is called (from this thread) as each job starts: what a heartbeat or a progress bar says
    is in flight."""
    try:
        launcher = launch.check(launcher or launch.default_launcher())
    except launch.LauncherError as error:
        raise InvalidJob(str(error)) from None
    checked = []
    for job in jobs:
        wl, _ = validate(job.workload, job.size, job.config, space)
        if job.repeats < 1:
            raise InvalidJob(f"repeats must be >= 1, not {job.repeats}")
        checked.append((job, wl))
    out: dict[int, RunResult] = {}
    groups: dict[int, list[int]] = {}
    for i, (job, wl) in enumerate(checked):
        if isinstance(wl, CommandWorkload):
            from hpc_ds1.runner.command import run_command

            if on_start is not None:
                on_start(job)
            out[i] = run_command(job, wl, run_timeout(wl, timeout_s), _result, cancel, launcher)
        elif isinstance(wl, RecordedWorkload):
            out[i] = _replayed(job, wl)
        else:
            groups.setdefault(job.config.ranks, []).append(i)
    for ranks, indices in sorted(groups.items()):
        batch = [checked[i] for i in indices]
        # one launch, one per-job timeout for its rank program: the longest any job is given
        timeout = max(run_timeout(wl, timeout_s) for _, wl in batch)
        for i, result in zip(
            indices,
            _run_batch(ranks, batch, timeout, launch_timeout_s, cancel, launcher, on_start),
            strict=True,
        ):
            out[i] = result
    return [out[i] for i in range(len(checked))]


def _replayed(job: Job, wl: RecordedWorkload) -> RunResult:
    """A recorded workload's run: its repeats drawn from the file (workloads.recorded)."""
    try:
        status, times, error = replay(wl, dict(job.config.knobs), job.repeats)
    except NotRecorded as missing:
        raise InvalidJob(f"{wl.name}: {missing}") from None
    command = f"replay {wl.recorded}"
    if status != "ok":
        return _result(job, wl, Status(status), command, error=error)
    return _result(job, wl, Status.OK, command, times=times, check_ok=True)


def run(
    workload: str | Workload,
    size: int | str,
    config: Config,
    *,
    repeats: int | None = None,
    timeout_s: float | None = None,
    space: ConfigSpace | None = None,
    cancel: threading.Event | None = None,
    launcher: str | None = None,
    on_start: OnStart | None = None,
) -> RunResult:
    """Run one job for real and return its result (InvalidJob if it cannot be launched;
    Cancelled when `cancel` is set before it ends). `repeats` and `timeout_s`: None, the
    workload's own (`run_repeats`, `run_timeout`); `launcher`, `on_start`: see run_many."""
    name = workload.name if isinstance(workload, Workload) else workload
    repeats = run_repeats(workload, repeats)
    job = Job(workload=name, size=check_size(size), config=config, repeats=repeats)
    if isinstance(workload, Workload):
        from hpc_ds1.workloads import get_workload, list_workloads, register

        if isinstance(workload, CommandWorkload | RecordedWorkload) or name not in list_workloads():
            register(workload, replace=True)
        elif get_workload(name) is not workload:
            raise InvalidJob(f"another workload named {name!r} is already registered")
    return run_many(
        [job], timeout_s=timeout_s, space=space, cancel=cancel, launcher=launcher, on_start=on_start
    )[0]
