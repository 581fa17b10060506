"""A device that is a Slurm partition: its agent runs on a login node and sends each attempt
through `sbatch` to one of the partition's nodes, then waits for the job's end. On the node,
`hpc_ds1.fleet.slurm_job` runs it with the ranks started by `srun` (a job step of that job's
allocation). The device's fingerprint is a partition node's, taken there by `srun` too.

The attempt's folder (under the agent's home, `slurm/`) must be visible from the nodes, as a
cluster's home file system is: the job writes its result there. A cancelled attempt (the agent
stops) or one past its time is `scancel`led; an agent killed outright leaves its job to Slurm's
own time limit (`--time`: the run's cap plus start-up)."""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..log import get_logger
from ..machine.devicelock import Cancelled
from ..machine.hardware import Fingerprint
from ..runner import RunResult
from ..runner.jobenv import job_env
from ..space import Config

log = get_logger("fleet-slurm")

JOB_PREFIX = "hpc-ds1-"
FINGERPRINT_TIMEOUT_S = 600.0  # an exclusive node may take a while to come free
QUEUE_S = 24 * 3600.0  # how long an attempt may wait in the partition's queue
STARTUP_S = 120.0  # the job's own start (imports, the rank launch) beyond the run's cap
SCANCEL_TIMEOUT_S = 30.0
SUBMIT_TIMEOUT_S = 60.0
POLL_S = 1.0
MAX_POLL_FAILURES = 60
# States in which a job has not ended yet (squeue's "active" ones).
PENDING_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
     "SIGNALING", "STAGE_OUT", "STOPPED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
)  # fmt: skip


class SlurmError(RuntimeError):
    """Slurm refused or failed something (its own message included)."""


@dataclass(frozen=True)
class Outcome:
    """An attempt sent through Slurm: its job id and the run's result, or why there is none."""

    job_id: str | None
    result: RunResult | None
    error: str | None = None


def _need(binary: str) -> str:
    found = shutil.which(binary)
    if found is None:
        raise SlurmError(f"{binary} is not on PATH: a Slurm-partition agent runs on a login node")
    return found


def job_name(task_id: str) -> str:
    return f"{JOB_PREFIX}{task_id}"


class SlurmPartition:
    """Runs attempts on the nodes of `partition` (see the module docstring)."""

    def __init__(self, partition: str, workdir: Path) -> None:
        if not partition or any(c.isspace() or c in ",;" for c in partition):
            raise ValueError(f"partition {partition!r} is not a Slurm partition name")
        self.partition = partition
        self.workdir = Path(workdir)
        self.node_cpus: int | None = None  # from the fingerprint

    def __repr__(self) -> str:
        return f"SlurmPartition({self.partition!r})"

    # --- the fingerprint -----------------------------------------------------------------
    def fingerprint(self, timeout_s: float = FINGERPRINT_TIMEOUT_S) -> Fingerprint:
        """A node of the partition, measured there (`srun -N1 --exclusive`: the whole node)."""
        code = (
            "from hpc_ds1.machine.hardware import fingerprint; "
            "print('@@FP ' + fingerprint().model_dump_json())"
        )
        argv = [_need("srun"), "-p", self.partition, "-N", "1", "-n", "1", "--exclusive"]
        argv += ["-J", f"{JOB_PREFIX}fingerprint", sys.executable, "-c", code]
        try:
            done = subprocess.run(
                argv, env=job_env(1), capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            raise SlurmError(
                f"no node of partition {self.partition} ran the fingerprint within {timeout_s:g} s"
            ) from None
        line = next((x for x in done.stdout.splitlines() if x.startswith("@@FP ")), None)
        if done.returncode != 0 or line is None:
            raise SlurmError(
                f"the fingerprint on partition {self.partition} failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-1000:]}"
            )
        found = Fingerprint.model_validate_json(line[len("@@FP ") :])
        # The node's CPUs, not the one-task step's: attempts get allocations of their own.
        fp = found.model_copy(update={"usable_cpus": None})
        self.node_cpus = fp.logical_cpus
        return fp

    # --- an attempt --------------------------------------------------------------------------
    def run(
        self,
        task_id: str,
        attempt: int,
        workload: str,
        size: int,
        config: Config,
        *,
        repeats: int,
        max_run_s: float,
        cancel: threading.Event | None = None,
    ) -> Outcome:
        """`sbatch` one attempt, wait for its end and read its result (blocking). Raises
        Cancelled when `cancel` is set before it ends (the job is cancelled in Slurm too)."""
        folder = self.workdir / f"{task_id}-{attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        result_path = folder / "result.json"
        result_path.unlink(missing_ok=True)
        inner = [sys.executable, "-m", "hpc_ds1.fleet.slurm_job", "--workload", workload]
        inner += ["--size", str(size), "--config", config.model_dump_json()]
        inner += ["--repeats", str(repeats), "--timeout-s", repr(max_run_s)]
        inner += ["--result", str(result_path)]
        threads = max(config.threads, 1)
        minutes = math.ceil((max_run_s * (repeats + 1) + STARTUP_S) / 60)
        argv = [_need("sbatch"), "--parsable", "-p", self.partition, "-N", "1"]
        argv += ["-n", str(config.ranks), "-c", str(threads), f"--time={minutes}"]
        argv += ["-J", job_name(task_id), "-o", str(folder / "slurm-%j.out")]
        argv += ["-D", str(folder), "--export=ALL"]
        if self.node_cpus is not None and config.ranks * threads > self.node_cpus:
            argv.append("--overcommit")  # an oversubscribed configuration, as the runner allows
        argv += ["--wrap", shlex.join(inner)]
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled before the Slurm job was submitted")
        submitted = subprocess.run(
            argv, env=job_env(threads), capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S
        )
        if submitted.returncode != 0 or not submitted.stdout.strip():
            raise SlurmError(f"sbatch refused it: {submitted.stderr.strip()[-1000:]}")
        job_id = submitted.stdout.strip().splitlines()[0].split(";")[0]
        log.info("slurm_job_submitted", task_id=task_id, job_id=job_id, partition=self.partition)
        deadline = time.monotonic() + QUEUE_S + minutes * 60
        ended = False
        try:
            state = self.wait(job_id, deadline, cancel)
            ended = True
        except TimeoutError as error:
            return Outcome(job_id, None, f"{error}; it was cancelled")
        finally:
            if not ended:  # cancelled, timed out, or this thread failed: the job goes too
                self.cancel(job_id)
        return self._read(job_id, state, result_path, folder)

    def state(self, job_id: str) -> str | None:
        """The job's state (PENDING, RUNNING, COMPLETED, ...), or None once Slurm has
        forgotten it (MinJobAge after its end)."""
        done = subprocess.run(
            [_need("scontrol"), "show", "job", "-o", job_id],
            env=job_env(1),
            capture_output=True,
            text=True,
            timeout=SUBMIT_TIMEOUT_S,
        )
        for field in done.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        if "Invalid job id" in done.stderr:
            return None
        raise SlurmError(f"scontrol show job {job_id} failed: {done.stderr.strip()[-500:]}")

    def wait(self, job_id: str, deadline: float, cancel: threading.Event | None) -> str:
        """Poll the job until it ends; its last state. (Not `sbatch --wait`: its polling
        backs off to tens of seconds, which doubled a short attempt's time here.)"""
        failures = 0
        while True:
            try:
                state = self.state(job_id)
                failures = 0
            except (SlurmError, subprocess.TimeoutExpired) as error:
                # The controller may be busy or restarting: Slurm keeps the job meanwhile.
                failures += 1
                if failures >= MAX_POLL_FAILURES:
                    raise SlurmError(f"lost track of Slurm job {job_id}: {error}") from None
                log.warning("slurm_poll_failed", job_id=job_id, error=str(error))
                state = "UNKNOWN"
            if state is None or state not in PENDING_STATES | {"UNKNOWN"}:
                return state or "ENDED"
            if cancel is not None and cancel.wait(POLL_S):
                raise Cancelled(f"cancelled while Slurm job {job_id} was {state.lower()}")
            if cancel is None:
                time.sleep(POLL_S)
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm job {job_id} did not end in time")

    def _read(self, job_id: str, state: str, result_path: Path, folder: Path) -> Outcome:
        try:
            raw = json.loads(result_path.read_text())
        except (FileNotFoundError, ValueError):
            tail = ""
            with contextlib.suppress(OSError):
                tail = (folder / f"slurm-{job_id}.out").read_text(errors="replace")[-1500:]
            return Outcome(
                job_id, None, f"Slurm job {job_id} ended {state} without a result: {tail.strip()}"
            )
        if "refused" in raw:
            return Outcome(job_id, None, f"the node refused it: {raw['refused']}")
        return Outcome(job_id, RunResult.model_validate(raw["result"]))

    def cancel(self, job_id: str) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [_need("scancel"), job_id],
                env=job_env(1),
                capture_output=True,
                timeout=SCANCEL_TIMEOUT_S,
            )
        log.info("slurm_job_cancelled", job_id=job_id)
