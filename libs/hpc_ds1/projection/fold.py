"""What each event does to the read models, as pure functions from events to row writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import Table

from hpc_ds1.db import tables
from hpc_ds1.eventlog.audit import audit_record, parse_exact
from hpc_ds1.events import (
    ApprovalDecided,
    ApprovalRequested,
    ApprovalWithdrawn,
    DecisionMade,
    DeviceDraining,
    DeviceLeft,
    DeviceRegistered,
    DeviceStatusChanged,
    Envelope,
    EvaluationPublished,
    Event,
    MalformedEvent,
    MeasurementRecorded,
    ModelPublished,
    SessionFinished,
    SessionMoveResolved,
    SessionPaused,
    SessionResumed,
    SessionStarted,
    SessionStepRun,
    TaskFailed,
    TaskFinished,
    TaskPlaced,
    TaskRequeued,
    TaskRunFailed,
    TaskStarted,
    TaskSubmitted,
    TaskWaiting,
    TokenCreated,
    TokenRevoked,
    TokenUsed,
    decode,
    typed,
)
from hpc_ds1.events.codec import envelope_of
from hpc_ds1.fleet.plausible import off_estimate
from hpc_ds1.fleet.tasks import TaskState, failure_reason, takes

Row = dict[str, Any]
# (the row as it is, the rows named in `Write.reads` as they are: None where absent) -> the
# values to set, or None to leave the row as it is.
Change = Callable[[Row, tuple[Row | None, ...]], Row | None]


@dataclass(frozen=True)
class Write:
    """One row change: insert (nothing if present), upsert, or update by key (nothing if
    absent). An update with `change` is conditional: its values are what `change` makes of the
    row as it is then (and of the rows of other tables named in `reads`, by table and key), and
    None changes nothing (a stale or repeated event). Its `row` then holds only the key. The
    store applies a batch's writes in their order, so a change sees every write before it."""

    table: Table
    kind: Literal["insert", "upsert", "update"]
    row: Row
    keep_on_update: tuple[str, ...] = field(default=())
    change: Change | None = None
    reads: tuple[tuple[Table, Any], ...] = field(default=())


@dataclass(frozen=True)
class Folded:
    """One stored message turned into its raw row, its typed writes and its audit record."""

    seq: int
    raw_row: dict[str, Any]
    writes: list[Write]
    audit: dict[str, Any]
    problem: str | None = None
    data: bytes = b""  # the stored message, kept whole if Postgres refuses its rows


def _fields(e: Event) -> dict[str, Any]:
    """An event's fields by name. Not `dict(e)`: dict() first asks the model for `keys`, and
    pydantic's failing attribute lookup made that ~25 times slower (a tenth of the fold)."""
    return dict(e.__dict__)


def _device_registered(seq: int, env: Envelope, e: DeviceRegistered) -> list[Write]:
    row = {
        "device_id": e.device_id,
        "hostname": e.hostname,
        "fingerprint": e.fingerprint,
        "local": e.local,
        "status": "online",
        "registered_at": env.time,
        "updated_at": env.time,
        "seq": seq,
    }
    return [Write(tables.devices, "upsert", row, keep_on_update=("registered_at",))]


def _device_left(seq: int, env: Envelope, e: DeviceLeft) -> list[Write]:
    row = {"device_id": e.device_id, "status": "left", "updated_at": env.time, "seq": seq}
    return [Write(tables.devices, "update", row)]


def _device_draining(seq: int, env: Envelope, e: DeviceDraining) -> list[Write]:
    row = {"device_id": e.device_id, "draining": e.draining, "updated_at": env.time, "seq": seq}
    return [Write(tables.devices, "update", row)]


def _device_status(seq: int, env: Envelope, e: DeviceStatusChanged) -> list[Write]:
    row = {
        "device_id": e.device_id,
        "liveness": e.status,
        "liveness_reason": storable(e.reason, 1000) or None,
        "updated_at": env.time,
        "seq": seq,
    }
    return [Write(tables.devices, "update", row)]


# The task lifecycle. Each event carries the attempt it is about; a change applies only while
# that attempt is the task's current one and the task is where the event can come from, so a
# repeated, late or stale event (a result of an attempt already requeued) changes nothing.
# `failures` holds one entry per abandoned attempt: attempt N's entry is its N-th at most.
# The guards are those of the pure fold hpc_ds1.fleet.tasks.evolve (the coordinator's view),
# applied to the row as it is when the event's turn comes (`Write.change`).
_t = tables.tasks


def _task_state(row: Row) -> TaskState:
    return TaskState(
        task_id=row["task_id"],
        status=row["status"],
        attempt=row["attempt"],
        device_id=row["device_id"],
        failures=tuple(row["failures"]),
    )


def _task_change(
    seq: int, env: Envelope, event: Event, task_id: str, values: Callable[[Row], Row]
) -> Write:
    def change(row: Row, _: tuple[Row | None, ...]) -> Row | None:
        if not takes(_task_state(row), event):
            return None
        return {**values(row), "updated_at": env.time, "seq": seq}

    return Write(_t, "update", {"task_id": task_id}, change=change)


def _failure_added(row: Row, text: str) -> list[Any]:
    return [*row["failures"], storable(text, 2000)]


def _task_submitted(seq: int, env: Envelope, e: TaskSubmitted) -> list[Write]:
    row = {
        "task_id": e.task_id,
        "workload": e.workload,
        "size": e.size,
        "submitted_by": e.submitted_by,
        "status": "submitted",
        "attempt": 0,
        "failures": [],
        "submitted_at": env.time,
        "updated_at": env.time,
        "seq": seq,
    }
    return [Write(_t, "insert", row)]


def _task_placed(seq: int, env: Envelope, e: TaskPlaced) -> list[Write]:
    values = {
        "status": "placed",
        "attempt": e.attempt,
        "device_id": e.device_id,
        "config": e.config,
        "expected_s": e.expected_s,
        "queue_s": e.queue_s,
        "basis": e.basis,
        "reason": e.reason,
        "runner_up": e.runner_up,
        "placement": env.data,
        "placed_at": env.time,
        "started_at": None,
    }
    return [_task_change(seq, env, e, e.task_id, lambda _: values)]


def _task_waiting(seq: int, env: Envelope, e: TaskWaiting) -> list[Write]:
    values = {"status": "waiting", "reason": e.reason}
    return [_task_change(seq, env, e, e.task_id, lambda _: values)]


def _task_started(seq: int, env: Envelope, e: TaskStarted) -> list[Write]:
    values = {"status": "running", "started_at": env.time}
    return [_task_change(seq, env, e, e.task_id, lambda _: values)]


def _task_finished(seq: int, env: Envelope, e: TaskFinished) -> list[Write]:
    off = off_estimate(e.runtime_s, e.expected_s)
    writes: list[Write] = []
    if off is not None:
        # Counted on the device while the task's row still takes this result (once: the task
        # update that follows makes it finished).
        text = storable(f"task {e.task_id}: {off}", 1000)

        def counted(row: Row, task: tuple[Row | None, ...]) -> Row | None:
            if task[0] is None or not takes(_task_state(task[0]), e):
                return None
            return {"off_estimates": row["off_estimates"] + 1, "off_estimate": text}

        device = {"device_id": e.device_id}
        writes.append(
            Write(tables.devices, "update", device, change=counted, reads=((_t, e.task_id),))
        )
    values = {
        "status": "finished",
        "config": e.config,
        "runtime_s": e.runtime_s,
        "measurement_id": e.measurement_id,
        "finished_at": env.time,
        "off_estimate": off,
    }
    writes.append(_task_change(seq, env, e, e.task_id, lambda _: values))
    return writes


def _task_run_failed(seq: int, env: Envelope, e: TaskRunFailed) -> list[Write]:
    reason = failure_reason(e.device_id, e.error)
    return [
        _task_change(seq, env, e, e.task_id, lambda row: {"failures": _failure_added(row, reason)})
    ]


def _task_requeued(seq: int, env: Envelope, e: TaskRequeued) -> list[Write]:
    def values(row: Row) -> Row:
        # The attempt's failure, unless its run failure already wrote it; then the status.
        if _task_state(row).current_failed:
            return {"status": "submitted"}
        return {"status": "submitted", "failures": _failure_added(row, e.reason)}

    return [_task_change(seq, env, e, e.task_id, values)]


def _task_failed(seq: int, env: Envelope, e: TaskFailed) -> list[Write]:
    values: Row = {"status": "failed"}
    if e.reasons:  # the full list: every abandoned attempt's reason
        values["failures"] = [storable(r, 2000) for r in e.reasons]
    return [_task_change(seq, env, e, e.task_id, lambda _: values)]


def _measurement(seq: int, env: Envelope, e: MeasurementRecorded) -> list[Write]:
    return [Write(tables.measurements, "insert", {**_fields(e), "time": env.time, "seq": seq})]


def _model(seq: int, env: Envelope, e: ModelPublished) -> list[Write]:
    return [Write(tables.models, "insert", {**_fields(e), "published_at": env.time, "seq": seq})]


def _evaluation(seq: int, env: Envelope, e: EvaluationPublished) -> list[Write]:
    row = {**_fields(e), "published_at": env.time, "seq": seq}
    return [Write(tables.evaluations, "insert", row)]


def _decision(seq: int, env: Envelope, e: DecisionMade) -> list[Write]:
    auto = e.mode == "auto"
    row = {
        **_fields(e),
        "actor": env.actor,
        "approved_by": "auto" if auto else None,
        "approval": "auto" if auto else None,
        "time": env.time,
        "seq": seq,
    }
    return [Write(tables.decisions, "insert", row)]


def _session_update(seq: int, env: Envelope, session_id: str, **values: Any) -> Write:
    row = {"session_id": session_id, **values, "updated_at": env.time, "seq": seq}
    return Write(tables.sessions, "update", row)


def _session_started(seq: int, env: Envelope, e: SessionStarted) -> list[Write]:
    row = {
        "session_id": e.session_id,
        "device_id": e.device_id,
        "workload": e.workload,
        "size": e.size,
        "start": e.start,
        "owner": env.actor,
        "status": "running",
        "best_config": None,
        "best_runtime_s": None,
        "start_runtime_s": None,
        "speedup": None,
        "real_runs": 0,
        "finish_reason": None,
        "detail": None,
        "started_at": env.time,
        "updated_at": env.time,
        "seq": seq,
    }
    return [Write(tables.sessions, "insert", row)]


def _step_run(seq: int, env: Envelope, e: SessionStepRun) -> list[Write]:
    if e.step == 0:
        ok = e.status == "ok"
        return [
            _session_update(
                seq,
                env,
                e.session_id,
                real_runs=1,
                start_runtime_s=e.runtime_s,
                best_runtime_s=e.runtime_s if ok else None,
                best_config=e.config if ok else None,
            )
        ]
    return [_session_update(seq, env, e.session_id, real_runs=e.step + 1)]


def _move_resolved(seq: int, env: Envelope, e: SessionMoveResolved) -> list[Write]:
    if not e.kept:
        return []
    return [
        _session_update(seq, env, e.session_id, best_config=e.config, best_runtime_s=e.runtime_s)
    ]


def _paused(seq: int, env: Envelope, e: SessionPaused) -> list[Write]:
    return [_session_update(seq, env, e.session_id, status="paused")]


def _resumed(seq: int, env: Envelope, e: SessionResumed) -> list[Write]:
    return [_session_update(seq, env, e.session_id, status="running")]


def _finished(seq: int, env: Envelope, e: SessionFinished) -> list[Write]:
    return [
        _session_update(
            seq,
            env,
            e.session_id,
            status="finished",
            finish_reason=e.reason,
            detail=e.detail,
            best_config=e.best_config,
            best_runtime_s=e.best_runtime_s,
            start_runtime_s=e.start_runtime_s,
            speedup=e.speedup,
            real_runs=e.real_runs,
        )
    ]


def _approval_requested(seq: int, env: Envelope, e: ApprovalRequested) -> list[Write]:
    row = {
        **_fields(e),
        "status": "waiting",
        "requested_at": env.time,
        "decided_by": None,
        "decided_role": None,
        "decided_at": None,
        "note": None,
        "seq": seq,
    }
    decision = {"decision_id": e.decision_id, "approval": "waiting"}
    return [Write(tables.approvals, "insert", row), Write(tables.decisions, "update", decision)]


def _approval_decided(seq: int, env: Envelope, e: ApprovalDecided) -> list[Write]:
    status = "approved" if e.approved else "rejected"
    row = {
        "approval_id": e.approval_id,
        "status": status,
        "decided_by": e.by,
        "decided_role": e.role,
        "decided_at": env.time,
        "note": e.note,
        "seq": seq,
    }
    decision = {
        "decision_id": e.decision_id,
        "approval": status,
        "approved_by": e.by if e.approved else None,
    }
    return [Write(tables.approvals, "update", row), Write(tables.decisions, "update", decision)]


def _approval_withdrawn(seq: int, env: Envelope, e: ApprovalWithdrawn) -> list[Write]:
    row = {
        "approval_id": e.approval_id,
        "status": "withdrawn",
        "decided_at": env.time,
        "note": e.reason,
        "seq": seq,
    }
    decision = {"decision_id": e.decision_id, "approval": "withdrawn"}
    return [Write(tables.approvals, "update", row), Write(tables.decisions, "update", decision)]


def _token_created(seq: int, env: Envelope, e: TokenCreated) -> list[Write]:
    row = {
        **_fields(e),
        "created_by": env.actor,
        "created_at": env.time,
        "revoked": False,
        "uses": 0,
        "seq": seq,
    }
    return [Write(tables.tokens, "insert", row)]


def _token_revoked(seq: int, env: Envelope, e: TokenRevoked) -> list[Write]:
    return [Write(tables.tokens, "update", {"token_id": e.token_id, "revoked": True, "seq": seq})]


def _token_used(seq: int, env: Envelope, e: TokenUsed) -> list[Write]:
    # Counted once: the row's seq moves past this event's with the count.
    def counted(row: Row, _: tuple[Row | None, ...]) -> Row | None:
        return {"uses": row["uses"] + 1, "seq": seq} if row["seq"] < seq else None

    return [Write(tables.tokens, "update", {"token_id": e.token_id}, change=counted)]


PROJECTIONS: dict[type[Event], Callable[[int, Envelope, Any], list[Write]]] = {
    DeviceRegistered: _device_registered,
    DeviceLeft: _device_left,
    DeviceDraining: _device_draining,
    DeviceStatusChanged: _device_status,
    MeasurementRecorded: _measurement,
    ModelPublished: _model,
    EvaluationPublished: _evaluation,
    DecisionMade: _decision,
    SessionStarted: _session_started,
    SessionStepRun: _step_run,
    SessionMoveResolved: _move_resolved,
    SessionPaused: _paused,
    SessionResumed: _resumed,
    SessionFinished: _finished,
    ApprovalRequested: _approval_requested,
    ApprovalDecided: _approval_decided,
    ApprovalWithdrawn: _approval_withdrawn,
    TokenCreated: _token_created,
    TokenRevoked: _token_revoked,
    TokenUsed: _token_used,
    TaskSubmitted: _task_submitted,
    TaskPlaced: _task_placed,
    TaskWaiting: _task_waiting,
    TaskStarted: _task_started,
    TaskFinished: _task_finished,
    TaskRunFailed: _task_run_failed,
    TaskRequeued: _task_requeued,
    TaskFailed: _task_failed,
}


def fold(seq: int, subject: str, data: bytes) -> Folded:
    """Never raises: a malformed or unknown event still yields its raw row and audit record.
    Whether Postgres takes the rows is seen only when they are written (store.apply)."""
    # Parsed once: the audit record and (for an envelope of the usual shape) the envelope
    # come from the same orjson parse, and pydantic validates only the event's own data.
    parsed = parse_exact(data)
    audit = audit_record(seq, subject, data, parsed)
    try:
        env = envelope_of(parsed, subject) or decode(data, subject)
    except MalformedEvent as error:
        text = data.decode("utf-8", errors="replace")
        raw = {
            "seq": seq,
            "type": "malformed",
            "subject": subject,
            "valid": False,
            "error": str(error),
            "raw": text,
        }
        return Folded(seq, raw, [], audit, str(error), data)
    raw = {
        "seq": seq,
        "event_id": env.id,
        "type": env.type,
        "version": env.version,
        "subject": env.subject,
        "time": env.time,
        "actor": env.actor,
        "source": env.source,
        "correlation_id": env.correlation_id,
        "causation_id": env.causation_id,
        "data": env.data,
        "valid": True,
    }
    try:
        event = typed(env)
    except MalformedEvent as error:
        problem = str(error)
        return Folded(seq, {**raw, "valid": False, "error": problem}, [], audit, problem, data)
    if event is None:
        problem = f"unknown event type {env.type!r}"
        return Folded(seq, {**raw, "error": problem}, [], audit, problem, data)
    project = PROJECTIONS.get(type(event))
    try:
        writes = project(seq, env, event) if project else []
    except Exception as error:  # a fold bug sets this event aside, never the ones after it
        problem = f"cannot fold {env.type}: {type(error).__name__}: {error}"
        return Folded(seq, {**raw, "valid": False, "error": problem}, [], audit, problem, data)
    return Folded(seq, raw, writes, audit, None, data)


def storable(text: str, limit: int | None = None) -> str:
    """Text Postgres takes: NUL escaped, lone surrogates replaced, optionally cut to `limit`."""
    text = text.replace("\x00", "\\u0000")
    text = text.encode("utf-8", errors="backslashreplace").decode("utf-8")
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class SetAside:
    """An event Postgres refused: kept with why, its raw row reduced to what always fits."""

    seq: int
    row: dict[str, Any]
    raw_row: dict[str, Any]


def set_aside(item: Folded, reason: str) -> SetAside:
    raw = item.raw_row
    event_id = raw.get("event_id")
    kind = raw.get("type")
    subject = storable(str(raw.get("subject", "")))
    why = storable(reason, 1000)
    row = {
        "seq": item.seq,
        "subject": subject,
        "event_id": storable(event_id) if isinstance(event_id, str) else None,
        "type": storable(kind) if isinstance(kind, str) else None,
        "reason": why,
        "raw": item.data,
    }
    kept = {  # indexed columns stay well under the 2,704 bytes a btree entry may hold
        "seq": item.seq,
        "type": storable(kind, 200) if isinstance(kind, str) else "malformed",
        "subject": storable(subject, 500),
        "valid": False,
        "error": f"set aside: {why}",
        "raw": storable(item.data.decode("utf-8", errors="replace")),
    }
    return SetAside(item.seq, row, kept)


def find_gaps(checkpoint: int, seqs: list[int]) -> list[tuple[int, int]]:
    """Missing stream sequences between the checkpoint and each next delivered sequence."""
    missing = []
    previous = checkpoint
    for seq in seqs:
        if seq > previous + 1:
            missing.append((previous + 1, seq - 1))
        previous = max(previous, seq)
    return missing
