"""The console in the browser: the page at `/`, its static files, the live event stream and the
API docs, all served from files shipped in the package (no CDN: an air-gapped cluster gets the
same page).

- `GET /`: the console for a signed-in browser (session cookie, or a bearer header); with
  `?token=<one-time token>` the login exchange (auth.login_exchange) then back to `/`; otherwise
  a small sign-in page, which holds no data (with the site's OpenID provider configured, a
  "Sign in with ..." link to /auth/oidc/login: oidc.py). `POST /` (the sign-in form): a
  one-time login token or a person's own API token, traded for a console session of its own
  (edge/signins.py); the browser never keeps the token.
- `POST /signout`: ends the browser's session on the server (every replica) and forgets its
  cookie; a signed-out session is refused from then on. A session opened at the site's OpenID
  provider goes on to the provider's sign-out when it offers one (RP-Initiated Logout: oidc.py),
  which sends the browser back to `/?state=...`, the sign-in page.
- `GET /static/...`: the stylesheet, the shared client, the sections' modules, vendored files.
  No credential needed: they hold no data.
- `GET /v1/stream` (viewer): Server-Sent Events, one per new event of the log,
  `id: <seq>` / `event: <type>` / `data: <envelope JSON, redacted as /v1/events>`. One ordered
  JetStream consumer per gateway feeds every client through a bounded queue; a client that
  falls behind by QUEUE_FRAMES is dropped (its browser reconnects), never slowing the others.
- `GET /docs`: Swagger UI, vendored in static/vendor/swagger-ui (no CDN), started by
  static/docs.js rather than an inline script, so the page keeps the console's CSP.

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
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from sqlalchemy import Engine, func, select
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from hpc_ds1.console import SECTIONS, STATIC_DIR, TEMPLATES_DIR
from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import EVENT_TYPES
from hpc_ds1.log import get_logger
from hpc_ds1.security.credentials import owner_name, public_server
from hpc_ds1.security.tokens import PERSON_ROLES, Principal, lookup
from hpc_ds1.settings import Settings
from hpc_ds1.version import __version__

from ..api.audit import query_stats
from ..edge.auth import (
    SESSION_COOKIE,
    _credential,
    forget_session_cookie,
    login_exchange,
    open_session,
    require,
    same_origin,
    session_problem,
    sessions_of,
    verify,
)
from ..edge.middleware import CONSOLE_CSP
from ..edge.oidc import OidcClient
from ..schemas import ERRORS_401_403

log = get_logger("gateway.console")

KEEPALIVE_S = 15.0  # a comment line this often keeps proxies from closing an idle stream
QUEUE_FRAMES = 1000  # events a client may be behind before it is dropped
MAX_STREAMS = 1000  # concurrent /v1/stream clients per gateway; more get 503
FORM_MAX_BYTES = 4096
_EVENT_NAME = re.compile(r"^[a-z_]{1,32}\.[a-z_]{1,32}$")

# The console page may load nothing from elsewhere, and nothing may frame it (edge.py sets
# the same on every other response too).
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": CONSOLE_CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # edge.py says why not no-referrer
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
    request: Request, hub: StreamHub, engine: Engine, token: str | None, via: str | None = None
) -> AsyncIterator[bytes]:
    client = await hub.attach()
    try:
        # The first bytes say the subscription is in place: events from now on arrive.
        yield b"retry: 3000\n: connected\n\n"
        while True:
            try:
                frame = await asyncio.wait_for(client.queue.get(), KEEPALIVE_S)
            except TimeoutError:
                # A revoked token, or a session signed out or over, ends its stream within
                # KEEPALIVE_S (looked at, not extended: an open stream is no one's activity).
                if token is not None and not await asyncio.to_thread(_alive, request, token, via):
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


def _alive(request: Request, token: str, via: str | None) -> bool:
    """Whether a stream's credential still works. Blocking (DB)."""
    if via == "cookie":
        return not isinstance(sessions_of(request).check(token, touch=False), str)
    return lookup(request.app.state.auth.engine, token) is not None


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
        # Other machines get TLS where the browser on this one got plain HTTP (issue 45).
        return public_server(settings, parts.port)
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

    # The provider's name on the sign-in button: its host (the issuer's URL says no more).
    oidc_name = urlsplit(settings.oidc_issuer).netloc if settings.oidc_issuer else None

    def signin_page(
        request: Request,
        problem: str | None = None,
        status: int = 200,
        forget: bool = False,
        notice: str | None = None,
    ) -> HTMLResponse:
        html = templates.get_template("signin.html").render(
            problem=problem, notice=notice, oidc=oidc_name, version=__version__
        )
        response = HTMLResponse(html, status_code=status, headers=_PAGE_HEADERS)
        if forget:  # a session cookie that no longer works
            forget_session_cookie(request, response)
        return response

    app.state.signin_page = signin_page  # the OpenID callback answers with it too

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
                f"This browser's session is over: {session_problem(request)} Please sign in again."
                if via == "cookie"
                else "That token is unknown, revoked or expired."
            )
        if principal.role not in PERSON_ROLES:
            return f"A {principal.role} token cannot open the console: use a person's token."
        return principal

    def provider() -> OidcClient | None:
        client = getattr(app.state, "oidc", None)
        return client if isinstance(client, OidcClient) else None

    @app.get("/", include_in_schema=False, response_model=None)
    async def console(
        request: Request,
        token: str | None = None,
        signed_out: str | None = None,
        state: str | None = None,
    ) -> Response:
        if token is not None:
            return await login_exchange(request, token)
        who = await signed_in(request)
        if who is None:
            # Back from the provider's sign-out (its post_logout_redirect_uri) with our state.
            oidc = provider() if state else None
            back = (
                oidc is not None and state is not None and oidc.back_from_sign_out(request, state)
            )
            page = signin_page(request, notice="Signed out." if signed_out or back else None)
            if oidc is not None:
                oidc.forget_sign_out(request, page)
            return page
        if isinstance(who, str):
            return signin_page(request, who, status=401, forget=SESSION_COOKIE in request.cookies)
        return await render_console(request, who)

    @app.post("/", include_in_schema=False, response_model=None)
    async def sign_in(request: Request) -> Response:
        """The sign-in form: a one-time login token (as `?token=` takes) or a person's API
        token. A cross-site form cannot sign a browser in (Origin must match Host)."""
        if not same_origin(request):
            return signin_page(request, "Sign in from this page.", status=403)
        body = await request.body()
        if len(body) > FORM_MAX_BYTES:
            return signin_page(request, "That is not a token.", status=400)
        values = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
        token = (values.get("token") or [""])[0].strip()
        if not token:
            return signin_page(request, "Paste a token first.", status=400)
        # Not counted as a failure here: the one-time login exchange below counts it.
        principal = await verify(request, token, "form", spend=False)
        if principal is not None:
            if principal.role not in PERSON_ROLES:
                return signin_page(
                    request,
                    f"A {principal.role} token cannot open the console: use a person's token.",
                    status=403,
                )
            # A session of its own, tied to the token: revoking the token ends it too.
            response = RedirectResponse("/", status_code=303)
            await open_session(
                request,
                response,
                name=principal.name,
                role=principal.role,
                via="token",
                token_id=principal.token_id,
            )
            return response
        exchanged = await login_exchange(request, token)
        if exchanged.status_code in (303, 429):
            return exchanged
        return signin_page(
            request,
            "That token is not valid: it is unknown, revoked, expired, or a login link already "
            f"used (on the server, `hpc-ds1 token login` prints a new one for {owner_name()}).",
            status=401,
        )

    @app.post("/signout", include_in_schema=False, response_model=None)
    async def sign_out(request: Request) -> Response:
        """End this browser's session on the server, then the sign-in page. A cross-site form
        cannot sign a browser out either (Origin must match Host)."""
        if not same_origin(request):
            return signin_page(request, "Sign out from the console's page.", status=403)
        secret = request.cookies.get(SESSION_COOKIE)
        ended = await asyncio.to_thread(sessions_of(request).sign_out, secret) if secret else None
        response: Response | None = None
        if ended is not None:
            session, id_token = ended
            oidc = provider()
            # Signed in at the provider: on to its sign-out too (when it offers one).
            if session.via == "oidc" and id_token and oidc is not None:
                response = await oidc.sign_out(request, id_token)
            log.info(
                "console_signed_out",
                who=session.name,
                session_id=session.session_id,
                identity=session.identity,
                at_provider=response is not None,
            )
        if response is None:
            response = RedirectResponse("/?signed_out=1", status_code=303)
        forget_session_cookie(request, response)
        return response

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
        token, via = found if found is not None else (None, None)
        return StreamingResponse(
            _stream(request, hub, engine, token, via),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    docs_page = templates.get_template("docs.html").render(
        title=f"{app.title} — API", openapi_url=app.openapi_url or "/openapi.json"
    )

    async def docs(_: Request) -> HTMLResponse:
        # Swagger UI 5 (OpenAPI 3.1), vendored: static/vendor/README.md says why and whence.
        # FastAPI's own page starts it with an inline script, which the CSP refuses; this one
        # starts it from static/docs.js.
        return HTMLResponse(docs_page, headers=_PAGE_HEADERS)

    # Added like FastAPI adds its own docs route (a plain route, outside the schema).
    app.add_route("/docs", docs, include_in_schema=False)
    return hub
