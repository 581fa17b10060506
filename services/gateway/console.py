"""The console in the browser: the page at `/`, its static files, the live event stream and the
API docs, all served from files shipped in the package (no CDN: an air-gapped cluster gets the
same page).

- `GET /`: the console for a signed-in browser (session cookie, or a bearer header); with
  `?token=<one-time token>` the login exchange (auth.login_exchange) then back to `/`; otherwise
  a small sign-in page, which holds no data. `POST /` (the sign-in form): a one-time login token
  or a person's own API token, kept in the HttpOnly, SameSite=Strict session cookie.
- `GET /static/...`: the stylesheet, the shared client, the sections' modules, vendored files.
  No credential needed: they hold no data.
- `GET /v1/stream` (viewer): Server-Sent Events, one per new event of the log,
  `id: <seq>` / `event: <type>` / `data: <envelope JSON, redacted as /v1/events>`. One ordered
  JetStream consumer per gateway feeds every client through a bounded queue; a client that
  falls behind by QUEUE_FRAMES is dropped (its browser reconnects), never slowing the others.
- `GET /docs`: Swagger UI, vendored in static/vendor/swagger-ui (no CDN).

Templates are Jinja2 (autoescaped). Every template gets: `user` ({name, role}), `server_url`
(this server as the browser reached it), `fleet_url` (as other devices reach it), `home` (this
server's data folder), `example` (a job measured here: workload, size, ranks, threads), `stats`
(GET /v1/stats's figures, for a first view without a round trip), `version`, `sections`, and
`page_data` (the JSON the client reads)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit

import orjson
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from sqlalchemy import Engine, func, select
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from hpc_ds1 import __version__
from hpc_ds1.bus import EventBus
from hpc_ds1.console import SECTIONS, STATIC_DIR, TEMPLATES_DIR
from hpc_ds1.credentials import owner_name, reachable_host
from hpc_ds1.db import tables
from hpc_ds1.events import EVENT_TYPES
from hpc_ds1.log import get_logger
from hpc_ds1.settings import Settings
from hpc_ds1.tokens import PERSON_ROLES, Principal, lookup

from .audit_api import query_stats
from .auth import SESSION_COOKIE, _credential, login_exchange, require, same_origin, verify
from .schemas import ERRORS_401_403

log = get_logger("gateway.console")

KEEPALIVE_S = 15.0  # a comment line this often keeps proxies from closing an idle stream
QUEUE_FRAMES = 1000  # events a client may be behind before it is dropped
MAX_STREAMS = 1000  # concurrent /v1/stream clients per gateway; more get 503
FORM_MAX_BYTES = 4096
_EVENT_NAME = re.compile(r"^[a-z_]{1,32}\.[a-z_]{1,32}$")

# The console page may load nothing from elsewhere, and nothing may frame it.
CONSOLE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": CONSOLE_CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

Redact = Callable[[str, Any], Any]
# Module level: with postponed annotations FastAPI resolves these names in module globals.
Viewer = Annotated[Principal, Depends(require("viewer"))]


def _environment() -> Environment:
    return Environment(
        loader=FileSystemLoader(str(TEMPLATES_DIR)),
        autoescape=select_autoescape(("html",)),
        trim_blocks=True,
        lstrip_blocks=True,
    )


class _Static(StaticFiles):
    """StaticFiles that asks the browser to revalidate (ETag) rather than trust a stale copy:
    the sections' modules import ../console.js by a fixed URL, so no cache-busting query."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.setdefault("Cache-Control", "no-cache")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response


# --- the live stream --------------------------------------------------------------------------


class _Client:
    __slots__ = ("dropped", "queue")

    def __init__(self, size: int) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=size)
        self.dropped = False

    def offer(self, frame: bytes) -> bool:
        """Queue a frame without waiting; False (and the client is dropped) when it is full."""
        if self.dropped:
            return False
        try:
            self.queue.put_nowait(frame)
            return True
        except asyncio.QueueFull:
            self.dropped = True
            # Free what it holds and leave only the end marker: its response ends once it
            # reads again, and the browser's EventSource reconnects by itself.
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(None)
            return False


class StreamHub:
    """One ordered JetStream consumer of `<prefix>.>` (new events only) shared by every stream
    client of this gateway. Each event is decoded, redacted and framed once, then offered to
    every client's bounded queue without waiting. Stored events only: an append the stream
    refused (a concurrency conflict, a duplicate) is never shown, which a core NATS subscription
    would do."""

    def __init__(self, bus: EventBus, redact: Redact, queue_frames: int = QUEUE_FRAMES) -> None:
        self.bus = bus
        self.redact = redact
        self.queue_frames = queue_frames
        self.clients: set[_Client] = set()
        self._subscription: Any = None
        self._lock = asyncio.Lock()
        self.dropped = 0

    async def attach(self) -> _Client:
        async with self._lock:
            if self._subscription is None:
                self._subscription = await self.bus.js.subscribe(
                    f"{self.bus.prefix}.>",
                    stream=self.bus.stream,
                    ordered_consumer=True,
                    deliver_policy=DeliverPolicy.NEW,
                    cb=self._on_message,
                )
            client = _Client(self.queue_frames)
            self.clients.add(client)
            return client

    def detach(self, client: _Client) -> None:
        self.clients.discard(client)

    async def close(self) -> None:
        async with self._lock:
            subscription, self._subscription = self._subscription, None
            for client in list(self.clients):
                client.dropped = True
                with contextlib.suppress(asyncio.QueueFull):
                    client.queue.put_nowait(None)
            self.clients.clear()
        if subscription is not None:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    def frame(self, seq: int, raw: bytes) -> bytes | None:
        try:
            envelope = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(envelope, dict):
            return None
        kind = envelope.get("type")
        if not isinstance(kind, str) or not _EVENT_NAME.match(kind):
            return None
        envelope["data"] = self.redact(kind, envelope.get("data"))
        envelope["seq"] = seq
        return b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, kind.encode(), orjson.dumps(envelope))

    async def _on_message(self, msg: Msg) -> None:
        if not self.clients:
            return
        try:
            seq = int(msg.metadata.sequence.stream)
        except Exception:
            return
        frame = self.frame(seq, msg.data)
        if frame is None:
            return
        for client in list(self.clients):
            if not client.offer(frame):
                self.clients.discard(client)
                self.dropped += 1
                log.info("stream_client_dropped", behind=self.queue_frames)


async def _stream(
    request: Request, hub: StreamHub, engine: Engine, token: str | None
) -> AsyncIterator[bytes]:
    client = await hub.attach()
    try:
        # The first bytes say the subscription is in place: events from now on arrive.
        yield b"retry: 3000\n: connected\n\n"
        while True:
            try:
                frame = await asyncio.wait_for(client.queue.get(), KEEPALIVE_S)
            except TimeoutError:
                # A revoked token (or session cookie) ends its stream within KEEPALIVE_S.
                if token is not None and await asyncio.to_thread(lookup, engine, token) is None:
                    return
                yield b": keep-alive\n\n"
                continue
            if frame is None:
                return
            frames = [frame]
            # Whatever else is already queued goes in the same write.
            while len(frames) < 256 and not client.queue.empty():
                more = client.queue.get_nowait()
                if more is None:
                    yield b"".join(frames)
                    return
                frames.append(more)
            yield b"".join(frames)
    finally:
        hub.detach(client)


# --- what the snippets show ------------------------------------------------------------------

# Before anything was measured here: the seed's example.
DEFAULT_EXAMPLE: dict[str, Any] = {"workload": "gemm", "size": 2048, "ranks": 2, "threads": 4}
EXAMPLE_TTL_S = 60.0


def query_example(engine: Engine) -> dict[str, Any]:
    """A job measured correctly on this machine (its local device): the smallest size of the
    workload measured most, with the ranks and threads of its fastest run there. The snippets
    show it, so they run as shown (and quickly) on this machine."""
    m, d = tables.measurements, tables.devices
    local = select(d.c.device_id).where(d.c.local.is_(True)).scalar_subquery()
    ok = (m.c.device_id == local) & (m.c.status == "ok")
    with engine.connect() as conn:
        workload = conn.execute(
            select(m.c.workload)
            .where(ok)
            .group_by(m.c.workload)
            .order_by(func.count().desc(), m.c.workload)
            .limit(1)
        ).scalar()
        if workload is None:
            return dict(DEFAULT_EXAMPLE)
        row = conn.execute(
            select(m.c.size, m.c.config)
            .where(ok, m.c.workload == workload)
            .order_by(m.c.size, m.c.runtime_s)
            .limit(1)
        ).first()
    if row is None:
        return dict(DEFAULT_EXAMPLE)
    config = row.config if isinstance(row.config, dict) else {}
    return {
        "workload": str(workload),
        "size": int(row.size),
        "ranks": int(config.get("ranks") or 1),
        "threads": int(config.get("threads") or 1),
    }


class _Cached:
    """A value recomputed (off the event loop) at most every `ttl_s` seconds."""

    def __init__(self, compute: Callable[[], Any], ttl_s: float) -> None:
        self.compute = compute
        self.ttl_s = ttl_s
        self.value: Any = None
        self.at = float("-inf")

    async def get(self) -> Any:
        now = asyncio.get_running_loop().time()
        if now - self.at >= self.ttl_s:
            self.value = await asyncio.to_thread(self.compute)
            self.at = now
        return self.value


def _fleet_url(settings: Settings, server_url: str) -> str:
    """Where other devices reach this coordinator: the browser's URL unless that is loopback
    and the gateway listens on every interface (then this machine's address)."""
    parts = urlsplit(server_url)
    host = parts.hostname or ""
    if host in ("127.0.0.1", "localhost", "::1") and settings.host in ("0.0.0.0", "::", ""):
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{reachable_host(settings.host)}{port}"
    return server_url


# --- install ----------------------------------------------------------------------------------


def install_console(
    app: FastAPI, settings: Settings, bus: EventBus, engine: Engine, redact: Redact
) -> StreamHub:
    """Add `/`, `POST /`, `/static`, `/v1/stream` and `/docs` to the app
    (create it with docs_url=None and redoc_url=None). Returns the stream hub."""
    templates = _environment()
    hub = StreamHub(bus, redact)
    app.state.stream_hub = hub
    event_types = sorted(EVENT_TYPES)
    sections = [{"id": sid, "heading": heading} for _, sid, heading in SECTIONS]

    def signin_page(
        problem: str | None = None, status: int = 200, forget: bool = False
    ) -> HTMLResponse:
        html = templates.get_template("signin.html").render(problem=problem, version=__version__)
        response = HTMLResponse(html, status_code=status, headers=_PAGE_HEADERS)
        if forget:  # a session cookie that no longer works
            response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    example = _Cached(lambda: query_example(engine), EXAMPLE_TTL_S)
    # ES modules the sections import from static/vendor/ (uPlot): preloaded with the page.
    vendor_modules = sorted(
        p.name
        for p in (STATIC_DIR / "vendor").glob("*.js")
        if "esm" in p.name or p.suffix == ".mjs"
    )

    async def render_console(request: Request, principal: Principal) -> HTMLResponse:
        stats, job = await asyncio.gather(asyncio.to_thread(query_stats, engine), example.get())
        server_url = str(request.base_url).rstrip("/")
        user = {"name": principal.name, "role": principal.role}
        context = {
            "user": user,
            "server_url": server_url,
            "fleet_url": _fleet_url(settings, server_url),
            "home": str(settings.home),
            "example": job,
            "stats": stats,
            "version": __version__,
            "sections": SECTIONS,
            "vendor_modules": vendor_modules,
            "page_data": {
                "sections": [s["id"] for s in sections],
                "event_types": event_types,
                "user": user,
                "server_url": server_url,
                "version": __version__,
            },
        }
        html = templates.get_template("index.html").render(**context)
        return HTMLResponse(html, headers=_PAGE_HEADERS)

    async def signed_in(request: Request) -> Principal | str | None:
        """The caller's person Principal; a sentence when a credential came but is not one;
        None when none came."""
        try:
            found = _credential(request)
        except HTTPException as error:
            return str(error.detail)
        if found is None:
            return None
        token, via = found
        principal = await verify(request, token, via)  # 429 past the failures of its address
        if principal is None:
            return (
                "This browser's session is no longer valid (signed out, or its token was "
                "revoked): sign in again."
                if via == "cookie"
                else "That token is unknown or revoked."
            )
        if principal.role not in PERSON_ROLES:
            return f"A {principal.role} token cannot open the console: use a person's token."
        return principal

    @app.get("/", include_in_schema=False, response_model=None)
    async def console(request: Request, token: str | None = None) -> Response:
        if token is not None:
            return await login_exchange(request, token)
        who = await signed_in(request)
        if who is None:
            return signin_page()
        if isinstance(who, str):
            return signin_page(who, status=401, forget=SESSION_COOKIE in request.cookies)
        return await render_console(request, who)

    @app.post("/", include_in_schema=False, response_model=None)
    async def sign_in(request: Request) -> Response:
        """The sign-in form: a one-time login token (as `?token=` takes) or a person's API
        token. A cross-site form cannot sign a browser in (Origin must match Host)."""
        if not same_origin(request):
            return signin_page("Sign in from this page.", status=403)
        body = await request.body()
        if len(body) > FORM_MAX_BYTES:
            return signin_page("That is not a token.", status=400)
        values = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
        token = (values.get("token") or [""])[0].strip()
        if not token:
            return signin_page("Paste a token first.", status=400)
        # Not counted as a failure here: the one-time login exchange below counts it.
        principal = await verify(request, token, "form", spend=False)
        if principal is not None:
            if principal.role not in PERSON_ROLES:
                return signin_page(
                    f"A {principal.role} token cannot open the console: use a person's token.",
                    status=403,
                )
            log.info("console_sign_in", who=principal.name, token_id=principal.token_id)
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(
                SESSION_COOKIE,
                token,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path="/",
            )
            return response
        exchanged = await login_exchange(request, token)
        if exchanged.status_code in (303, 429):
            return exchanged
        return signin_page(
            "That token is not valid: it is unknown, revoked, or a login link already used "
            f"(on the server, `hpc-ds1 token login` prints a new one for {owner_name()}).",
            status=401,
        )

    app.mount("/static", _Static(directory=str(STATIC_DIR)), name="static")

    @app.get(
        "/v1/stream",
        tags=["events"],
        responses={
            **ERRORS_401_403,
            200: {
                "description": "Server-Sent Events: `id: <seq>`, `event: <type>`, `data: "
                "<envelope JSON>` per new event; a comment line every 15 s.",
                "content": {"text/event-stream": {}},
            },
            503: {"description": "Too many streams open on this gateway."},
        },
        response_class=StreamingResponse,
    )
    async def stream(request: Request, _: Viewer) -> StreamingResponse:
        """Every new event of the log, live, as Server-Sent Events (what /v1/events pages
        through, with the same fields left out). A client that falls QUEUE_FRAMES events behind
        is disconnected; EventSource reconnects by itself."""
        if len(hub.clients) >= MAX_STREAMS:
            raise HTTPException(503, f"{MAX_STREAMS} streams are open on this gateway; retry later")
        found = _credential(request)
        token = found[0] if found is not None else None
        return StreamingResponse(
            _stream(request, hub, engine, token),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def docs(_: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} — API",
            # Swagger UI 5 (OpenAPI 3.1), vendored: static/vendor/README.md says why and whence.
            swagger_js_url="/static/vendor/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url="/static/vendor/swagger-ui/swagger-ui.css",
            swagger_favicon_url="/static/favicon.svg",
            # No validator badge: it is an image from validator.swagger.io.
            swagger_ui_parameters={"validatorUrl": None},
        )

    # Added like FastAPI adds its own docs route (a plain route, outside the schema).
    app.add_route("/docs", docs, include_in_schema=False)
    return hub
