"""The console as the gateway serves it, without a browser: the sign-in page, the page's
sections in the seed's order, its static files, /docs from local assets, and the live stream
(/v1/stream) on the real event stream with its redaction, roles and bounded client queues."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine

from hpc_ds1.console import SECTIONS
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import DeviceRegistered, TokenCreated, envelope
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.gateway.edge.auth import SESSION_COOKIE
from hpc_ds1.settings import Settings
from tests.support.gateway import ROLE_TOKENS, as_role, fold, role_token_events


def cookie(value: str) -> dict[str, str]:
    return {"Cookie": f"{SESSION_COOKIE}={value}"}


async def session_of(http: httpx.AsyncClient, role: str) -> dict[str, str]:
    """A console session of `role`'s token (the sign-in form), as a Cookie header: the cookie
    holds a session of its own, never the token."""
    reply = await http.post(
        "/", data={"token": ROLE_TOKENS[role]}, headers={"Origin": str(http.base_url).rstrip("/")}
    )
    assert reply.status_code == 303, reply.text
    value = reply.cookies[SESSION_COOKIE]
    assert value != ROLE_TOKENS[role]
    http.cookies.clear()
    return cookie(value)


@pytest.fixture
async def app(settings: Settings, bus: EventBus, engine: Engine) -> AsyncIterator[FastAPI]:
    await fold(settings, bus, engine, *role_token_events())
    app = create_app(settings, bus, engine)
    yield app
    await app.state.stream_hub.close()


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield client


async def test_without_a_credential_root_is_the_sign_in_page_with_no_data(
    http: httpx.AsyncClient,
) -> None:
    page = await http.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert 'name="token"' in html and "hpc-ds1 token login" in html
    assert 'action="/"' in html and 'method="post"' in html
    # No section, no figure, no page data.
    assert "console-data" not in html and 'id="facility"' not in html
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]

    stale = await http.get("/", headers=cookie("hds1_" + "x" * 43))
    assert stale.status_code == 401 and "sign in again" in stale.text
    agent = await http.get("/", headers=as_role("agent"))
    assert agent.status_code == 401 and "cannot open the console" in agent.text


async def test_signed_in_root_lists_the_nine_sections_in_the_seed_order(
    http: httpx.AsyncClient,
) -> None:
    page = await http.get("/", headers=await session_of(http, "viewer"))
    assert page.status_code == 200, page.text
    html = page.text
    ids = re.findall(r'<section id="([a-z]+)" aria-labelledby="\1-title"', html)
    assert ids == [sid for _, sid, _ in SECTIONS]
    assert ids == [
        "facility",
        "playground",
        "fleet",
        "approvals",
        "sessions",
        "decisions",
        "machine",
        "evaluation",
        "snippets",
    ]
    data = re.search(r'<script type="application/json" id="console-data">(.*?)</script>', html)
    assert data, html[:2000]
    page_data = orjson.loads(data.group(1))
    assert page_data["user"] == {"name": "viewer", "role": "viewer"}
    assert page_data["sections"] == ids
    assert "token.created" in page_data["event_types"]
    assert page_data["server_url"] == "http://gw"
    assert '<script type="module" src="/static/console.js">' in html
    # The same page for a bearer (a script, a proxy that adds the header).
    assert (await http.get("/", headers=as_role("admin"))).status_code == 200


async def test_the_sign_in_form_takes_a_person_token_and_refuses_cross_site_posts(
    http: httpx.AsyncClient,
) -> None:
    form = {"token": ROLE_TOKENS["engineer"]}
    cross = await http.post("/", data=form, headers={"Origin": "http://evil.example"})
    # Neither signed in nor signed out by another site's form.
    assert cross.status_code == 403 and "set-cookie" not in cross.headers
    ok = await http.post("/", data=form, headers={"Origin": "http://gw"})
    assert ok.status_code == 303 and ok.headers["location"] == "/"
    cookie = ok.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=") and "httponly" in cookie.lower()
    assert "samesite=strict" in cookie.lower()
    me = await http.get("/v1/whoami")
    assert me.json()["role"] == "engineer" and me.json()["via"] == "cookie"

    wrong = await http.post(
        "/", data={"token": "hds1_" + "y" * 43}, headers={"Origin": "http://gw"}
    )
    assert wrong.status_code == 401 and "not valid" in wrong.text
    agent = await http.post(
        "/", data={"token": ROLE_TOKENS["agent"]}, headers={"Origin": "http://gw"}
    )
    assert agent.status_code == 403 and "cannot open the console" in agent.text


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/static/console.js", "javascript"),
        ("/static/console.css", "text/css"),
        ("/static/favicon.svg", "image/svg+xml"),
        ("/static/sections/facility.js", "javascript"),
        ("/static/vendor/swagger-ui/swagger-ui-bundle.js", "javascript"),
        ("/static/vendor/swagger-ui/swagger-ui.css", "text/css"),
    ],
)
async def test_static_files_are_served_without_a_credential_with_their_types(
    http: httpx.AsyncClient, path: str, kind: str
) -> None:
    reply = await http.get(path)
    assert reply.status_code == 200, path
    assert kind in reply.headers["content-type"], reply.headers["content-type"]
    assert len(reply.content) > 100
    assert (await http.get("/static/../app.py")).status_code == 404


async def test_docs_load_their_assets_from_this_server(http: httpx.AsyncClient) -> None:
    docs = await http.get("/docs")
    assert docs.status_code == 200
    html = docs.text
    assets = re.findall(r'(?:src|href)="([^"]+)"', html) + re.findall(
        r"(?:url|src):\s*['\"]([^'\"]+)['\"]", html
    )
    assert "/static/vendor/swagger-ui/swagger-ui-bundle.js" in assets, html
    assert "/static/vendor/swagger-ui/swagger-ui.css" in assets, html
    for url in assets:
        assert not url.startswith(("http:", "https:", "//")), url
        assert "cdn" not in url.lower(), url
    assert "'/openapi.json'" in html or '"/openapi.json"' in html
    spec = (await http.get("/openapi.json")).json()
    # FastAPI writes OpenAPI 3.1, which Swagger UI renders from 5.0 on (its oas31 plugin);
    # 4.x shows "Unable to render this definition".
    assert spec["openapi"].startswith("3.1")
    bundle = (await http.get("/static/vendor/swagger-ui/swagger-ui-bundle.js")).text
    assert "oas31" in bundle
    assert (await http.get("/redoc")).status_code == 404


# --- the live stream ----------------------------------------------------------------------


async def _serve(app: FastAPI) -> AsyncIterator[str]:
    """The app on a real loopback socket (uvicorn): streaming needs real TCP back-pressure."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(1500):
        if server.started:
            break
        await asyncio.sleep(0.02)
    assert server.started, "uvicorn did not start within 30 s"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
        sock.close()


@pytest.fixture
async def base(app: FastAPI) -> AsyncIterator[str]:
    async for url in _serve(app):
        yield url


class Stream:
    """One /v1/stream client reading frames into a list."""

    def __init__(self, http: httpx.AsyncClient, headers: dict[str, str]) -> None:
        self.http = http
        self.headers = headers
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.connected = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with self.http.stream("GET", "/v1/stream", headers=self.headers) as reply:
            assert reply.status_code == 200, await reply.aread()
            assert reply.headers["content-type"].startswith("text/event-stream")
            buffer = ""
            async for chunk in reply.aiter_text():
                buffer += chunk
                while "\n\n" in buffer:
                    block, buffer = buffer.split("\n\n", 1)
                    if ": connected" in block:
                        self.connected.set()
                    fields = dict(
                        line.split(": ", 1) for line in block.splitlines() if ": " in line
                    )
                    if "event" in fields:
                        self.events.append((fields["event"], orjson.loads(fields["data"])))

    async def start(self) -> Stream:
        self.task = asyncio.create_task(self._run())
        await asyncio.wait_for(self.connected.wait(), 10)
        return self

    async def wait_for(self, kind: str, within_s: float = 10) -> dict[str, Any]:
        async with asyncio.timeout(within_s):
            while True:
                for name, env in self.events:
                    if name == kind:
                        return env
                if self.task is not None and self.task.done():
                    self.task.result()
                await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


async def test_a_published_event_arrives_on_the_stream_redacted(base: str, bus: EventBus) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        stream = await Stream(http, as_role("viewer")).start()
        try:
            created = TokenCreated(
                token_id="tok_streamed", holder="sam", role="viewer", sha256="ab" * 32
            )
            seq = await bus.publish(envelope(created, actor="t", source="test", prefix=bus.prefix))
            env = await stream.wait_for("token.created")
            assert env["seq"] == seq and env["type"] == "token.created"
            assert env["data"]["token_id"] == "tok_streamed" and env["data"]["holder"] == "sam"
            assert "sha256" not in env["data"]
            assert "ab" * 32 not in orjson.dumps(env).decode()
        finally:
            await stream.stop()


async def test_the_stream_needs_a_viewer_token(base: str) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        assert (await http.get("/v1/stream")).status_code == 401
        stale = await http.get("/v1/stream", headers={"Authorization": "Bearer hds1_" + "z" * 43})
        assert stale.status_code == 401
        assert (await http.get("/v1/stream", headers=as_role("agent"))).status_code == 403
        # A browser's cookie is a credential too.
        viewer = await session_of(http, "viewer")
        async with http.stream("GET", "/v1/stream", headers=viewer) as reply:
            assert reply.status_code == 200


async def test_a_client_that_goes_away_is_forgotten(base: str, app: FastAPI) -> None:
    hub = app.state.stream_hub
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        streams = [await Stream(http, as_role("viewer")).start() for _ in range(3)]
        assert len(hub.clients) == 3
        for stream in streams:
            await stream.stop()
    for _ in range(200):
        if not hub.clients:
            break
        await asyncio.sleep(0.05)
    assert hub.clients == set()


async def _stalled_stream(app: FastAPI, token: str, first_bytes: asyncio.Event) -> None:
    """A /v1/stream client that takes the first bytes and then never takes another: its `send`
    blocks, as uvicorn's does for a peer that stopped reading once the socket buffers are full
    (a kernel absorbs ~2 MB first on loopback, which would make this test slow, not different)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/stream",
        "raw_path": b"/v1/stream",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"gw"), (b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            if first_bytes.is_set():
                await never.wait()
            first_bytes.set()

    await app(scope, receive, send)


async def test_a_stalled_client_is_dropped_and_does_not_hold_up_a_hundred_others(
    base: str, app: FastAPI, bus: EventBus
) -> None:
    hub = app.state.stream_hub
    hub.queue_frames = 60  # a small bound, so the stalled client overflows it soon
    started = asyncio.Event()
    stalled = asyncio.create_task(_stalled_stream(app, ROLE_TOKENS["viewer"], started))
    await asyncio.wait_for(started.wait(), 10)

    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:
        streams = [Stream(http, as_role("viewer")) for _ in range(100)]
        await asyncio.gather(*(s.start() for s in streams))
        try:
            assert len(hub.clients) == 101
            sequences: list[int] = []
            # Batches smaller than the bound: a reader that keeps up is never behind by it;
            # the stalled one falls behind by one more batch each time.
            for batch in range(5):
                events = [
                    envelope(
                        DeviceRegistered(device_id=f"dev-{batch}-{i}", hostname=f"h{i}"),
                        actor="t",
                        source="test",
                        prefix=bus.prefix,
                    )
                    for i in range(40)
                ]
                sequences += await bus.publish_many(events)
                last = sequences[-1]

                async def caught_up(stream: Stream, last: int = last) -> None:
                    for _ in range(600):
                        if stream.events and stream.events[-1][1]["seq"] >= last:
                            return
                        await asyncio.sleep(0.05)
                    raise AssertionError(f"a reader got {len(stream.events)} events in 30 s")

                await asyncio.gather(*(caught_up(s) for s in streams))
            for s in streams:
                assert [env["seq"] for _, env in s.events] == sequences  # all, in order
            # The stalled client overflowed its queue and was dropped; no reader was.
            assert hub.dropped == 1 and len(hub.clients) == 100
            assert not stalled.done()  # still stuck in its send: it held nobody up
        finally:
            await asyncio.gather(*(s.stop() for s in streams))
            stalled.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stalled
