"""Running one placed attempt (a WorkItem) for real and turning it into its result, the same way
on every device: the coordinator's own agent (services/agent/fleet.py, over NATS) and a remote
agent (hpc_ds1.fleet.Agent, over HTTP) both call `run_work_item`; the events that record a
result (`task_events`) and their deterministic envelope ids are defined here once too, so the
gateway and the local agent record a result the same way, and a result sent twice is one event.

A task is the user's job: one warm-up and TASK_REPEATS timed run(s) at the configuration
placement chose, under the device lock of the device's home (it waits for, and is waited on by,
the home's other runs: setup, tune, decide), capped at settings.max_run_s and killed when the
agent stops."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Engine, select

from ..db import tables
from ..events import Envelope, MeasurementRecorded, TaskFinished, TaskRunFailed, TaskStarted
from ..events import envelope as make_envelope
from ..events.base import Event
from ..log import get_logger
from ..machine.devicelock import device_lock
from ..runner import InvalidJob, RunResult, run, run_repeats, run_timeout, validate
from ..runner.estimate import RuntimeEstimate, check_cap
from ..space import Config, ConfigSpace
from .work import WorkItem

if TYPE_CHECKING:
    from .slurm import SlurmPartition

log = get_logger("fleet")

MAX_ERROR = 1900  # characters of an error sent (the gateway takes up to requests.MAX_NOTE)
TASK_REPEATS = 1  # timed runs of a task (after the runner's one warm-up)
ResultStatus = Literal["ok", "failed", "timed_out", "wrong_answer"]


class TaskResult(BaseModel):
    """What a device reports about one attempt: the body of
    POST /v1/agent/tasks/{task_id}/result (without the task id, which is in the path)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempt: int = Field(ge=1)
    status: ResultStatus
    config: dict[str, Any]
    runtime_s: float | None = Field(default=None, ge=0)
    spread: float | None = Field(default=None, ge=0)
    repeats: int | None = Field(default=None, ge=1)
    check_ok: bool | None = None
    check_error: float | None = None
    throughput: float | None = None
    throughput_unit: str | None = None
    error: str | None = None

    @property
    def ran(self) -> bool:
        """The job was launched (a measurement exists); False: refused before it started."""
        return self.repeats is not None or self.status == "ok"

    @property
    def succeeded(self) -> bool:
        """Ran to a correct end: the task is finished (else its attempt failed)."""
        return self.status == "ok" and self.check_ok is not False and self.runtime_s is not None

    def failure(self) -> str:
        """Why the attempt failed, in words, with the device's own message."""
        words = FAILURE_WORDS[self.status]
        return f"{words}: {self.error}" if self.error else words


FAILURE_WORDS: Final[dict[str, str]] = {
    "ok": "wrong answer (its check failed)",  # an ok run whose check failed
    "failed": "the run failed",
    "timed_out": "the run timed out",
    "wrong_answer": "wrong answer (its check failed)",
}


def refused(item: WorkItem, why: str) -> TaskResult:
    """A result for an attempt that could not start (bad configuration, too long, ...)."""
    return TaskResult(
        attempt=item.attempt, status="failed", config=dict(item.config), error=_short(why)
    )


def stopped(item: WorkItem, device_id: str) -> TaskResult:
    """The result of an attempt whose agent stopped while it ran (its processes were killed)."""
    return refused(
        item,
        f"the agent of {device_id} stopped during the run (its processes were killed)",
    )


def _short(text: str) -> str:
    """An error as a coordinator takes it (at most MAX_ERROR characters: the end is kept, where
    a traceback names the cause)."""
    return text if len(text) <= MAX_ERROR else "…" + text[-(MAX_ERROR - 1) :]


def _finite(value: float | None) -> float | None:
    """NaN and infinities are not numbers a coordinator accepts: reported as unknown."""
    return value if value is None or math.isfinite(value) else None


def from_run(item: WorkItem, result: RunResult) -> TaskResult:
    error: str | None = None
    if result.status.value == "wrong_answer":
        error = "wrong answer: " + (result.check_detail or f"check error {result.check_error}")
    elif result.status.value == "timed_out":
        error = result.error or "timed out"
    elif result.status.value == "failed":
        error = result.error or "the run failed"
    status: ResultStatus = result.status.value  # type: ignore[assignment]
    runtime = _finite(result.runtime_s)
    if status == "ok" and runtime is None:
        status, error = "failed", "the run reported no runtime"
    return TaskResult(
        attempt=item.attempt,
        status=status,
        config=result.config.model_dump(),
        runtime_s=runtime,
        spread=_finite(result.spread),
        repeats=max(1, result.repeats),
        check_ok=result.check_ok,
        check_error=_finite(result.check_error),
        throughput=_finite(result.throughput),
        throughput_unit=result.throughput_unit or None,
        error=None if error is None else _short(error),
    )


def run_work_item(
    item: WorkItem,
    *,
    home: Path,
    max_run_s: float,
    cancel: threading.Event | None = None,
    slurm: SlurmPartition | None = None,
) -> TaskResult:
    """Run `item` for real on this machine (blocking) and return its result. A job the runner
    refuses, or one whose expected time is past `max_run_s`, is a failed result without a run.
    Raises devicelock.Cancelled when `cancel` is set before the run ends (the agent stops).
    With `slurm`, the run goes to a node of that partition instead (fleet/slurm.py)."""
    try:
        config = Config.model_validate(item.config)
    except ValidationError as error:
        return refused(item, f"invalid configuration {item.config}: {error.errors()[0]['msg']}")
    if slurm is not None:
        return run_on_slurm(item, config, slurm, max_run_s=max_run_s, cancel=cancel)
    try:
        # The tuned space, widened as for a user's own job: placement sends the device's best
        # measured configuration, which its setup measured within this space.
        space = ConfigSpace.for_device(workload=item.workload).runnable()
        validate(item.workload, item.size, config, space)
        # a workload file's own `repeats` and `timeout` (issue 44), the timeout never past the cap
        repeats = run_repeats(item.workload, None, TASK_REPEATS)
        timeout_s = run_timeout(item.workload, None, cap=max_run_s, default=max_run_s)
        if item.expected_s is not None:
            expected = RuntimeEstimate(item.expected_s, repeats + 1, "expected by placement")
            check_cap(expected, max_run_s, item.workload, item.size)
    except (InvalidJob, ValueError, LookupError) as error:
        return refused(item, f"the runner refused it: {error}")
    with device_lock(home, cancel=cancel):
        result = run(
            item.workload,
            item.size,
            config,
            repeats=repeats,
            space=space,
            timeout_s=timeout_s,
            cancel=cancel,
        )
    log.info(
        "task_run",
        task_id=item.task_id,
        attempt=item.attempt,
        workload=item.workload,
        size=item.size,
        config=config.label(),
        status=result.status.value,
        runtime_s=result.runtime_s,
    )
    return from_run(item, result)


def run_on_slurm(
    item: WorkItem,
    config: Config,
    slurm: SlurmPartition,
    *,
    max_run_s: float,
    cancel: threading.Event | None = None,
) -> TaskResult:
    """`item` through `sbatch` on a node of `slurm`'s partition; the node validates it against
    its own space (this login node's is not the device's)."""
    from .slurm import SlurmError

    try:
        if item.expected_s is not None:
            expected = RuntimeEstimate(item.expected_s, TASK_REPEATS + 1, "expected by placement")
            check_cap(expected, max_run_s, item.workload, item.size)
        outcome = slurm.run(
            item.task_id,
            item.attempt,
            item.workload,
            item.size,
            config,
            repeats=TASK_REPEATS,
            max_run_s=max_run_s,
            cancel=cancel,
        )
    except (InvalidJob, ValueError) as error:
        return refused(item, f"the runner refused it: {error}")
    except SlurmError as error:
        return refused(item, f"Slurm partition {slurm.partition}: {error}")
    log.info(
        "task_run",
        task_id=item.task_id,
        attempt=item.attempt,
        workload=item.workload,
        size=item.size,
        config=config.label(),
        partition=slurm.partition,
        slurm_job_id=outcome.job_id,
        status=outcome.result.status.value if outcome.result else "failed",
        runtime_s=outcome.result.runtime_s if outcome.result else None,
    )
    if outcome.result is None:
        return refused(item, outcome.error or f"Slurm job {outcome.job_id} gave no result")
    return from_run(item, outcome.result)


# --- recording a result -------------------------------------------------------------------


def measurement_id_for(task_id: str, attempt: int) -> str:
    """The id of the measurement an attempt records: the same however often it is reported."""
    return f"task-{task_id}-{attempt}"


def started_id(task_id: str, attempt: int) -> str:
    return f"started-{task_id}-{attempt}"


def finished_id(task_id: str, attempt: int) -> str:
    return f"finished-{task_id}-{attempt}"


def runfailed_id(task_id: str, attempt: int) -> str:
    return f"runfailed-{task_id}-{attempt}"


def measured_id(task_id: str, attempt: int) -> str:
    """The envelope id of an attempt's measurement (as the gateway gives every uploaded
    measurement: `measurement-<measurement_id>`)."""
    return f"measurement-{measurement_id_for(task_id, attempt)}"


def fixed_envelope(
    event: Event, event_id: str, *, actor: str, source: str, prefix: str, task_id: str
) -> Envelope:
    """An envelope with a deterministic id (the stream stores a re-send once), correlated by
    the task id."""
    env = make_envelope(event, actor=actor, source=source, prefix=prefix, correlation_id=task_id)
    return env.model_copy(update={"id": event_id})


def started_envelope(
    task_id: str, attempt: int, device_id: str, *, actor: str, source: str, prefix: str
) -> Envelope:
    event = TaskStarted(task_id=task_id, attempt=attempt, device_id=device_id)
    return fixed_envelope(
        event,
        started_id(task_id, attempt),
        actor=actor,
        source=source,
        prefix=prefix,
        task_id=task_id,
    )


def task_events(
    task_id: str,
    device_id: str,
    result: TaskResult,
    *,
    workload: str,
    size: int,
    expected_s: float | None,
    actor: str,
    source: str,
    prefix: str,
) -> list[Envelope]:
    """The events that record `result` of attempt `result.attempt` on `device_id`: the run's
    measurement (purpose "task"; only when it ran), then task.finished (status ok) or
    task.run_failed, each with its deterministic envelope id."""
    attempt = result.attempt
    out: list[Envelope] = []
    mid: str | None = None
    if result.ran:
        mid = measurement_id_for(task_id, attempt)
        measured = MeasurementRecorded(
            measurement_id=mid,
            device_id=device_id,
            workload=workload,
            size=size,
            config=result.config,
            status=result.status,
            runtime_s=result.runtime_s,
            throughput=result.throughput,
            throughput_unit=result.throughput_unit,
            repeats=result.repeats or 1,
            spread=result.spread,
            check_ok=result.check_ok,
            check_error=result.check_error,
            purpose="task",
        )
        out.append(
            fixed_envelope(
                measured,
                measured_id(task_id, attempt),
                actor=actor,
                source=source,
                prefix=prefix,
                task_id=task_id,
            )
        )
    final: Event
    if result.succeeded:
        assert result.runtime_s is not None
        final = TaskFinished(
            task_id=task_id,
            attempt=attempt,
            device_id=device_id,
            config=result.config,
            runtime_s=result.runtime_s,
            expected_s=expected_s,
            measurement_id=mid,
            check_ok=result.check_ok,
        )
        final_id = finished_id(task_id, attempt)
    else:
        final = TaskRunFailed(
            task_id=task_id, attempt=attempt, device_id=device_id, error=result.failure()
        )
        final_id = runfailed_id(task_id, attempt)
    out.append(
        fixed_envelope(final, final_id, actor=actor, source=source, prefix=prefix, task_id=task_id)
    )
    return out


def attempt_state(engine: Engine, item: WorkItem) -> Literal["current", "stale", "unknown"]:
    """Whether `item` is still its task's current attempt on its device, from the projected
    tasks table (blocking): "current" (placed or running at this attempt on this device),
    "stale" (requeued since, finished, failed, or placed elsewhere), or "unknown" (the
    placement is not projected yet: the row is missing or at an earlier attempt)."""
    t = tables.tasks
    with engine.connect() as conn:
        row = conn.execute(
            select(t.c.status, t.c.attempt, t.c.device_id).where(t.c.task_id == item.task_id)
        ).first()
    if row is None or int(row.attempt or 0) < item.attempt:
        return "unknown"
    if (
        int(row.attempt) == item.attempt
        and row.device_id == item.device_id
        and row.status in ("placed", "running")
    ):
        return "current"
    return "stale"


def describe(result: TaskResult) -> str:
    """One line for a log or a reply: 'ok in 4.31 s' or 'failed: why'."""
    if result.status == "ok" and result.runtime_s is not None:
        return f"ok in {result.runtime_s:.3g} s"
    return f"{result.status}: {result.error or '-'}"
