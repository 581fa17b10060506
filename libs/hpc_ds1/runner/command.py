"""Running a command workload: its own command, once per run (a warm-up first unless it says
otherwise), behind the runner's launcher (mpiexec or srun) when its launcher is "mpi", or Open
MPI's own mpirun when it is "openmpi" (runner/mpienv.py), in its folder (or a fresh one per run,
holding its input files, when it has inputs or an output file), with its environment template,
timed by the wall clock or by its output, then checked.

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

from hpc_ds1.machine.devicelock import Cancelled
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


def command_env(
    wl: CommandWorkload, values: dict[str, str], launcher: str = "mpiexec"
) -> dict[str, str]:
    """The job's scrubbed environment, the workload's env template on top, and nothing of the
    MPI implementation that does not launch it (runner/mpienv.py): Open MPI's mpirun gets no
    MPICH folder nor variable, our mpiexec no Open MPI variable."""
    from hpc_ds1.runner import mpienv
    from hpc_ds1.runner.jobenv import job_env

    ranks = int(values.get("ranks", "1"))
    launch = job_env(int(values["threads"]), ranks=ranks)
    env = {k: v for k, v in launch.items() if k not in PINNED}
    env.update(wl.environment(values))
    if wl.launcher == "openmpi":
        return mpienv.mpi_env(env, "openmpi", mpienv.ours(values.get("mpiexec")))
    if wl.launcher == "mpi" and launcher == "mpiexec":
        return mpienv.mpi_env(env, "mpich")
    return env


def command_argv(
    wl: CommandWorkload,
    values: dict[str, str],
    launcher: str = "mpiexec",
    env: dict[str, str] | None = None,
) -> list[str]:
    """The command's words; with launcher "mpi", behind the runner's launcher (mpiexec -n
    {ranks}, or srun -n {ranks} --cpus-per-task {threads} inside Slurm: runner/launch.py);
    with "openmpi", behind Open MPI's mpirun found on `env`'s PATH (LauncherError if none),
    or, when the runner's launcher is srun, as a job step: srun --mpi=pmix. A knob that is the
    launcher's binding (`bind_knob`) adds the launcher's binding words."""
    from hpc_ds1.runner import launch, mpienv

    words = wl.argv(values)
    bind = values[wl.bind_knob] if wl.bind_knob else None  # the knob that binds the ranks
    if wl.launcher == "mpi":
        ranks, threads = int(values["ranks"]), int(values["threads"])
        return [*launch.prefix(launcher, ranks, threads, bind), *words]
    if wl.launcher == "openmpi" and launcher == "srun":
        # inside (or through) Slurm, Open MPI's ranks are a job step of their own: srun starts
        # them with PMIx, which Open MPI reads instead of its mpirun's daemons
        ranks, threads = int(values["ranks"]), int(values["threads"])
        return [*launch.prefix("srun", ranks, threads, bind, mpi=launch.SRUN_OPENMPI), *words]
    if wl.launcher == "openmpi":
        path = (env or {}).get("PATH")
        mpirun = mpienv.openmpi_mpirun(path)
        if mpirun is None:
            raise launch.LauncherError(
                f"Open MPI's mpirun ({', '.join(mpienv.OPENMPI_NAMES)}) is not on PATH: install "
                f"Debian's {mpienv.OPENMPI_PACKAGE} (apt-get install {mpienv.OPENMPI_PACKAGE})"
                + (f" or {wl.package}, which brings it" if wl.package else "")
            )
        return [*mpienv.openmpi_argv(mpirun, int(values["ranks"]), bind or "none"), *words]
    return words


class _Runner:
    def __init__(
        self, wl: CommandWorkload, env: dict[str, str], timeout_s: float, cancel: Any
    ) -> None:
        self.wl, self.env, self.timeout_s, self.cancel = wl, env, timeout_s, cancel

    def once(
        self, argv: list[str], what: str, inputs: dict[str, str] | None = None
    ) -> tuple[str, float]:
        """Output and wall time of one run of `argv`; _Failed when it did not end with 0.
        With `inputs` (a workload with input or output files), the run has a fresh folder of
        its own: the inputs are written there, and its output file is read after the run."""
        if inputs is None:
            return self._once(argv, what, self.wl.workdir or None)
        with tempfile.TemporaryDirectory(prefix=f"hpcds1-{self.wl.name}-") as folder:
            for name, text in inputs.items():
                (Path(folder) / name).write_text(text)
            output, wall = self._once(argv, what, folder)
            if self.wl.output:
                written = Path(folder) / self.wl.output
                try:
                    output = f"{output}\n{written.read_text(errors='replace')}"
                except OSError as error:
                    raise _Failed(
                        Status.FAILED, f"the {what} wrote no {self.wl.output}: {error}"
                    ) from None
            return output, wall

    def _once(self, argv: list[str], what: str, cwd: str | None) -> tuple[str, float]:
        from hpc_ds1.runner.jobenv import GRACE_S

        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("cancelled before the job finished")
        started = time.monotonic()
        deadline = time.time() + self.timeout_s + GRACE_S
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
    from hpc_ds1.runner.launch import LauncherError, mpiexec_path

    values = wl.values(job.config, job.size, mpiexec_path())
    env = command_env(wl, values, launcher)
    try:
        argv = command_argv(wl, values, launcher, env)
    except LauncherError as error:
        return result(job, wl, Status.FAILED, wl.template, times=[], error=str(error))
    command = shlex.join(argv)
    runner = _Runner(wl, env, timeout_s, cancel)
    inputs = wl.input_files(values) if wl.fresh_folder else None
    times: list[float] = []
    warmup: float | None = None
    output = ""
    try:
        for attempt in range(job.repeats + (1 if wl.warmup else 0)):
            output, wall = runner.once(argv, "command", inputs)
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


def missing_programs(wl: CommandWorkload, launcher: str | None = None) -> list[str]:
    """What this workload needs to run here and does not find, each in words that name the
    program and, when the file says, the package to install: its command's program (on the
    PATH its launch sees, or a path relative to its folder) and its launcher's."""
    import os
    import shutil

    from hpc_ds1.runner import launch, mpienv

    out: list[str] = []
    install = f": install {wl.package} (e.g. apt-get install {wl.package})" if wl.package else ""
    env = dict(os.environ)
    if wl.launcher == "openmpi":
        env = mpienv.mpi_env(env, "openmpi", mpienv.ours())
        if mpienv.openmpi_mpirun(env.get("PATH")) is None:
            out.append(
                f"Open MPI's mpirun ({', '.join(mpienv.OPENMPI_NAMES)}) is not on PATH: install "
                f"{mpienv.OPENMPI_PACKAGE} (e.g. apt-get install {mpienv.OPENMPI_PACKAGE})"
                + (f" or {wl.package}, which brings it" if wl.package else "")
            )
    elif wl.launcher == "mpi":
        try:
            launch.check(launcher or launch.default_launcher())
        except launch.LauncherError as error:
            out.append(str(error))
    try:
        words = shlex.split(wl.template)
    except ValueError:
        words = []
    program = words[0] if words else ""
    if not program or "{" in program:
        return out  # {python}, {mpiexec}: this environment's own
    if os.sep in program:
        folder = Path(wl.workdir or ".")
        found = (folder / program).expanduser()
        if not (found.is_file() and os.access(found, os.X_OK)):
            out.append(f"{program} is not an executable file in {folder}{install}")
    elif shutil.which(program, path=env.get("PATH") or os.defpath) is None:
        out.append(f"{program} is not installed (not on PATH){install}")
    return out
