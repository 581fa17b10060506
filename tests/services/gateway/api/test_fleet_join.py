"""Joining the fleet on real NATS and Postgres with a real projector: the join token traded for a
device credential that acts only as its device, refused when wrong, revoked or rotated, and past
its uses or its expiry (saying which; concurrent joins on two gateways never pass its cap); the
join token shown only to an admin on loopback, in no event and no log line; device and join
tokens refused on every user endpoint; `hpc-ds1 token join [--rotate]`."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from fastapi.routing import APIRoute
from sqlalchemy import Engine, select

from hpc_ds1 import log as hpc_log
from hpc_ds1.cli import main
from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import TokenCreated, TokenRevoked, envelope
from hpc_ds1.infra.ports import free_port
from hpc_ds1.security.credentials import (
    JOIN_HOLDER,
    join_token_id,
    join_token_path,
    read_join_token,
    register_join_token,
    rotate_join_token,
    token_limits,
    token_state,
)
from hpc_ds1.security.tokens import Principal, lookup, new_token, token_hash
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.gateway.api import fleet as fleet_api
from hpc_ds1.services.gateway.edge.ratelimit import is_loopback
from hpc_ds1.settings import Settings
from tests.support.commands import HPC_DS1, hpc
from tests.support.gateway import ROLE_TOKENS
from tests.support.serving import cli_headers, start_serve, stop, wait_ready

from ..fleet_fixtures import (
    FINGERPRINT,
    Fleet,
    as_role,
    bearer,
    fleet,
    keep_logging,
    projector,
)

__all__ = ["fleet", "keep_logging", "projector"]


async def revoke(bus: EventBus, engine: Engine, token_id: str, token: str) -> None:
    event = TokenRevoked(token_id=token_id)
    await bus.publish(envelope(event, actor="admin", source="test", prefix=bus.prefix))
    for _ in range(400):
        if token_state(engine, token) == "revoked":
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the revocation was not projected")


async def limited_join_token(
    fleet: Fleet,
    *,
    uses: int | None = None,
    expires_at: datetime | None = None,
    token: str | None = None,
) -> str:
    """A join token registered with these limits (a new one, or `token`), once projected."""
    token = token or new_token()
    event = TokenCreated(
        token_id=join_token_id(token),
        holder=JOIN_HOLDER,
        role="join",
        sha256=token_hash(token),
        expires_at=expires_at,
        max_uses=uses,
    )
    await fleet.bus.publish(envelope(event, actor="admin", source="test", prefix=fleet.bus.prefix))
    for _ in range(400):
        if token_limits(fleet.engine, token) is not None:
            return token
        await asyncio.sleep(0.05)
    raise AssertionError("the join token was not projected")


async def token_events(bus: EventBus, token: str) -> list[tuple[str, dict[str, Any]]]:
    return [(env.type, env.data) for _, env in await bus.history("token", join_token_id(token))]


async def projected_uses(engine: Engine, token: str, expected: int) -> int:
    for _ in range(400):
        limits = token_limits(engine, token)
        if limits is not None and limits.uses >= expected:
            return limits.uses
        await asyncio.sleep(0.05)
    raise AssertionError(f"uses never reached {expected}: {token_limits(engine, token)}")


def device_row(engine: Engine, device_id: str) -> Any:
    d = tables.devices
    with engine.connect() as conn:
        return conn.execute(select(d).where(d.c.device_id == device_id)).mappings().first()


async def test_a_device_joins_once_and_its_credential_acts_as_that_device(fleet: Fleet) -> None:
    joined = await fleet.join(name="dev-a")
    assert joined.status_code == 201, joined.text
    answer = joined.json()
    assert answer["device_id"] == "dev-a" and answer["active"] is True
    assert answer["heartbeat_interval_s"] == fleet.settings.heartbeat_interval_s
    assert answer["long_poll_s"] == fleet.settings.long_poll_s
    token = answer["token"]
    assert token != fleet.join_token
    # The very next call authenticates, as the device and nothing else.
    me = await fleet.http.get("/v1/whoami", headers=bearer(token))
    assert me.status_code == 200
    assert me.json() | {"via": None} == {
        "name": "dev-a",
        "role": "agent",
        "token_id": answer["token_id"],
        "via": None,
    }
    row = device_row(fleet.engine, "dev-a")
    assert row["local"] is False and row["hostname"] == "node-7.lab"
    assert row["fingerprint"]["device_id"] == "dev-a"
    assert row["fingerprint"]["cpu_model"] == FINGERPRINT["cpu_model"]
    history = [env for _, env in await fleet.bus.history("device", "dev-a")]
    assert [(e.type, e.actor) for e in history] == [("device.registered", "dev-a")]

    # A name that is taken (a device, or any token holder such as a person) is not given again.
    again = await fleet.join(name="dev-a")
    assert again.status_code == 409 and "acts only as itself" in again.json()["error"]
    person = await fleet.join(name="admin")
    assert person.status_code == 409 and "holds a token" in person.json()["error"]
    assert len(await fleet.bus.history("device", "dev-a")) == 1

    # Without a name the id comes from the host name.
    unnamed = await fleet.join(hostname="Node_7.lab.example")
    assert unnamed.status_code == 201
    assert re.fullmatch(r"Node_7-lab-example-[0-9a-f]{6}", unnamed.json()["device_id"])

    # Other credentials cannot join: a device token, an admin token.
    body = {"hostname": "x", "fingerprint": FINGERPRINT}
    for headers in (bearer(token), as_role("admin")):
        refused = await fleet.http.post("/v1/fleet/join", json=body, headers=headers)
        assert refused.status_code == 403, refused.text

    # A revoked device credential is refused at once.
    await revoke(fleet.bus, fleet.engine, answer["token_id"], token)
    gone = await fleet.http.get("/v1/whoami", headers=bearer(token))
    assert gone.status_code == 401


async def test_wrong_revoked_and_rotated_join_tokens_and_bad_bodies_are_refused(
    fleet: Fleet,
) -> None:
    body = {"hostname": "node-1", "fingerprint": FINGERPRINT}
    none = await fleet.http.post("/v1/fleet/join", json=body)
    wrong = await fleet.http.post("/v1/fleet/join", json=body, headers=bearer("hds1_" + "x" * 43))
    assert (none.status_code, wrong.status_code) == (401, 401)

    bad: list[dict[str, Any]] = [
        {"hostname": "has space", "fingerprint": FINGERPRINT},
        {"hostname": "h" * 254, "fingerprint": FINGERPRINT},
        {"hostname": "node", "fingerprint": FINGERPRINT, "name": "a.b"},
        {"hostname": "node", "fingerprint": FINGERPRINT, "name": "x" * 65},
        {"hostname": "node", "fingerprint": {**FINGERPRINT, "simd": ["avx"] * 65}},
        {"hostname": "node", "fingerprint": {**FINGERPRINT, "cpu_model": "c" * 300}},
        {"hostname": "node", "fingerprint": {**FINGERPRINT, "cpu_model": "a\x00b"}},
        {"hostname": "node", "fingerprint": {**FINGERPRINT, "logical_cpus": -1}},
        {"hostname": "node", "fingerprint": {k: v for k, v in FINGERPRINT.items() if k != "simd"}},
        {"hostname": "node"},
        {"hostname": "node", "fingerprint": FINGERPRINT, "device_id": "dev-z"},
    ]
    for sent in bad:
        reply = await fleet.http.post("/v1/fleet/join", json=sent, headers=bearer(fleet.join_token))
        assert reply.status_code == 422, (sent.keys(), reply.text)
        assert "c" * 300 not in reply.text
    with fleet.engine.connect() as conn:
        assert conn.execute(select(tables.devices)).first() is None

    # Revoked: refused; the next start of the gateway makes and registers a new one.
    old = fleet.join_token
    await revoke(fleet.bus, fleet.engine, join_token_id(old), old)
    assert (await fleet.join(name="dev-r")).status_code == 401
    assert await register_join_token(fleet.bus, fleet.engine, fleet.settings.home, wait_s=30)
    new = read_join_token(fleet.settings.home)
    assert new is not None and new != old
    assert lookup(fleet.engine, new) == Principal(JOIN_HOLDER, "join", join_token_id(new))
    fleet.join_token = new
    assert (await fleet.join(name="dev-r")).status_code == 201
    rejoin_with_old = await fleet.http.post(
        "/v1/fleet/join", json={**body, "name": "dev-s"}, headers=bearer(old)
    )
    assert rejoin_with_old.status_code == 401


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    saved = structlog.get_config()
    sink = io.StringIO()
    hpc_log.configure("debug", json=True)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sink))
    try:
        yield sink
    finally:
        structlog.configure(**saved)


async def test_the_join_token_is_shown_only_to_an_admin_on_loopback_and_never_logged(
    settings: Settings, fleet: Fleet, log_lines: io.StringIO
) -> None:
    shown = await fleet.http.get("/v1/fleet/join-token", headers=as_role("admin"))
    assert shown.status_code == 200, shown.text
    assert shown.headers["cache-control"] == "no-store"
    answer = shown.json()
    assert answer["token"] == fleet.join_token
    assert (
        answer["command"] == f"hpc-ds1 agent --server {answer['server']} --token {fleet.join_token}"
    )
    for role in ("viewer", "engineer", "agent"):
        refused = await fleet.http.get("/v1/fleet/join-token", headers=as_role(role))
        assert refused.status_code == 403, role
    assert (await fleet.http.get("/v1/fleet/join-token")).status_code == 401
    for client, allowed in ((("10.0.0.5", 4000), False), (("::1", 4000), True)):
        transport = httpx.ASGITransport(app=fleet.app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as remote:
            reply = await remote.get("/v1/fleet/join-token", headers=as_role("admin"))
        assert reply.status_code == (200 if allowed else 403), (client, reply.text)
        assert (fleet.join_token in reply.text) is allowed

    joined = await fleet.join(name="dev-log")
    assert joined.status_code == 201
    device_token = joined.json()["token"]
    events = await fleet.http.get("/v1/events?limit=1000", headers=as_role("admin"))
    assert events.status_code == 200 and "dev-log" in events.text

    # In no event of the stream (only the hashes, which the events API does not serve) ...
    stored = b"".join(raw.data for chunk in [c async for c in fleet.bus.replay()] for raw in chunk)
    assert b"token.created" in stored and b"dev-log" in stored
    for secret in (fleet.join_token, device_token):
        assert secret.encode() not in stored
        assert token_hash(secret) not in events.text
        assert secret not in events.text
    # ... and in no log line, though the join and the showing are logged (by public id).
    text = log_lines.getvalue()
    records = [json.loads(line) for line in text.splitlines()]
    assert any(r.get("event") == "device_joined" and r["device_id"] == "dev-log" for r in records)
    assert any(r.get("event") == "join_token_shown" for r in records)
    assert any(r.get("event") == "join_token_refused" for r in records)
    for secret in (fleet.join_token, device_token, *ROLE_TOKENS.values()):
        assert secret not in text


def test_is_loopback() -> None:
    for host in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"):
        assert is_loopback(host), host
    for host in ("10.0.0.1", "::ffff:10.0.0.1", "0.0.0.0", "::", "localhost", "", None, "x"):
        assert not is_loopback(host), host


def user_routes(app: Any) -> list[tuple[str, str]]:
    """Every (method, path) of the app that is not for agents, health or the login exchange."""
    found: list[tuple[str, str]] = []

    def walk(routes: list[Any]) -> None:
        for route in routes:
            if hasattr(route, "original_router"):
                walk(route.original_router.routes)
            elif isinstance(route, APIRoute):
                found.extend((m, route.path) for m in sorted(route.methods))
            elif hasattr(route, "routes"):
                walk(route.routes)

    walk(app.routes)
    open_paths = {"/", "/healthz", "/readyz", "/v1/whoami", "/v1/fleet/join"}
    return [
        (m, p)
        for m, p in found
        if p not in open_paths and not p.startswith("/v1/agent/") and m != "HEAD"
    ]


async def test_device_and_join_tokens_reach_no_user_endpoint(fleet: Fleet) -> None:
    joined = await fleet.join(name="dev-u")
    device_token = joined.json()["token"]
    routes = user_routes(fleet.app)
    paths = {p for _, p in routes}
    assert {"/v1/devices", "/v1/devices/{device_id}/revoke", "/v1/fleet/join-token"} <= paths
    assert "/v1/events" in paths and "/v1/decide" in paths
    decide = {
        "workload": "gemm",
        "size": 64,
        "config": {"ranks": 1, "threads": 1},
        "telemetry": {"runtime_s": 1.0},
    }
    for token in (device_token, fleet.join_token):
        for method, path in routes:
            url = re.sub(r"\{[^}]+\}", "x1", path)
            body = decide if path == "/v1/decide" else None
            reply = await fleet.http.request(method, url, json=body, headers=bearer(token))
            assert reply.status_code == 403, (method, path, reply.status_code, reply.text)
    # What an admin may do with the same requests is not refused for its role.
    assert (await fleet.http.get("/v1/devices", headers=as_role("admin"))).status_code == 200


async def test_token_join_prints_and_rotates_the_join_token(
    settings: Settings,
    bus: EventBus,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    keep_logging: None,
) -> None:
    home = ("--home", str(settings.home))
    assert main(["token", "join", *home]) == 2
    assert "no join token yet" in capsys.readouterr().err

    first = await hpc(settings, "token", "join", "--rotate")
    assert first.returncode == 0, first.stderr
    token_a = first.stdout.splitlines()[0]
    path = join_token_path(settings.home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_join_token(settings.home) == token_a
    assert lookup(engine, token_a) == Principal(JOIN_HOLDER, "join", join_token_id(token_a))
    assert f"--token {token_a}" in first.stdout.splitlines()[1]
    assert "none was active" in first.stderr

    assert main(["token", "join", *home]) == 0
    shown = capsys.readouterr()
    lines = shown.out.splitlines()
    assert lines[0] == token_a
    assert re.fullmatch(rf"Join +hpc-ds1 agent --server http://\S+ --token {token_a}", lines[1])

    second = await hpc(settings, "token", "join", "--rotate")
    assert second.returncode == 0, second.stderr
    token_b = second.stdout.splitlines()[0]
    assert token_b != token_a and read_join_token(settings.home) == token_b
    assert join_token_id(token_a) in second.stderr
    assert lookup(engine, token_a) is None
    assert lookup(engine, token_b) == Principal(JOIN_HOLDER, "join", join_token_id(token_b))
    for output in (first.stdout + first.stderr, shown.out + shown.err, second.stdout):
        assert token_hash(token_a) not in output


def cli_process_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    return {**env, "HPC_DS1_HOME": str(home)}


def test_serve_logs_no_join_token_and_the_gateway_registers_it(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    home = tmp_path / "home"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tag = os.urandom(4).hex()
    env = {
        "HPC_DS1_NATS_URL": nats_url,
        "HPC_DS1_DATABASE_URL": database_url,
        "HPC_DS1_STREAM": f"JOIN_{tag}",
        "HPC_DS1_SUBJECT_PREFIX": f"join{tag}",
    }
    process = start_serve(home, port, **env)
    try:
        wait_ready(url, process)
        token = read_join_token(home)
        assert token is not None
        assert stat.S_IMODE(join_token_path(home).stat().st_mode) == 0o600
        admin = cli_headers(home)
        for _ in range(100):  # the gateway registers it just after it starts listening
            me = httpx.get(f"{url}/v1/whoami", headers=bearer(token))
            if me.status_code == 200:
                break
            time.sleep(0.1)
        assert me.json()["name"] == JOIN_HOLDER and me.json()["role"] == "join"
        shown = httpx.get(f"{url}/v1/fleet/join-token", headers=admin)
        assert shown.status_code == 200 and shown.json()["token"] == token
        assert shown.json()["server"] == url
        # `hpc-ds1 token join` beside a running serve: the file, and the server's address.
        cli = subprocess.run(
            [HPC_DS1, "token", "join"],
            env={**cli_process_env(home), **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
        assert cli.stdout.splitlines() == [token, f"Join      {shown.json()['command']}"]
    finally:
        output = stop(process, signal.SIGINT)
    # Its stdout is no terminal (a pipe): the join token is not printed, nor logged.
    join = [line for line in output.splitlines() if line.startswith("  Join      ")]
    assert join == ["  Join      `hpc-ds1 token join` prints the command that joins a device"]
    assert token not in output


async def test_a_join_token_admits_its_uses_and_then_says_it_is_spent(fleet: Fleet) -> None:
    fleet.join_token = await limited_join_token(fleet, uses=2)
    first = await fleet.join(name="dev-1")
    # A name that is taken costs no use.
    assert (await fleet.join(name="dev-1")).status_code == 409
    second = await fleet.join(name="dev-2")
    assert (first.status_code, second.status_code) == (201, 201), (first.text, second.text)

    third = await fleet.join(name="dev-3")
    assert third.status_code == 401, third.text
    said = third.json()["error"]
    token_id = join_token_id(fleet.join_token)
    assert f"the join token {token_id} was used 2 of 2 times" in said
    assert "hpc-ds1 token join --rotate" in said
    assert third.headers["www-authenticate"] == "Bearer"
    assert device_row(fleet.engine, "dev-3") is None
    # Each use is a fact of the log, appended before its device was registered.
    events = await token_events(fleet.bus, fleet.join_token)
    assert [(t, d.get("device_id")) for t, d in events] == [
        ("token.created", None),
        ("token.used", "dev-1"),
        ("token.used", "dev-2"),
    ]
    history = await fleet.bus.history("token", token_id)
    used = {env.data["device_id"]: env for _, env in history if env.type == "token.used"}
    for device in ("dev-1", "dev-2"):
        registered = (await fleet.bus.history("device", device))[0][1]
        assert registered.causation_id == used[device].id
    assert await projected_uses(fleet.engine, fleet.join_token, 2) == 2
    limits = token_limits(fleet.engine, fleet.join_token)
    assert limits is not None and (limits.max_uses, limits.uses_left) == (2, 0)


async def test_concurrent_joins_on_two_gateways_never_pass_the_cap(
    settings: Settings, fleet: Fleet
) -> None:
    """Five joins at once with a token of two uses, on two gateways (each its own connection
    to NATS, as replicas have): exactly two devices join; the others are told it is spent."""
    assert settings.nats_url
    fleet.join_token = await limited_join_token(fleet, uses=2)
    other_bus = await EventBus.connect(settings, settings.nats_url, "test-replica")
    try:
        replica = create_app(settings, other_bus, fleet.engine)
        transport = httpx.ASGITransport(app=replica)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as other:

            async def join(i: int) -> httpx.Response:
                http = fleet.http if i % 2 else other
                body = {"hostname": "node", "fingerprint": FINGERPRINT, "name": f"dev-c{i}"}
                return await http.post(
                    "/v1/fleet/join", json=body, headers=bearer(fleet.join_token)
                )

            replies = await asyncio.gather(*(join(i) for i in range(5)))
    finally:
        await other_bus.close()
    codes = sorted(r.status_code for r in replies)
    assert codes == [201, 201, 401, 401, 401], [r.text for r in replies]
    for reply in replies:
        if reply.status_code == 401:
            assert "was used 2 of 2 times" in reply.json()["error"]
    joined = {r.json()["device_id"] for r in replies if r.status_code == 201}
    events = await token_events(fleet.bus, fleet.join_token)
    assert sorted(d["device_id"] for t, d in events if t == "token.used") == sorted(joined)
    with fleet.engine.connect() as conn:
        devices = {r.device_id for r in conn.execute(select(tables.devices.c.device_id))}
    assert {d for d in devices if d.startswith("dev-c")} <= joined
    assert await projected_uses(fleet.engine, fleet.join_token, 2) == 2


async def test_an_expired_join_token_is_refused_saying_when(fleet: Fleet) -> None:
    past = datetime.now(UTC) - timedelta(minutes=5)
    fleet.join_token = await limited_join_token(fleet, uses=10, expires_at=past)
    refused = await fleet.join(name="dev-e")
    assert refused.status_code == 401, refused.text
    said = refused.json()["error"]
    token_id = join_token_id(fleet.join_token)
    assert f"the join token {token_id} expired at {past:%Y-%m-%d %H:%M:%S} UTC" in said
    assert "hpc-ds1 token join --rotate" in said
    assert device_row(fleet.engine, "dev-e") is None
    assert [t for t, _ in await token_events(fleet.bus, fleet.join_token)] == ["token.created"]


async def test_a_cached_join_token_is_refused_once_it_expires(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway remembers an accepted token for a moment (token_cache.py): its expiry is
    checked on every join all the same."""
    expires = datetime.now(UTC) + timedelta(hours=1)
    fleet.join_token = await limited_join_token(fleet, uses=10, expires_at=expires)
    assert (await fleet.join(name="dev-t1")).status_code == 201

    class Later(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.now(tz) + timedelta(hours=2)

    monkeypatch.setattr(fleet_api, "datetime", Later)
    refused = await fleet.join(name="dev-t2")
    assert refused.status_code == 401 and "expired at" in refused.json()["error"]


async def test_an_expired_or_spent_home_join_token_is_shown_so_and_replaced_on_start(
    fleet: Fleet,
) -> None:
    """GET /v1/fleet/join-token tells the expiry and uses left; the next start of the gateway
    replaces a token that expired (as one that was revoked) with one of the default limits."""
    shown = (await fleet.http.get("/v1/fleet/join-token", headers=as_role("admin"))).json()
    assert shown["token_id"] == join_token_id(fleet.join_token) and shown["state"] == "active"
    assert (shown["max_uses"], shown["uses_left"]) == (10, 10)
    left = datetime.fromisoformat(shown["expires_at"]) - datetime.now(UTC)
    assert timedelta(hours=23) < left <= timedelta(hours=24)
    assert shown["problem"] is None

    old = await asyncio.to_thread(rotate_join_token, fleet.settings.home)
    past = datetime.now(UTC) - timedelta(seconds=1)
    await limited_join_token(fleet, uses=10, expires_at=past, token=old)
    shown = (await fleet.http.get("/v1/fleet/join-token", headers=as_role("admin"))).json()
    assert shown["token"] == old and shown["state"] == "expired"
    assert "expired at" in shown["problem"]
    assert await register_join_token(fleet.bus, fleet.engine, fleet.settings.home, wait_s=30)
    new = read_join_token(fleet.settings.home)
    assert new is not None and new != old
    fleet.join_token = new
    assert (await fleet.join(name="dev-n")).status_code == 201

    # One made before join tokens ran out (no expiry, no cap) is replaced on start too.
    legacy = await asyncio.to_thread(rotate_join_token, fleet.settings.home)
    await limited_join_token(fleet, token=legacy)
    assert await register_join_token(fleet.bus, fleet.engine, fleet.settings.home, wait_s=30)
    renewed = read_join_token(fleet.settings.home)
    assert renewed is not None and renewed != legacy
    limits = token_limits(fleet.engine, renewed)
    assert limits is not None and limits.max_uses == 10 and limits.expires_at is not None
