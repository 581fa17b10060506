"""A home's embedded NATS and Postgres accept only the home's own credentials: a local process
that reads owner.json (where the servers listen) but not the 0600 credentials can neither
connect to NATS nor publish an event, nor log in to Postgres; the services connect as a role
that is not a superuser, and each NATS user can do its service's job and no more."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import nats
import psycopg
import pytest
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from sqlalchemy import select
from sqlalchemy.engine import make_url

from hpc_ds1.db import make_engine, tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import decide_subject, status_subject
from hpc_ds1.events import AuditCheckpoint, DeviceRegistered, envelope
from hpc_ds1.infra.home import Endpoints, own_home
from hpc_ds1.infra.postgres import hba_methods
from hpc_ds1.infra.secrets import load_credentials, secrets_dir
from hpc_ds1.process.runtime import SERVICES, run_services
from hpc_ds1.settings import Settings
from tests.infra.homes import home_settings, libpq

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def owned(module_scratch: Path) -> Iterator[tuple[Settings, Endpoints]]:
    home = module_scratch / "home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)  # a home from before it was kept private
    settings = home_settings(home)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with own_home(settings) as endpoints:
            yield settings, endpoints


def test_home_credentials_and_owner_file_are_private(owned: tuple[Settings, Endpoints]) -> None:
    settings, _ = owned
    home = settings.home

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    # Others get nothing; the group at most traverses (root runs Postgres as `pgserver`,
    # whose group alone may enter the home).
    assert mode(home) & 0o067 == 0, oct(mode(home))
    if os.geteuid() != 0:
        assert mode(home) == 0o700
    assert mode(secrets_dir(home)) == 0o700
    for path in (home / "owner.json", secrets_dir(home) / "servers.json", home / "nats/nats.conf"):
        assert mode(path) == 0o600, path
    owner = (home / "owner.json").read_text()
    credentials = load_credentials(home)
    for password in [credentials.postgres_superuser, credentials.postgres_app]:
        assert password not in owner
    assert not any(password in owner for password in credentials.nats.values())
    assert json.loads(owner)["embedded_nats"] is True


async def test_nats_refuses_a_process_without_the_credentials(
    owned: tuple[Settings, Endpoints],
) -> None:
    settings, ends = owned
    public_url = json.loads((settings.home / "owner.json").read_text())["nats_url"]
    for url in (public_url, public_url.replace("nats://", "nats://cli:wrong@")):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(url, allow_reconnect=False)
        with pytest.raises(PermissionError, match="refused the credentials"):
            await EventBus.connect(settings, url, "intruder")

    cli = await EventBus.connect(settings, ends.nats_url_for("cli"), "test")
    try:
        before = await cli.last_sequence()
        # The raw protocol: connect without credentials and publish a token.created event.
        host, port = public_url.removeprefix("nats://").split(":")
        body = b'{"type": "token.created"}'
        subject = f"{settings.subject_prefix}.token.tok_x.created"
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.recv(4096)  # INFO
            sock.sendall(
                b'CONNECT {"verbose":false,"pedantic":false}\r\n'
                + f"PUB {subject} {len(body)}\r\n".encode()
                + body
                + b"\r\nPING\r\n"
            )
            answer = sock.recv(4096)
        assert b"Authorization Violation" in answer
        assert await cli.last_sequence() == before
    finally:
        await cli.close()


def test_postgres_refuses_a_process_without_the_password(
    owned: tuple[Settings, Endpoints],
) -> None:
    settings, ends = owned
    public_url = json.loads((settings.home / "owner.json").read_text())["database_url"]
    assert make_url(public_url).password is None
    superuser = make_url(public_url).set(username="postgres", database="postgres")
    attempts = [
        public_url,
        superuser.render_as_string(hide_password=False),
        superuser.set(password="wrong").render_as_string(hide_password=False),
        make_url(public_url).set(password="wrong").render_as_string(hide_password=False),
    ]
    for url in attempts:
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(libpq(url), connect_timeout=5).close()
    assert hba_methods(settings.home / "postgres") == {"scram-sha-256"}
    with psycopg.connect(libpq(ends.app_database_url())) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("hpcds1",)


def test_the_services_role_is_not_a_superuser(owned: tuple[Settings, Endpoints]) -> None:
    _, ends = owned
    with psycopg.connect(libpq(ends.app_database_url()), autocommit=True) as conn:
        role = conn.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls"
            " FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert role == (False, False, False, False, False)
        owners = conn.execute(
            "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
        assert owners == [("hpcds1",)]
        refused = [
            "COPY (SELECT 1) TO PROGRAM 'true'",
            "CREATE ROLE intruder SUPERUSER LOGIN PASSWORD 'x'",
            "ALTER ROLE hpcds1 SUPERUSER",
            "CREATE DATABASE other",
        ]
        for statement in refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


async def test_each_service_user_can_do_its_job_and_no_more(
    owned: tuple[Settings, Endpoints],
) -> None:
    settings, ends = owned
    stop = asyncio.Event()
    runner = asyncio.create_task(
        run_services(SERVICES, settings, ends.nats_url_for, ends.app_database_url(), stop)
    )
    cli = await EventBus.connect(settings, ends.nats_url_for("cli"), "test")
    engine = make_engine(ends.app_database_url(), pool_size=1)
    try:
        # Every service connected as itself, subscribed its status subject and answers.
        for service in SERVICES:
            for _ in range(600):
                assert not runner.done(), runner.exception()
                with contextlib.suppress(NoRespondersError, NatsTimeout):
                    reply = await cli.nc.request(
                        status_subject(settings, service), b"", timeout=1.0
                    )
                    assert json.loads(reply.data)["service"] == service
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"{service} never answered")

        # The agent appended its registration; the projector folded it into Postgres.
        def local_devices() -> list[str]:
            with engine.connect() as conn:
                query = select(tables.devices.c.device_id).where(tables.devices.c.local)
                return list(conn.execute(query).scalars())

        for _ in range(600):
            if await asyncio.to_thread(local_devices):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the agent's registration was never projected")
    finally:
        stop.set()
        await asyncio.gather(runner, return_exceptions=True)
        engine.dispose()

    try:
        event = DeviceRegistered(device_id="dev-x", hostname="x", fingerprint={}, local=False)
        env = envelope(event, actor="test", source="test", prefix=settings.subject_prefix)
        before = await cli.last_sequence()
        # The projector reads the log (placement appends since it places tasks).
        for user in ("projector",):
            reader = await EventBus.connect(settings, ends.nats_url_for(user), "test")
            try:
                with pytest.raises(NatsTimeout):  # no ack: the server dropped the message
                    await reader.js.publish(env.subject, env.to_json(), timeout=1.0)
            finally:
                await reader.close()
        assert await cli.last_sequence() == before
        # The projector's one right on the log: its audit anchors.
        projector = await EventBus.connect(settings, ends.nats_url_for("projector"), "test")
        try:
            anchor = AuditCheckpoint(seq=before, hash="0" * 64, lines=0)
            anchor_env = envelope(
                anchor, actor="projector", source="projector", prefix=settings.subject_prefix
            )
            assert await projector.publish(anchor_env) == before + 1
        finally:
            await projector.close()
        before += 1

        agent = await EventBus.connect(settings, ends.nats_url_for("agent"), "test")
        try:
            assert await agent.publish(env) == before + 1
            # A service may not delete, purge or rewrite the log.
            for destroy in (agent.js.purge_stream, agent.js.delete_stream):
                with pytest.raises(NatsTimeout):
                    await destroy(settings.stream)  # type: ignore[operator]

            # Nor answer another service's requests.
            async def impostor(msg: Msg) -> None:
                await msg.respond(b'{"ok": true}')

            await agent.nc.subscribe(decide_subject(settings), cb=impostor)
            await agent.nc.flush()
            with pytest.raises(NoRespondersError):
                await cli.nc.request(decide_subject(settings), b"{}", timeout=1.0)
        finally:
            await agent.close()
        assert await cli.last_sequence() == before + 1

        # Model artifacts: the trainer writes them, the decision service reads them only.
        trainer = await EventBus.connect(settings, ends.nats_url_for("trainer"), "test")
        decision = await EventBus.connect(settings, ends.nats_url_for("decision"), "test")
        try:
            bucket = await trainer.js.create_object_store(f"AUTHTEST_{settings.stream}")
            await bucket.put("m1", b"onnx bytes")
            readable = await decision.js.object_store(f"AUTHTEST_{settings.stream}")
            assert (await readable.get("m1")).data == b"onnx bytes"
            with pytest.raises(NatsTimeout):  # a chunk of a forged model, never stored
                chunk = f"$O.AUTHTEST_{settings.stream}.C.forged"
                await decision.js.publish(chunk, b"forged", timeout=1.0)
        finally:
            await trainer.close()
            await decision.close()
    finally:
        await cli.close()


def test_a_service_started_alone_attaches_with_its_own_credentials(
    owned: tuple[Settings, Endpoints],
) -> None:
    """`hpc-ds1 service NAME` on a served home connects as NAME with the home's credentials."""
    settings, ends = owned
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(settings.home), HPC_DS1_LOG_JSON="true")
    service = subprocess.Popen(
        [str(Path(sys.executable).parent / "hpc-ds1"), "service", "placement"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    async def status() -> dict[str, object]:
        cli = await EventBus.connect(settings, ends.nats_url_for("cli"), "test")
        try:
            for _ in range(1200):
                assert service.poll() is None, service.communicate()[0]
                with contextlib.suppress(NoRespondersError, NatsTimeout):
                    reply = await cli.nc.request(
                        status_subject(settings, "placement"), b"", timeout=1.0
                    )
                    return dict(json.loads(reply.data))
                await asyncio.sleep(0.05)
            raise AssertionError("the placement service never answered")
        finally:
            await cli.close()

    try:
        assert asyncio.run(status())["service"] == "placement"
    finally:
        service.send_signal(signal.SIGTERM)
        output, _ = service.communicate(timeout=60)
    assert service.returncode == 0, output
    assert "Authorization Violation" not in output
