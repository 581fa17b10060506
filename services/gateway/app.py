"""The HTTP API (FastAPI): health, readiness and the event log, read from the projection."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, select, text
from starlette.exceptions import HTTPException as StarletteHTTPException

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import status_subject
from hpc_ds1.log import get_logger
from hpc_ds1.process.runtime import SERVICES
from hpc_ds1.requests import MAX_SEQ
from hpc_ds1.security.tokens import Principal
from hpc_ds1.settings import Settings
from hpc_ds1.version import __version__

from .agents.bodies import body_limits
from .agents.routes import install_agent_api
from .api import audit, decide, devices, evaluation, fleet, machine, recommend, sessions, siblings
from .api import tasks as tasks_api
from .console.page import install_console
from .edge import auth
from .edge.auth import install_auth, require
from .edge.metrics import install_metrics
from .edge.middleware import BodyLimit, RequestLog, SecurityHeaders
from .edge.oidc import install_oidc
from .schemas import READ_ERRORS, ErrorBody

log = get_logger("gateway")

# Fields of event data never served: a token's hash is as good as an offline guessing oracle.
REDACTED_FIELDS: dict[str, frozenset[str]] = {"token.created": frozenset({"sha256"})}
PROBLEM_CHARS = 200


class Check(BaseModel):
    ok: bool
    problem: str | None = None


class ServicesCheck(BaseModel):
    ok: bool
    missing: list[str]
    unhealthy: dict[str, str]


class Checks(BaseModel):
    nats: Check
    postgres: Check
    services: ServicesCheck
    projector_lag: int | float | None = None
    # The home's CLI and join tokens, registered by this gateway when it starts (absent for a
    # gateway that does not register them): until then the CLI's own token is refused.
    credentials: Check | None = None


class Readiness(BaseModel):
    ready: bool
    checks: Checks


class EventRow(BaseModel):
    model_config = ConfigDict(extra="allow")

    seq: int
    type: str
    subject: str
    time: str | None
    actor: str | None
    source: str | None
    data: dict[str, Any] | None


class EventsPage(BaseModel):
    events: list[EventRow]
    next_after: int | None


class Health(BaseModel):
    status: Literal["ok"]


def create_app(settings: Settings, bus: EventBus, engine: Engine) -> FastAPI:
    app = FastAPI(
        title="HPC-DS1",
        version=__version__,
        description="Tunes HPC jobs one change at a time; every decision is an event. Every "
        "call but /healthz and /readyz needs a token: `Authorization: Bearer <token>`, or the "
        "cookie the login URL printed by `hpc-ds1 serve` sets.",
        # /docs is the console's: Swagger UI from files shipped in the package, not a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.credentials = None  # the gateway service sets it while it registers the home's

    @app.get("/healthz", tags=["health"])
    async def healthz() -> Health:
        """The gateway process is up."""
        return Health(status="ok")

    @app.get(
        "/readyz",
        tags=["health"],
        response_model=Readiness,
        responses={503: {"model": Readiness, "description": "Not ready: the failing checks."}},
    )
    async def readyz() -> JSONResponse:
        """NATS and Postgres reachable, every service answering and healthy by its own account
        (a stuck or lagging projector says so); the projector's lag when it reports one."""
        nats, postgres, services = await asyncio.gather(
            _check_nats(bus),
            asyncio.to_thread(_check_postgres, engine),
            _check_services(settings, bus),
        )
        credentials: Check | None = app.state.credentials
        checks = Checks(
            nats=nats,
            postgres=postgres,
            services=services[0],
            projector_lag=services[1],
            credentials=credentials,
        )
        ready = (
            nats.ok and postgres.ok and services[0].ok and (credentials is None or credentials.ok)
        )
        body = Readiness(ready=ready, checks=checks)
        return JSONResponse(body.model_dump(), status_code=200 if ready else 503)

    @app.get("/v1/events", tags=["events"], responses=READ_ERRORS)
    async def list_events(
        _: Annotated[Principal, Depends(require("viewer"))],
        type: str | None = Query(
            None,
            pattern=r"^[a-z_]{1,32}\.[a-z_]{1,32}$",
            description="Exact event type, e.g. device.registered",
        ),
        subject: str | None = Query(
            None,
            max_length=256,
            pattern=r"^[A-Za-z0-9_.\-]*$",
            description="Subject prefix, e.g. hpcds1.device.",
        ),
        after: int = Query(0, ge=0, le=MAX_SEQ, description="Events with a sequence above this."),
        limit: int = Query(100, ge=1, le=1000),
    ) -> EventsPage:
        """The event log as projected, oldest first; page with `after` = the last `seq` seen.
        Token events carry no hash."""
        rows = await asyncio.to_thread(_query_events, engine, type, subject, after, limit)
        return EventsPage(
            events=[EventRow.model_validate(r) for r in rows],
            next_after=rows[-1]["seq"] if len(rows) == limit else None,
        )

    install_auth(app, settings, engine, bus)
    # what the module-level routers' handlers take as dependencies (deps.py)
    app.state.settings, app.state.bus, app.state.engine = settings, bus, engine
    for module in (auth, decide, recommend, sessions, audit, evaluation, machine, siblings):
        app.include_router(module.router)
    app.include_router(tasks_api.router)
    install_agent_api(app, settings, bus, engine)
    app.include_router(fleet.router)
    app.include_router(devices.router)
    install_console(app, settings, bus, engine, redact=_redact)
    install_oidc(app, settings, engine)  # the site's sign-in, when HPC_DS1_OIDC_ISSUER is set

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
        # Field-level messages; the offending input is not echoed (it may be NaN or a secret).
        detail = [
            {
                "loc": [str(x) if not isinstance(x, int) else x for x in e["loc"]],
                "msg": e["msg"],
                "type": e["type"],
            }
            for e in error.errors()
        ]
        where = ", ".join(".".join(str(x) for x in d["loc"]) for d in detail[:5])
        body = {
            "error": f"invalid request: {where}" if where else "invalid request",
            "detail": detail,
        }
        return JSONResponse(body, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            _error_body(error.detail), status_code=error.status_code, headers=error.headers
        )

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, exempt=body_limits(settings))
    app.add_middleware(RequestLog)
    # Outside the request log: every response, its JSON 500 included, carries them.
    app.add_middleware(SecurityHeaders)
    if settings.metrics:  # last: its middleware times everything above, the request log too
        install_metrics(app, settings, bus, engine)
    _declare_internal_error(app)
    return app


def _error_body(detail: Any) -> dict[str, Any]:
    """An ErrorBody from an HTTPException's detail: a sentence, or a service's list of issues."""
    if isinstance(detail, str):
        return {"error": detail}
    if isinstance(detail, list):
        issues = [
            {
                "loc": [x if isinstance(x, int) else str(x) for x in d.get("loc", [])],
                "msg": str(d.get("msg", "")),
                "type": str(d.get("type", "")),
            }
            for d in detail
            if isinstance(d, dict)
        ]
        return {"error": "invalid request", "detail": issues}
    return {"error": str(detail)}


def _declare_internal_error(app: FastAPI) -> None:
    """Every operation may answer 500 (a JSON ErrorBody naming the request id, nothing else)."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = original()
        ref = {"$ref": "#/components/schemas/ErrorBody"}
        components = spec.setdefault("components", {}).setdefault("schemas", {})
        if "ErrorBody" not in components:
            components["ErrorBody"] = ErrorBody.model_json_schema(
                ref_template="#/components/schemas/{model}"
            )
            components.update(components["ErrorBody"].pop("$defs", {}))
        for operations in spec.get("paths", {}).values():
            for operation in operations.values():
                operation.setdefault("responses", {}).setdefault(
                    "500",
                    {
                        "description": "Internal error (its request id names it in the log).",
                        "content": {"application/json": {"schema": ref}},
                    },
                )
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]


async def _check_nats(bus: EventBus) -> Check:
    try:
        await asyncio.wait_for(bus.js.stream_info(bus.stream), timeout=2.0)
        return Check(ok=True)
    except Exception as error:
        log.warning("not_ready", check="nats", error=f"{type(error).__name__}: {error}")
        return Check(ok=False, problem="the event stream is not reachable")


def _check_postgres(engine: Engine) -> Check:
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return Check(ok=True)
    except Exception as error:
        log.warning("not_ready", check="postgres", error=f"{type(error).__name__}: {error}")
        return Check(ok=False, problem="the database is not reachable")


async def _check_services(
    settings: Settings, bus: EventBus
) -> tuple[ServicesCheck, int | float | None]:
    async def ask(name: str) -> tuple[str, dict[str, Any] | None]:
        try:
            reply = await bus.nc.request(status_subject(settings, name), b"", timeout=1.0)
            body = json.loads(reply.data)
        except Exception:
            return name, None
        if not isinstance(body, dict) or body.get("service") != name:
            return name, None
        return name, body

    answers = dict(await asyncio.gather(*(ask(n) for n in SERVICES)))
    missing = [n for n, body in answers.items() if body is None]
    unhealthy = {
        n: str(body.get("problem") or "unhealthy")[:PROBLEM_CHARS]
        for n, body in answers.items()
        if body is not None and body.get("healthy") is False
    }
    lag = (answers.get("projector") or {}).get("lag")
    if not isinstance(lag, int | float) or isinstance(lag, bool):
        lag = None
    check = ServicesCheck(ok=not missing and not unhealthy, missing=missing, unhealthy=unhealthy)
    return check, lag


def _redact(event_type: str, data: Any) -> Any:
    hidden = REDACTED_FIELDS.get(event_type)
    if not hidden or not isinstance(data, dict):
        return data
    return {k: v for k, v in data.items() if k not in hidden}


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
    return [
        {
            **row,
            "time": row["time"].isoformat() if row["time"] else None,
            "data": _redact(row["type"], row["data"]),
        }
        for row in rows
    ]
