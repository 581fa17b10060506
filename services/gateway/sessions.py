"""Sessions and approvals over HTTP: reads from the projection, commands over NATS."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine, select

from hpc_ds1.approvals import ApprovalError, decide_approval
from hpc_ds1.bus import EventBus
from hpc_ds1.db import tables
from hpc_ds1.requests import StartSessionRequest
from hpc_ds1.settings import Settings
from hpc_ds1.subjects import start_session_subject
from hpc_ds1.tokens import Principal

from .auth import require


class ApprovalVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"]
    note: str = Field(default="", max_length=2000)


def _rows(engine: Engine, query: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def sessions_router(settings: Settings, bus: EventBus, engine: Engine) -> APIRouter:
    router = APIRouter(tags=["sessions"])
    viewer, engineer = Depends(require("viewer")), Depends(require("engineer"))

    @router.get("/v1/approvals")
    async def waiting_approvals(_: Principal = viewer) -> dict[str, Any]:
        """Moves waiting for an engineer: from which device, job and config, the suggested
        move, its confidence and why it is here."""
        t = tables.approvals
        query = select(t).where(t.c.status == "waiting").order_by(t.c.seq)
        return {"approvals": await asyncio.to_thread(_rows, engine, query)}

    @router.post("/v1/approvals/{approval_id}")
    async def decide(
        approval_id: str, verdict: ApprovalVerdict, who: Principal = engineer
    ) -> dict[str, Any]:
        """Approve or reject a waiting move (engineer role); who and when are recorded."""
        try:
            event = await decide_approval(
                bus, approval_id, verdict.decision == "approve", who.name, who.role, verdict.note
            )
        except ApprovalError as error:
            raise HTTPException(error.status, str(error)) from None
        return event.model_dump()

    @router.get("/v1/sessions")
    async def list_sessions(
        status: str | None = Query(None, description="running, paused or finished"),
        limit: int = Query(100, ge=1, le=1000),
        _: Principal = viewer,
    ) -> dict[str, Any]:
        t = tables.sessions
        query = select(t).order_by(t.c.started_at.desc()).limit(limit)
        if status:
            query = query.where(t.c.status == status)
        return {"sessions": await asyncio.to_thread(_rows, engine, query)}

    @router.get("/v1/sessions/{session_id}")
    async def one_session(session_id: str, _: Principal = viewer) -> dict[str, Any]:
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

    @router.post("/v1/sessions", status_code=201)
    async def start_session(body: StartSessionRequest, who: Principal = engineer) -> dict[str, Any]:
        """Start a tuning session on a device (engineer role): every step runs for real."""
        try:
            reply = await bus.nc.request(
                start_session_subject(settings),
                body.model_dump_json().encode(),
                timeout=30.0,
                headers={"Hpc-Actor": who.name},
            )
        except Exception as error:
            raise HTTPException(503, f"the coordinator did not answer: {error!r}") from None
        answer: dict[str, Any] = orjson.loads(reply.data)
        if not answer.get("ok"):
            raise HTTPException(int(answer.get("status", 500)), answer.get("error"))
        return {k: v for k, v in answer.items() if k != "ok"}

    return router
