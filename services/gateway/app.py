"""The HTTP API (FastAPI): health, readiness and the event log, read from the projection."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import structlog
from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from sqlalchemy import Engine, select, text

from hpc_ds1 import __version__
from hpc_ds1.bus import EventBus
from hpc_ds1.db import tables
from hpc_ds1.log import get_logger
from hpc_ds1.runtime import SERVICES
from hpc_ds1.settings import Settings
from hpc_ds1.subjects import status_subject
from hpc_ds1.tokens import Principal

from .audit_api import audit_router
from .auth import auth_router, install_auth, require
from .decide import decide_router
from .evaluation_api import evaluation_router
from .sessions import sessions_router

log = get_logger("gateway")


def create_app(settings: Settings, bus: EventBus, engine: Engine) -> FastAPI:
    app = FastAPI(
        title="HPC-DS1",
        version=__version__,
        description="Tunes HPC jobs one change at a time; every decision is an event.",
    )

    @app.middleware("http")
    async def request_id(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex[:16]
        structlog.contextvars.bind_contextvars(request_id=rid)
        started = time.perf_counter()
        try:
            response = await call_next(request)
        finally:
            structlog.contextvars.unbind_contextvars("request_id")
        response.headers["x-request-id"] = rid
        log.info(
            "request",
            request_id=rid,
            method=request.method,
            path=request.url.path,
            status=response.status_code,
            ms=round((time.perf_counter() - started) * 1000, 2),
        )
        return response

    @app.get("/", include_in_schema=False)
    async def console() -> RedirectResponse:
        return RedirectResponse("/docs")

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The gateway process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        """NATS and Postgres reachable, and every service answering."""
        checks = {
            "nats": await _check_nats(bus),
            "postgres": await asyncio.to_thread(_check_postgres, engine),
            "services": await _check_services(settings, bus),
        }
        ready = all(c["ok"] for c in checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    @app.get("/v1/events", tags=["events"])
    async def list_events(
        _: Annotated[Principal, Depends(require("viewer"))],
        type: str | None = Query(None, description="Exact event type, e.g. device.registered"),
        subject: str | None = Query(None, description="Subject prefix, e.g. hpcds1.device."),
        after: int = Query(0, ge=0, description="Return events with a sequence above this."),
        limit: int = Query(100, ge=1, le=1000),
    ) -> dict[str, Any]:
        """The event log as projected, oldest first; page with `after` = the last `seq` seen."""
        rows = await asyncio.to_thread(_query_events, engine, type, subject, after, limit)
        return {"events": rows, "next_after": rows[-1]["seq"] if len(rows) == limit else None}

    install_auth(app, settings, engine)
    app.include_router(auth_router(settings, engine))
    app.include_router(decide_router(settings, bus))
    app.include_router(sessions_router(settings, bus, engine))
    app.include_router(audit_router(settings, engine))
    app.include_router(evaluation_router(settings, engine))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
        # Field-level messages; the offending input is not echoed (it may be NaN or a secret).
        detail = [
            {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in error.errors()
        ]
        return JSONResponse({"error": "invalid request", "detail": detail}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": error.detail}, status_code=error.status_code, headers=error.headers
        )

    return app


async def _check_nats(bus: EventBus) -> dict[str, Any]:
    try:
        await asyncio.wait_for(bus.js.stream_info(bus.stream), timeout=2.0)
        return {"ok": True}
    except Exception as error:
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}


def _check_postgres(engine: Engine) -> dict[str, Any]:
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return {"ok": True}
    except Exception as error:
        return {"ok": False, "error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}


async def _check_services(settings: Settings, bus: EventBus) -> dict[str, Any]:
    async def ask(name: str) -> tuple[str, bool]:
        try:
            reply = await bus.nc.request(status_subject(settings, name), b"", timeout=1.0)
            return name, json.loads(reply.data).get("service") == name
        except Exception:
            return name, False

    answers = dict(await asyncio.gather(*(ask(n) for n in SERVICES)))
    missing = [n for n, ok in answers.items() if not ok]
    return {"ok": not missing, "missing": missing}


def _query_events(
    engine: Engine, event_type: str | None, subject: str | None, after: int, limit: int
) -> list[dict[str, Any]]:
    t = tables.events
    query = select(t).where(t.c.seq > after).order_by(t.c.seq).limit(limit)
    if event_type:
        query = query.where(t.c.type == event_type)
    if subject:
        query = query.where(t.c.subject.startswith(subject, autoescape=True))
    with engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
    return [{**row, "time": row["time"].isoformat() if row["time"] else None} for row in rows]
