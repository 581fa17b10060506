"""Running a command workload: its own command, once per run (a warm-up first unless it says
otherwise), behind the runner's launcher (mpiexec or srun) when its launcher is "mpi", in its
folder, with its environment template, timed by the wall clock or by its output, then checked.

Its environment is the scrubbed job environment without the thread pins the numba rank
program needs (OMP_NUM_THREADS=1 and the like): the workload's env template decides them
(default OMP_NUM_THREADS={threads})."""

from __future__ import annotations

import shlex
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from hpc_ds1.devicelock import Cancelled
from hpc_ds1.runner.procs import Process
from hpc_ds1.runner.result import Job, RunResult, Status
from hpc_ds1.workloads.base import CheckResult
from hpc_ds1.workloads.command import CommandOutputError, CommandWorkload, fill
from hpc_ds1.workloads.outcome import read_check, read_runtime

# The numba rank program's pins; a command's own env template sets what it needs instead.
PINNED = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


class _Failed(Exception):
    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


def command_env(wl: CommandWorkload, values: dict[str, str]) -> dict[str, str]:
    from hpc_ds1.runner.api import job_env

    ranks = int(values.get("ranks", "1"))
    launch = job_env(int(values["threads"]), ranks=ranks)
    env = {k: v for k, v in launch.items() if k not in PINNED}
    env.update(wl.environment(values))
    return env


def command_argv(
    wl: CommandWorkload, values: dict[str, str], launcher: str = "mpiexec"
) -> list[str]:
    """The command's words; with launcher "mpi", behind the runner's launcher (mpiexec -n
    {ranks}, or srun -n {ranks} --cpus-per-task {threads} inside Slurm: runner/launch.py)."""
    from hpc_ds1.runner import launch

    words = wl.argv(values)
    if wl.launcher == "mpi":
        return [*launch.prefix(launcher, int(values["ranks"]), int(values["threads"])), *words]
    return words


class _Runner:
    def __init__(
        self, wl: CommandWorkload, env: dict[str, str], timeout_s: float, cancel: Any
    ) -> None:
        self.wl, self.env, self.timeout_s, self.cancel = wl, env, timeout_s, cancel

    def once(self, argv: list[str], what: str) -> tuple[str, float]:
        """Output and wall time of one run of `argv`; _Failed when it did not end with 0."""
        from hpc_ds1.runner.api import GRACE_S

        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("cancelled before the job finished")
        started = time.monotonic()
        deadline = time.time() + self.timeout_s + GRACE_S
        cwd = self.wl.workdir or None
        try:
            proc = Process(argv, self.env, deadline=deadline, cancel=self.cancel, cwd=cwd)
        except OSError as error:
            raise _Failed(Status.FAILED, f"cannot start the {what}: {error}") from None
        with proc:
            code = proc.wait(self.timeout_s)
            if code is None and proc.cancelled():
                raise Cancelled("cancelled while the job ran; its processes were killed")
            if code is None:
                raise _Failed(
                    Status.TIMED_OUT,
                    f"the {what} did not finish within {self.timeout_s:g} s; process group killed",
                )
        wall = time.monotonic() - started
        if code == 127 and "cannot start" in proc.stderr_text():
            raise _Failed(Status.FAILED, proc.stderr_text())
        if code != 0:
            tail = proc.stderr_text() or proc.output_text()
            raise _Failed(Status.FAILED, f"the {what} ended with exit status {code}: {tail}")
        return proc.output_text(), wall

    def check_command(self, values: dict[str, str], output: str) -> CheckResult:
        """The check command, given the last run's output in the file {output}."""
        with tempfile.TemporaryDirectory(prefix="hpcds1-check-") as folder:
            out = Path(folder) / "output.txt"
            out.write_text(output)
            argv = shlex.split(
                fill(self.wl.check.command, {**values, "output": str(out)}, quote=True)
            )
            try:
                self.once(argv, "check command")
            except _Failed as failed:
                if failed.status is Status.FAILED and "exit status" in str(failed):
                    return CheckResult(False, 1.0, str(failed))
                raise
        return CheckResult(True, 0.0, "check command exited with 0")


def run_command(
    job: Job,
    wl: CommandWorkload,
    timeout_s: float,
    result: Any,
    cancel: threading.Event | None = None,
    launcher: str = "mpiexec",
) -> RunResult:
    """One job of a command workload; `result` builds the RunResult (api._result)."""
    from hpc_ds1.runner.api import mpiexec_path

    values = wl.values(job.config, job.size, mpiexec_path())
    argv = command_argv(wl, values, launcher)
    command = shlex.join(argv)
    runner = _Runner(wl, command_env(wl, values), timeout_s, cancel)
    times: list[float] = []
    warmup: float | None = None
    output = ""
    try:
        for attempt in range(job.repeats + (1 if wl.warmup else 0)):
            output, wall = runner.once(argv, "command")
            runtime = read_runtime(wl.runtime, output, wall)
            if wl.warmup and attempt == 0:
                warmup = runtime
            else:
                times.append(runtime)
        if wl.check.kind == "command":
            check: CheckResult | None = runner.check_command(values, output)
        else:
            check = read_check(wl.check, output)
    except _Failed as failed:
        return result(job, wl, failed.status, command, times=times, error=str(failed))
    except CommandOutputError as error:
        return result(job, wl, Status.FAILED, command, times=times, error=str(error))
    status = Status.OK if check is None or check.ok else Status.WRONG_ANSWER
    extra: dict[str, Any] = {"warmup_s": warmup}
    if check is not None:
        extra.update(check_ok=check.ok, check_error=check.error, check_detail=check.detail)
    return result(job, wl, status, command, times=times, **extra)
