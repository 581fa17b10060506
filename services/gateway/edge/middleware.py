"""What every request goes through before any route: a request id and one log line per request
(errors included), a JSON 500 without internals for anything unexpected, a body limit enforced
before parsing, and a refusal of control characters in the path or the query.

Pure ASGI middlewares (no BaseHTTPMiddleware), outermost first:
`RequestLog` -> `BodyLimit` -> the FastAPI app."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson
import structlog
from fastapi import HTTPException

from hpc_ds1.log import get_logger

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = get_logger("gateway")

_REQUEST_ID = re.compile(rb"^[A-Za-z0-9_\-]{1,64}$")
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value)
    return None


async def send_json(
    send: Send,
    status: int,
    body: dict[str, Any],
    headers: list[tuple[bytes, bytes]] = (),  # type: ignore[assignment]
) -> None:
    payload = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class RequestLog:
    """Gives every request an id (the caller's `x-request-id` when it is 1-64 letters, digits,
    '_' or '-'; else a new one), puts it on the response, logs one line per request with its
    status, and turns an unhandled exception into a JSON 500 naming only the request id. A
    failed authentication the auth log counts instead of logging it (`request.state.unlogged`,
    under a flood) gets no line here either."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"x-request-id")
        rid = (
            given.decode()
            if given is not None and _REQUEST_ID.match(given)
            else uuid.uuid4().hex[:16]
        )
        started = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"x-request-id"]
                message["headers"] = [*headers, (b"x-request-id", rid.encode())]
            await send(message)

        structlog.contextvars.bind_contextvars(request_id=rid)
        error: BaseException | None = None
        try:
            await self.app(scope, receive, send_with_id)
        except Exception as caught:
            error = caught
            if status == 0:
                await send_json(
                    send_with_id,
                    500,
                    {
                        "error": f"internal error: the gateway's log names it by request id {rid}",
                        "request_id": rid,
                    },
                )
        finally:
            structlog.contextvars.unbind_contextvars("request_id")
            fields: dict[str, Any] = {
                "request_id": rid,
                "method": scope.get("method"),
                "path": scope.get("path"),
                "status": status or 500,
                "ms": round((time.perf_counter() - started) * 1000, 2),
            }
            if error is not None:
                fields["error"] = f"{type(error).__name__}: {error}"[:500]
                log.error("request", **fields)
            elif not (scope.get("state") or {}).get("unlogged"):
                log.info("request", **fields)


class BodyLimit:
    """Refuses, before anything parses it, a body over `max_bytes`: at once when Content-Length
    says so, or as soon as a chunked body passes the limit (413 either way). Also refuses a
    path or query with control characters (422): they never reach a route, a query or a
    subject. `exempt` gives paths their own limit (a model upload: settings.max_model_bytes)."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, exempt: Mapping[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = dict(exempt or {})

    def _too_large(self, limit: int) -> dict[str, Any]:
        setting = (
            "setting HPC_DS1_MAX_BODY_BYTES" if limit == self.max_bytes else "this path's own limit"
        )
        return {
            "error": f"the request body is larger than the {limit} bytes the gateway "
            f"accepts ({setting})"
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_path = scope.get("raw_path") or scope.get("path", "").encode()
        query = scope.get("query_string", b"")
        if _CONTROL.search(unquote_to_bytes(raw_path)) or _CONTROL.search(
            unquote_to_bytes(query.replace(b"+", b" "))
        ):
            await send_json(
                send,
                422,
                {
                    "error": "the path or the query holds a NUL or another control character; "
                    "ids, names and filters are printable text"
                },
            )
            return
        limit = self.exempt.get(scope.get("path", ""), self.max_bytes)
        length = _header(scope, b"content-length")
        if length is not None:
            if not length.strip().isdigit():
                await send_json(send, 400, {"error": "Content-Length must be a whole number"})
                return
            if int(length) > limit:
                await send_json(send, 413, self._too_large(limit))
                return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(self._too_large(limit)["error"])
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if started:
                raise
            await send_json(send, 413, self._too_large(limit))


class _TooLarge(HTTPException):
    """Raised from `receive`: FastAPI passes an HTTPException from body parsing on as it is."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


# --- headers on every response (issue 45) ----------------------------------------------------

# Nothing from elsewhere, nothing inline but styles (Swagger UI and uPlot set style attributes),
# no framing: the console's pages and /docs (started by static/docs.js, no inline script) work
# under it, and a JSON answer opened in a browser can run nothing.
CONSOLE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONSOLE_CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    # same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with the
    # console's own form POSTs (sign-in, sign-out), which the CSRF rule then refuses; another
    # site still gets no referrer.
    (b"referrer-policy", b"same-origin"),
)
_SECURITY_NAMES = frozenset(name for name, _ in SECURITY_HEADERS)


class SecurityHeaders:
    """CSP, frame, type-sniffing and referrer headers on every HTTP response, errors and 429s
    included; a route's own value of one of them (the console's pages) is kept. Outermost, so
    nothing answers without them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {bytes(name).lower() for name, _ in headers} & _SECURITY_NAMES
                headers.extend(pair for pair in SECURITY_HEADERS if pair[0] not in present)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
