"""Sessions and approvals over HTTP: reads from the projection, commands over NATS.

Ids in paths are checked against SAFE_ID before anything uses them (they become NATS subject
tokens: '*', '>', '.' and whitespace never reach a subject); the coordinator's refusals keep
their own 4xx status.

POST /v1/sessions with `Idempotency-Key`: the key (scoped by the caller's token) names the
session (its id, UUIDv5); the coordinator appends a session's start only once (409 after), and a
retry of the same job by the same caller is answered with the session started first.

POST /v1/sessions/{session_id}/cancel (engineer) records who cancels a session (cancel.requested,
security.cancels); the coordinator driving it has the agent kill its run in flight, the whole
process group, and finishes it `interrupted`. GET /v1/sessions/{session_id} says what runs now
(`running`: its step's last run.heartbeat) and who cancelled it (`cancel`)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Response
from nats.errors import NoRespondersError
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.idempotency import HEADER, KeyReused
from hpc_ds1.eventlog.subjects import start_session_subject
from hpc_ds1.requests import SAFE_ID_PATTERN, ApprovalVerdict, CancelSession, StartSessionRequest
from hpc_ds1.security.approvals import ApprovalError, decide_approval
from hpc_ds1.security.cancels import CancelError, cancel_session, cancel_subject
from hpc_ds1.security.tokens import Principal

from ..deps import BusDep, EngineDep, SettingsDep
from ..edge.auth import require
from ..schemas import (
    E404,
    E409,
    E503,
    READ_ERRORS,
    WRITE_ERRORS,
    Approvals,
    Sessions,
    SessionStartedOut,
)
from .decide import IDEMPOTENCY_KEY_DOC, idempotency_id, service_error, service_status

# Starting a session is a few database reads and one append: it answers in well under this.
START_TIMEOUT_S = 10.0

Viewer = Annotated[Principal, Depends(require("viewer"))]
Engineer = Annotated[Principal, Depends(require("engineer"))]
SafePathId = Annotated[
    str,
    Path(pattern=SAFE_ID_PATTERN, description="1 to 64 of letters, digits, '_' or '-'."),
]

__all__ = ["ApprovalVerdict", "CancelSession", "router"]


def _rows(engine: Engine, query: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def _same_job(body: StartSessionRequest, started: dict[str, Any]) -> bool:
    """Whether a session.started event is what `body` asks for (a retry of it)."""
    if (body.workload, body.size, body.wait_for_engineer) != (
        started.get("workload"),
        started.get("size"),
        started.get("wait_for_engineer"),
    ):
        return False
    if body.device_id is not None and body.device_id != started.get("device_id"):
        return False
    if body.start is None:
        return True
    start = started.get("start") or {}
    asked = body.start.model_dump(exclude_none=True)
    return all(start.get(k) == v for k, v in asked.items())


async def started_before(
    bus: EventBus, body: StartSessionRequest, who: Principal
) -> SessionStartedOut | None:
    """The session a key started before, when this is a retry of it; None when the log holds
    none (yet); 422 when it was started for another job."""
    msg = await bus.stored(subject=f"{bus.prefix}.session.{body.session_id}.started")
    if msg is None:
        return None
    env = orjson.loads(msg.data or b"{}")
    data = env.get("data", {})
    if env.get("actor") != who.name or not _same_job(body, data):
        raise HTTPException(422, str(KeyReused()))
    return SessionStartedOut(
        session_id=data["session_id"],
        device_id=data["device_id"],
        start=data["start"],
        warm=data.get("warm"),  # the first answer's, as session.started recorded it
    )


router = APIRouter(tags=["sessions"])


@router.get("/v1/approvals", responses=READ_ERRORS)
async def waiting_approvals(
    engine: EngineDep,
    _: Viewer,
    status: Literal["waiting", "decided", "approved", "rejected", "withdrawn"] = Query(
        "waiting",
        description="waiting (oldest first), or decided, approved or rejected (latest "
        "decided first: who decided, when and the note), or withdrawn (its session was "
        "cancelled while it waited: the note says by whom)",
    ),
    limit: int = Query(100, ge=1, le=1000),
) -> Approvals:
    """Moves waiting for an engineer: from which device, job and config, the suggested
    move, its confidence and why it is here; or those already decided, with who decided."""
    t = tables.approvals
    if status == "waiting":
        query = select(t).where(t.c.status == "waiting").order_by(t.c.seq)
    else:
        shown = ("approved", "rejected") if status == "decided" else (status,)
        query = (
            select(t).where(t.c.status.in_(shown)).order_by(t.c.decided_at.desc(), t.c.seq.desc())
        )
    return Approvals(approvals=await asyncio.to_thread(_rows, engine, query.limit(limit)))


@router.post("/v1/approvals/{approval_id}", responses={**WRITE_ERRORS, **E404, **E409, **E503})
async def decide(
    bus: BusDep, approval_id: SafePathId, verdict: ApprovalVerdict, who: Engineer
) -> dict[str, Any]:
    """Approve or reject a waiting move (engineer role); who and when are recorded."""
    try:
        event = await asyncio.wait_for(
            decide_approval(
                bus,
                approval_id,
                verdict.decision == "approve",
                who.name,
                who.role,
                verdict.note,
                # A person signed in at the site's OpenID provider: who they are there.
                who.identity,
            ),
            timeout=START_TIMEOUT_S,
        )
    except ApprovalError as error:
        raise HTTPException(error.status, str(error)) from None
    except TimeoutError:
        raise HTTPException(
            503, f"the event log did not answer within {START_TIMEOUT_S:g} s"
        ) from None
    return event.model_dump()


@router.get("/v1/sessions", responses=READ_ERRORS)
async def list_sessions(
    engine: EngineDep,
    _: Viewer,
    status: Literal["running", "paused", "finished"] | None = Query(
        None, description="running, paused or finished"
    ),
    limit: int = Query(100, ge=1, le=1000),
) -> Sessions:
    t = tables.sessions
    query = select(t).order_by(t.c.started_at.desc()).limit(limit)
    if status:
        query = query.where(t.c.status == status)
    return Sessions(sessions=await asyncio.to_thread(_rows, engine, query))


@router.get("/v1/sessions/{session_id}", responses={**READ_ERRORS, **E404})
async def one_session(
    settings: SettingsDep, engine: EngineDep, session_id: SafePathId, _: Viewer
) -> dict[str, Any]:
    """The session and every step of it, from the log; `running`: the run in flight now, from
    its last run.heartbeat (what runs, for how long, when it is killed; null when none has come
    since the last step ran, or the session finished); `cancel`: who cancelled it, when and
    why (null: nobody)."""
    t, e = tables.sessions, tables.events
    found = await asyncio.to_thread(_rows, engine, select(t).where(t.c.session_id == session_id))
    if not found:
        raise HTTPException(404, f"no session {session_id}")
    prefix = settings.subject_prefix
    steps = await asyncio.to_thread(
        _rows,
        engine,
        select(e.c.seq, e.c.type, e.c.time, e.c.actor, e.c.data)
        .where(e.c.subject.startswith(f"{prefix}.session.{session_id}."))
        .order_by(e.c.seq),
    )
    last = select(e.c.seq, e.c.time, e.c.actor, e.c.data).order_by(e.c.seq.desc()).limit(1)
    beats = await asyncio.to_thread(
        _rows, engine, last.where(e.c.subject == f"{prefix}.run.{session_id}.heartbeat")
    )
    cancels = await asyncio.to_thread(
        _rows, engine, last.where(e.c.subject == cancel_subject(prefix, session_id))
    )
    ran = max((s["seq"] for s in steps if s["type"] == "session.step_run"), default=0)
    running = None
    if beats and beats[0]["seq"] > ran and found[0]["status"] != "finished":
        running = {**beats[0]["data"], "seq": beats[0]["seq"], "time": beats[0]["time"]}
    cancel = None
    if cancels:
        cancel = {**cancels[0]["data"], "seq": cancels[0]["seq"], "time": cancels[0]["time"]}
    return {**found[0], "events": steps, "running": running, "cancel": cancel}


@router.post(
    "/v1/sessions/{session_id}/cancel",
    status_code=202,
    responses={**WRITE_ERRORS, **E404, **E409, **E503},
)
async def cancel_one_session(
    bus: BusDep, session_id: SafePathId, who: Engineer, body: CancelSession | None = None
) -> dict[str, Any]:
    """Cancel a session that has not finished (engineer role), with an optional reason: who
    cancels is recorded (a cancel.requested event, its actor the caller). The coordinator
    driving the session has its device's agent kill the run in flight, the whole process group
    of its launch, and the session finishes `interrupted` within seconds (202: asked, not yet
    done; GET the session to see it end). 404: no such session; 409: it finished already, or
    was cancelled before (saying by whom)."""
    reason = body.reason if body is not None else ""
    try:
        event = await asyncio.wait_for(
            cancel_session(bus, session_id, who.name, who.role, reason, who.identity),
            timeout=START_TIMEOUT_S,
        )
    except CancelError as error:
        raise HTTPException(error.status, str(error)) from None
    except TimeoutError:
        raise HTTPException(
            503, f"the event log did not answer within {START_TIMEOUT_S:g} s"
        ) from None
    return event.model_dump()


@router.post("/v1/sessions", status_code=201, responses={**WRITE_ERRORS, **E404, **E409, **E503})
async def start_session(
    settings: SettingsDep,
    bus: BusDep,
    body: StartSessionRequest,
    who: Engineer,
    response: Response,
    idempotency_key: Annotated[
        str | None, Header(alias=HEADER, description=IDEMPOTENCY_KEY_DOC)
    ] = None,
) -> SessionStartedOut:
    """Start a tuning session on a device (engineer role): every step runs for real. A
    session id already in use is 409. With `Idempotency-Key` (and no session_id: the key
    names the session) a retry is answered with the session started first."""
    key_id = idempotency_id(idempotency_key, who, "POST /v1/sessions")
    if key_id is not None:
        if body.session_id is not None:
            raise HTTPException(
                422, f"send a session_id or an {HEADER}, not both: the key names the session"
            )
        body = body.model_copy(update={"session_id": key_id})
    try:
        reply = await bus.nc.request(
            start_session_subject(settings),
            body.model_dump_json().encode(),
            timeout=START_TIMEOUT_S,
            headers={"Hpc-Actor": who.name},
        )
    except NoRespondersError:
        raise HTTPException(503, "the coordinator is not running") from None
    except Exception:
        raise HTTPException(
            503, f"the coordinator did not answer within {START_TIMEOUT_S:g} s"
        ) from None
    answer: dict[str, Any] = orjson.loads(reply.data)
    if key_id is not None and answer.get("status") == 409:
        original = await started_before(bus, body, who)
        if original is not None:
            response.headers["Idempotent-Replayed"] = "true"
            return original
    if not answer.get("ok"):
        raise HTTPException(service_status(answer), service_error(answer))
    if key_id is not None:
        response.headers["Idempotent-Replayed"] = "false"
    return SessionStartedOut.model_validate({k: v for k, v in answer.items() if k != "ok"})
