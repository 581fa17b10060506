"""Sessions and approvals over HTTP: reads from the projection, commands over NATS.

Ids in paths are checked against SAFE_ID before anything uses them (they become NATS subject
tokens: '*', '>', '.' and whitespace never reach a subject); the coordinator's refusals keep
their own 4xx status."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, HTTPException, Path, Query
from nats.errors import NoRespondersError
from sqlalchemy import Engine, select

from hpc_ds1.approvals import ApprovalError, decide_approval
from hpc_ds1.bus import EventBus
from hpc_ds1.db import tables
from hpc_ds1.requests import SAFE_ID_PATTERN, ApprovalVerdict, StartSessionRequest
from hpc_ds1.settings import Settings
from hpc_ds1.subjects import start_session_subject
from hpc_ds1.tokens import Principal

from .auth import require
from .decide import service_error, service_status
from .schemas import (
    E404,
    E409,
    E503,
    READ_ERRORS,
    WRITE_ERRORS,
    Approvals,
    Sessions,
    SessionStartedOut,
)

# Starting a session is a few database reads and one append: it answers in well under this.
START_TIMEOUT_S = 10.0

Viewer = Annotated[Principal, Depends(require("viewer"))]
Engineer = Annotated[Principal, Depends(require("engineer"))]
SafePathId = Annotated[
    str,
    Path(pattern=SAFE_ID_PATTERN, description="1 to 64 of letters, digits, '_' or '-'."),
]

__all__ = ["ApprovalVerdict", "sessions_router"]


def _rows(engine: Engine, query: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def sessions_router(settings: Settings, bus: EventBus, engine: Engine) -> APIRouter:
    router = APIRouter(tags=["sessions"])

    @router.get("/v1/approvals", responses=READ_ERRORS)
    async def waiting_approvals(
        _: Viewer,
        status: Literal["waiting", "decided", "approved", "rejected"] = Query(
            "waiting",
            description="waiting (oldest first), or decided, approved or rejected (latest "
            "decided first: who decided, when and the note)",
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
                select(t)
                .where(t.c.status.in_(shown))
                .order_by(t.c.decided_at.desc(), t.c.seq.desc())
            )
        return Approvals(approvals=await asyncio.to_thread(_rows, engine, query.limit(limit)))

    @router.post("/v1/approvals/{approval_id}", responses={**WRITE_ERRORS, **E404, **E409, **E503})
    async def decide(
        approval_id: SafePathId, verdict: ApprovalVerdict, who: Engineer
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
    async def one_session(session_id: SafePathId, _: Viewer) -> dict[str, Any]:
        """The session and every step of it, from the log."""
        t, e = tables.sessions, tables.events
        found = await asyncio.to_thread(
            _rows, engine, select(t).where(t.c.session_id == session_id)
        )
        if not found:
            raise HTTPException(404, f"no session {session_id}")
        steps = await asyncio.to_thread(
            _rows,
            engine,
            select(e.c.seq, e.c.type, e.c.time, e.c.actor, e.c.data)
            .where(e.c.subject.startswith(f"{settings.subject_prefix}.session.{session_id}."))
            .order_by(e.c.seq),
        )
        return {**found[0], "events": steps}

    @router.post(
        "/v1/sessions", status_code=201, responses={**WRITE_ERRORS, **E404, **E409, **E503}
    )
    async def start_session(body: StartSessionRequest, who: Engineer) -> SessionStartedOut:
        """Start a tuning session on a device (engineer role): every step runs for real. A
        session id already in use is 409."""
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
        if not answer.get("ok"):
            raise HTTPException(service_status(answer), service_error(answer))
        return SessionStartedOut.model_validate({k: v for k, v in answer.items() if k != "ok"})

    return router
