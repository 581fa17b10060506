"""GET /v1/audit (every logged decision, paged and filtered) and GET /v1/stats (facility figures),
read from the projection. Reading needs `require("viewer")`."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from sqlalchemy import Engine, func, select

from hpc_ds1.db import tables
from hpc_ds1.requests import MAX_SEQ, SAFE_ID_PATTERN
from hpc_ds1.settings import Settings
from hpc_ds1.tokens import Principal

from .auth import require
from .schemas import ERRORS_401_403, READ_ERRORS, AuditPage, Stats

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


def audit_router(settings: Settings, engine: Engine) -> APIRouter:
    router = APIRouter(tags=["audit"])

    @router.get("/v1/audit", responses=READ_ERRORS)
    async def audit(
        _: Reader,
        after: int | None = Query(
            None, ge=0, le=MAX_SEQ, description="Oldest first, seq above this."
        ),
        before: int | None = Query(
            None, ge=1, le=MAX_SEQ, description="Newest first, seq below this."
        ),
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

    @router.get("/v1/stats", responses=ERRORS_401_403)
    async def stats(_: Reader) -> Stats:
        """Devices online, sessions running (or paused), tasks queued or running (null until
        tasks exist), moves waiting for an engineer, and the share of logged decisions that ran
        automatically (null when none)."""
        return Stats.model_validate(await asyncio.to_thread(query_stats, engine))

    return router
