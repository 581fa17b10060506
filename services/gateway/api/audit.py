"""GET /v1/audit (every logged decision, paged and filtered) and GET /v1/stats (facility figures),
read from the projection. Reading needs `require("viewer")`."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field
from sqlalchemy import Engine, func, select

from hpc_ds1.db import tables
from hpc_ds1.requests import MAX_SEQ, SAFE_ID_PATTERN
from hpc_ds1.security.tokens import Principal

from ..deps import EngineDep
from ..edge.auth import require
from ..schemas import ERRORS_401_403, READ_ERRORS, AuditPage, Stats

MAX_LIMIT = 1000

# Module level: with postponed annotations FastAPI resolves these names in module globals.
Reader = Annotated[Principal, Depends(require("viewer"))]


def approved_label(approved_by: str | None, approval: str | None) -> str | None:
    """Who approved the move ('auto' when it ran by itself), else the approval's status
    ('waiting', 'rejected'); None when no approval was asked."""
    if approved_by:
        return approved_by
    return approval


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def query_audit(
    engine: Engine,
    *,
    after: int | None,
    before: int | None,
    limit: int,
    filters: dict[str, str | None],
) -> list[dict[str, Any]]:
    """Newest first; with `after`, oldest first from just after that sequence."""
    t = tables.decisions
    query = select(t)
    for column, value in filters.items():
        if value is not None:
            query = query.where(t.c[column] == value)
    if after is not None:
        query = query.where(t.c.seq > after)
    if before is not None:
        query = query.where(t.c.seq < before)
    order = t.c.seq.asc() if after is not None else t.c.seq.desc()
    query = query.order_by(order).limit(limit)
    with engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
    return [
        {
            "seq": row["seq"],
            "time": _iso(row["time"]),
            "source": row["source"],
            "device_id": row["device_id"],
            "workload": row["workload"],
            "size": row["size"],
            "config": row["config"],
            "choice": row["choice"],
            "confidence": row["confidence"],
            "mode": row["mode"],
            "actor": row["actor"],
            "approved": approved_label(row["approved_by"], row["approval"]),
            "approval": row["approval"],
            "decision_id": row["decision_id"],
            "session_id": row["session_id"],
            "model_version": row["model_version"],
            "reasons": row["reasons"],
        }
        for row in rows
    ]


# Issue 45: what an admin does, as events with their actor (the envelope's).
ADMIN_EVENT_TYPES: tuple[str, ...] = (
    "token.created",
    "token.revoked",
    "device.draining",
    "device.left",
)


class AdminAction(BaseModel):
    seq: int
    time: str | None
    type: str
    actor: str | None = Field(description="Who did it (a person, the CLI's user, a device).")
    source: str | None
    target: str = Field(description="The token or device acted on.")
    summary: str


class AdminActionsPage(BaseModel):
    actions: list[AdminAction]
    next_before: int | None


def _summary(kind: str, data: dict[str, Any]) -> tuple[str, str]:
    """(what was acted on, a sentence) for one admin event; never a token's hash."""
    why = f" ({data['reason']})" if data.get("reason") else ""
    if kind == "token.created":
        until = f", expires {data['expires_at']}" if data.get("expires_at") else ""
        return str(data.get("token_id")), (
            f"token for {data.get('holder')} ({data.get('role')}{until}) created{why}"
        )
    if kind == "token.revoked":
        return str(data.get("token_id")), f"token revoked{why}"
    if kind == "device.draining":
        return str(data.get("device_id")), (
            "device drained" if data.get("draining") else "device resumed"
        )
    return str(data.get("device_id")), f"device left: {data.get('reason', '')}"


def query_admin_actions(engine: Engine, before: int | None, limit: int) -> list[dict[str, Any]]:
    t = tables.events
    query = select(t.c.seq, t.c.time, t.c.type, t.c.actor, t.c.source, t.c.data).where(
        t.c.type.in_(ADMIN_EVENT_TYPES), t.c.valid.is_(True)
    )
    if before is not None:
        query = query.where(t.c.seq < before)
    with engine.connect() as conn:
        rows = conn.execute(query.order_by(t.c.seq.desc()).limit(limit)).mappings().all()
    actions = []
    for row in rows:
        data = row["data"] if isinstance(row["data"], dict) else {}
        target, summary = _summary(row["type"], data)
        actions.append(
            {
                "seq": row["seq"],
                "time": _iso(row["time"]),
                "type": row["type"],
                "actor": row["actor"],
                "source": row["source"],
                "target": target,
                "summary": summary,
            }
        )
    return actions


def query_stats(engine: Engine) -> dict[str, Any]:
    """The seed page's facility figures."""
    d = tables.decisions

    def count(table: Any, *where: Any) -> Any:
        return select(func.count()).select_from(table).where(*where).scalar_subquery()

    dev, tasks = tables.devices, tables.tasks
    columns = {
        # online: heard from (the coordinator's liveness crossings), and not revoked
        "devices_online": count(dev, dev.c.status != "left", dev.c.liveness == "online"),
        "sessions_running": count(
            tables.sessions, tables.sessions.c.status.in_(("running", "paused"))
        ),
        "moves_waiting": count(tables.approvals, tables.approvals.c.status == "waiting"),
        "decisions_total": count(d),
        "decisions_auto": count(d, d.c.mode == "auto"),
    }
    columns["tasks_running"] = count(tasks, tasks.c.status.in_(("placed", "running")))
    query = select(*(value.label(name) for name, value in columns.items()))
    with engine.connect() as conn:
        figures = {k: int(v) for k, v in conn.execute(query).mappings().one().items()}
    total = figures["decisions_total"]
    return {
        "devices_online": figures["devices_online"],
        "sessions_running": figures["sessions_running"],
        "tasks_running": figures["tasks_running"],
        "moves_waiting": figures["moves_waiting"],
        "decisions_total": total,
        "decisions_auto": figures["decisions_auto"],
        "auto_share": figures["decisions_auto"] / total if total else None,
    }


router = APIRouter(tags=["audit"])


@router.get("/v1/audit", responses=READ_ERRORS)
async def audit(
    engine: EngineDep,
    _: Reader,
    after: int | None = Query(None, ge=0, le=MAX_SEQ, description="Oldest first, seq above this."),
    before: int | None = Query(None, ge=1, le=MAX_SEQ, description="Newest first, seq below this."),
    limit: int = Query(100, ge=1, le=MAX_LIMIT),
    source: str | None = Query(
        None, pattern=r"^[a-z_]{1,32}$", description="api, cli, python, session or task"
    ),
    mode: Literal["auto", "confirm", "escalate"] | None = Query(
        None, description="auto, confirm or escalate"
    ),
    workload: str | None = Query(None, pattern=r"^[A-Za-z0-9_.\-]{1,64}$"),
    device_id: str | None = Query(None, pattern=SAFE_ID_PATTERN),
    session_id: str | None = Query(None, pattern=SAFE_ID_PATTERN),
) -> AuditPage:
    """Every decision the service made, with who approved it ('auto' when it ran by
    itself). Newest first, next page with `before` = `next_before`; or oldest first
    from `after`, next page with `after` = `next_after`."""
    filters = {
        "source": source,
        "mode": mode,
        "workload": workload,
        "device_id": device_id,
        "session_id": session_id,
    }
    rows = await asyncio.to_thread(
        query_audit, engine, after=after, before=before, limit=limit, filters=filters
    )
    full = len(rows) == limit
    last = rows[-1]["seq"] if rows else None
    return AuditPage.model_validate(
        {
            "decisions": rows,
            "next_after": last if full and after is not None else None,
            "next_before": last if full and after is None else None,
        }
    )


@router.get("/v1/audit/admin", responses=READ_ERRORS)
async def admin_actions(
    engine: EngineDep,
    _: Reader,
    before: int | None = Query(None, ge=1, le=MAX_SEQ, description="Newest first, seq below this."),
    limit: int = Query(100, ge=1, le=MAX_LIMIT),
) -> AdminActionsPage:
    """Admin actions, newest first, each with its actor: tokens created (a device's join
    included) or revoked, join tokens rotated, devices drained or resumed, devices that
    left (revoked). Next page with `before` = `next_before`."""
    rows = await asyncio.to_thread(query_admin_actions, engine, before, limit)
    full = len(rows) == limit
    return AdminActionsPage(
        actions=[AdminAction.model_validate(r) for r in rows],
        next_before=rows[-1]["seq"] if full and rows else None,
    )


@router.get("/v1/stats", responses=ERRORS_401_403)
async def stats(engine: EngineDep, _: Reader) -> Stats:
    """Devices online, sessions running (or paused), tasks queued or running (null until
    tasks exist), moves waiting for an engineer, and the share of logged decisions that ran
    automatically (null when none)."""
    return Stats.model_validate(await asyncio.to_thread(query_stats, engine))
