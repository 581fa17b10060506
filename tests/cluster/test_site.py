"""A site's own infrastructure, as docs/site-infrastructure.md describes it: a Postgres that
takes only scram-sha-256 passwords, with the role and database made by the page's own SQL and
`pg_hba.conf` line, and a three-node NATS cluster that accepts only its user, the log at three
replicas. `hpc-ds1 serve` runs on both: migrations as the role (no superuser right), a decision
through the gateway, the audit chain verified against the log, the projection holding every
event, and neither password in serve's output, logs or files outside credentials/. A wrong
password stops serve with a message naming the database URL without the password."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from sqlalchemy import select
from sqlalchemy.engine import make_url

from hpc_ds1.db import make_engine, normalize_url, tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.infra.cluster import LocalCluster
from hpc_ds1.infra.nats_server import NatsUser
from hpc_ds1.infra.ports import free_port
from hpc_ds1.infra.postgres import EmbeddedPostgres, _bin
from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.settings import Settings
from tests.deploy.processes import give_model
from tests.support.commands import HPC_DS1
from tests.support.serving import cli_headers, start_serve, stop, wait_ready

DOC = Path(__file__).resolve().parents[2] / "docs" / "site-infrastructure.md"
DOC_PASSWORD = "choose-a-long-random-password"  # the placeholder of the page's SQL
DOC_ADDRESS = "10.1.0.0/16"  # the placeholder of the page's pg_hba.conf line
ROLE = "hpcds1"  # the role and database of the page's SQL
NATS_USER = "hpcds1"
DECIDE = {
    "workload": "gemm",
    "size": 64,
    "config": {"ranks": 1, "threads": 1, "tile": 32},
    "telemetry": {"runtime_s": 0.004},
}


def fenced(language: str) -> list[str]:
    """The page's code blocks in `language`, in order."""
    pattern = re.compile(rf"^```{language}\n(.*?)^```$", re.MULTILINE | re.DOTALL)
    return pattern.findall(DOC.read_text())


def libpq(
    host: str, port: int, user: str, password: str | None, database: str, **extra: str
) -> str:
    from psycopg.conninfo import make_conninfo

    params: dict[str, Any] = {"host": host, "port": port, "user": user, **extra}
    if password is not None:
        params["password"] = password
    return make_conninfo("", dbname=database, **params)


@dataclass
class SitePostgres:
    """The site's server, the role and database the page's SQL made on it, and the role's
    password. `scram`: the server asks the role for a scram-sha-256 password (a server of
    HPC_DS1_DATABASE_URL may trust loopback: then the checks of refused passwords cannot run)."""

    host: str
    port: int
    role: str
    password: str
    scram: bool
    secrets: tuple[str, ...]  # every password of the run (none may leak)

    @property
    def database(self) -> str:
        return self.role

    def url(self, password: str | None = None) -> str:
        secret = password or self.password
        return f"postgresql://{self.role}:{secret}@{self.host}:{self.port}/{self.database}"

    def connect(self, password: str | None = None, **extra: str) -> psycopg.Connection[Any]:
        return psycopg.connect(
            libpq(self.host, self.port, self.role, password, self.database, **extra)
        )


def run_dba_sql(admin: str, env: dict[str, str], role: str, password: str, directory: Path) -> None:
    """The page's SQL as written, by psql as the DBA: only the password (and the role's name,
    on a shared server) replaced."""
    (written,) = fenced("sql")
    assert DOC_PASSWORD in written and f"ROLE {ROLE} " in written
    script = directory / "hpcds1.sql"
    script.write_text(written.replace(DOC_PASSWORD, password).replace(ROLE, role))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pgserver warns about XDG_RUNTIME_DIR on import
        psql = _bin("psql")
    done = subprocess.run(
        [psql, "-v", "ON_ERROR_STOP=1", "-d", admin, "-f", str(script)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


SERVERS = ["scram"] + (["external"] if os.environ.get("HPC_DS1_DATABASE_URL") else [])


@pytest.fixture(scope="module", params=SERVERS)
def site_postgres(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SitePostgres]:
    """ "scram": a Postgres of our own with scram-sha-256 for every connection, then the page's
    SQL (psql as a DBA role with CREATEROLE and CREATEDB, no superuser) and its pg_hba.conf
    line for loopback, after the superuser's own line. "external" (only with
    HPC_DS1_DATABASE_URL, a role that may create roles and databases, e.g. the machine's own
    Postgres on 5432): the page's SQL there, for a role and database of this run, dropped
    afterwards."""
    password = secrets.token_urlsafe(18)
    directory = tmp_path_factory.mktemp("dba")
    if request.param == "external":
        admin = make_url(normalize_url(os.environ["HPC_DS1_DATABASE_URL"]))
        conninfo = admin.set(drivername="postgresql").render_as_string(hide_password=False)
        role = f"{ROLE}_{uuid.uuid4().hex[:8]}"
        run_dba_sql(conninfo, {}, role, password, directory)
        host, port = str(admin.host or "127.0.0.1"), int(admin.port or 5432)
        site = SitePostgres(host, port, role, password, False, (password,))
        try:
            site.connect(require_auth="scram-sha-256").close()
            site.scram = True
        except psycopg.OperationalError:
            pass  # the server does not ask this role for a scram password (trust)
        try:
            yield site
        finally:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{role}" WITH (FORCE)')
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        return
    superuser_password = secrets.token_urlsafe(18)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pgserver warns about XDG_RUNTIME_DIR on import
        server = EmbeddedPostgres(
            tmp_path_factory.mktemp("site-pg") / "data",
            durable=False,
            superuser_password=superuser_password,
        )
        server.start()
    try:
        assert server.port
        # The DBA: no superuser, only CREATEROLE and CREATEDB (the page's harder case).
        dba_password = secrets.token_urlsafe(18)
        with psycopg.connect(
            libpq("127.0.0.1", server.port, "postgres", superuser_password, "postgres"),
            autocommit=True,
        ) as conn:
            conn.execute(
                sql.SQL("CREATE ROLE dba LOGIN CREATEROLE CREATEDB PASSWORD {}").format(
                    sql.Literal(dba_password)
                )
            )
        dba = libpq("127.0.0.1", server.port, "dba", None, "postgres")
        run_dba_sql(dba, {"PGPASSWORD": dba_password}, ROLE, password, directory)
        hba = [block for block in fenced("conf") if "pg_hba.conf" in block]
        assert len(hba) == 1 and DOC_ADDRESS in hba[0]
        superuser = "host    all       postgres  127.0.0.1/32   scram-sha-256\n"
        server._write_for_server(
            server.pgdata / "pg_hba.conf", superuser + hba[0].replace(DOC_ADDRESS, "127.0.0.1/32")
        )
        with psycopg.connect(
            libpq("127.0.0.1", server.port, "postgres", superuser_password, "postgres"),
            autocommit=True,
        ) as conn:
            conn.execute("SELECT pg_reload_conf()")
        yield SitePostgres(
            "127.0.0.1",
            server.port,
            ROLE,
            password,
            True,
            (password, superuser_password, dba_password),
        )
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    user = NatsUser(NATS_USER, secrets.token_urlsafe(18))
    directory = tmp_path_factory.mktemp("site-nats")
    with LocalCluster(directory, size=3, sync="default", users=[user]) as running:
        yield running


def test_the_role_is_no_superuser_and_logs_in_only_with_its_scram_password(
    site_postgres: SitePostgres,
) -> None:
    site = site_postgres
    with site.connect(site.password) as conn:
        found = conn.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls "
            "FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert found == (False, False, False, False, False)
        owner = conn.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        assert owner == (site.role,)
    if not site.scram:
        pytest.skip(
            f"the server at {site.host}:{site.port} does not ask {site.role} for a password"
        )
    # libpq's require_auth: the client refuses unless the server asked for scram-sha-256.
    site.connect(site.password, require_auth="scram-sha-256").close()
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        site.connect(site.password + "x")
    # Without a password: the server asks for one, by SASL (scram), never trusts.
    with pytest.raises(psycopg.OperationalError, match="server requested SASL authentication"):
        site.connect(None, require_auth="none")
    if site.host == "127.0.0.1" and site.role == ROLE:  # our own server, its pg_hba.conf ours
        # The pg_hba.conf line admits the role to its own database only.
        with pytest.raises(psycopg.OperationalError, match=r"no pg_hba\.conf entry"):
            psycopg.connect(libpq(site.host, site.port, site.role, site.password, "postgres"))


def test_serve_on_the_site_cluster_and_postgres(
    tmp_path: Path, site_postgres: SitePostgres, cluster: LocalCluster
) -> None:
    nats_url = cluster.url_for(NATS_USER)
    nats_password = cluster._user(NATS_USER).password
    tag = uuid.uuid4().hex[:8]
    environment = {
        "HPC_DS1_NATS_URL": nats_url,
        "HPC_DS1_STREAM_REPLICAS": "3",
        "HPC_DS1_STREAM": f"SITE_{tag}",
        "HPC_DS1_SUBJECT_PREFIX": f"site{tag}",
    }
    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"
    site = site_postgres
    shown_db = f"postgresql://{site.role}@{site.host}:{site.port}/{site.database}"

    # A wrong password: serve stops before anything starts, naming the URL without it.
    wrong = f"wrong-{secrets.token_urlsafe(12)}"
    if site.scram:
        refused = start_serve(home, port, HPC_DS1_DATABASE_URL=site.url(wrong), **environment)
        output, _ = refused.communicate(timeout=120)
        assert refused.returncode == 2, output
        assert f"hpc-ds1 serve: cannot use the database {shown_db} (HPC_DS1_DATABASE_URL)" in output
        assert f'password authentication failed for user "{site.role}"' in output
        assert "Traceback" not in output and wrong not in output
    # A wrong NATS password: refused as early, the servers named without credentials.
    nats_wrong = nats_url.replace(nats_password, wrong)
    refused = start_serve(
        home,
        port,
        **{**environment, "HPC_DS1_NATS_URL": nats_wrong},
        HPC_DS1_DATABASE_URL=site.url(),
    )
    output, _ = refused.communicate(timeout=120)
    assert refused.returncode == 2, output
    assert f"hpc-ds1 serve: the NATS servers {cluster.url} (HPC_DS1_NATS_URL) refused" in output
    assert "Authorization Violation" in output
    assert "Traceback" not in output and wrong not in output and nats_password not in output
    # `hpc-ds1 service NAME` (a container of the compose file) refuses them as early.
    refusals = [("decision", {"HPC_DS1_NATS_URL": nats_wrong}, "the NATS servers")]
    if site.scram:
        refusals.append(
            ("projector", {"HPC_DS1_DATABASE_URL": site.url(wrong)}, "cannot use the database")
        )
    for service, bad, named in refusals:
        done = subprocess.run(
            [HPC_DS1, "service", service],
            env={
                **env_without_settings(),
                **environment,
                "HPC_DS1_DATABASE_URL": site.url(),
                "HPC_DS1_HOME": str(home),
                **bad,
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
        said = done.stdout + done.stderr
        assert done.returncode == 2 and f"hpc-ds1 service: {named} " in said, said
        assert "Traceback" not in said and wrong not in said and nats_password not in said

    # The right one. The model trains here meanwhile (serve needs none to start).
    process = start_serve(home, port, HPC_DS1_DATABASE_URL=site.url(), **environment)
    output = ""
    try:
        from tests.support.trained import trained_on

        device_id = fingerprint().device_id
        version, onnx = trained_on(fingerprint())
        wait_ready(url, process)
        owner = (home / "owner.json").read_text()
        assert nats_password not in owner and not [s for s in site.secrets if s in owner]
        assert (
            json.loads(owner)["nats_url"] == cluster.url and json.loads(owner)["embedded"] is False
        )
        settings = Settings(
            home=home,
            nats_url=nats_url,
            database_url=site.url(),
            stream=environment["HPC_DS1_STREAM"],
            subject_prefix=environment["HPC_DS1_SUBJECT_PREFIX"],
            stream_replicas=3,
        )
        give_model(settings, device_id, version, onnx)
        engine = make_engine(site.url(), pool_size=1)
        try:
            # The migrations ran as the role: it owns every table, at the newest revision.
            with engine.connect() as conn:
                owners = conn.exec_driver_sql(
                    "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'"
                ).all()
                revision = conn.exec_driver_sql("SELECT version_num FROM alembic_version").all()
            assert owners == [(site.role,)] and len(revision) == 1
            # A decision through the gateway, appended on the cluster and projected.
            headers = cli_headers(home)
            decision_id = decide(url, headers)
            projected(engine, decision_id)
            audit = subprocess.run(
                [HPC_DS1, "audit", "verify", "--json"],
                # The shell of the site's user: the same exports as serve's.
                env={
                    **env_without_settings(),
                    **environment,
                    "HPC_DS1_DATABASE_URL": site.url(),
                    "HPC_DS1_HOME": str(home),
                },
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert audit.returncode == 0, audit.stdout + audit.stderr
            verdict = json.loads(audit.stdout)
            assert verdict["intact"] is True and verdict["lines"] >= 3, verdict
            # The log at three replicas on the cluster; the projection holds all of it.
            last, replicas = asyncio.run(stream_state(settings))
            assert replicas == 3
            with engine.connect() as conn:
                seqs = conn.execute(select(tables.events.c.seq).order_by(tables.events.c.seq))
                assert [row[0] for row in seqs] == list(range(1, last + 1))
        finally:
            engine.dispose()
    finally:
        output = stop(process, signal.SIGINT)
    secrets_ = (*site.secrets, nats_password)
    assert f"  NATS      {cluster.url}\n" in output and "  Postgres  external" in output
    assert not [s for s in secrets_ if s in output]
    # Nothing the home keeps outside credentials/ holds a password: logs, audit file, models.
    for path in home.rglob("*"):
        if path.is_file() and "credentials" not in path.relative_to(home).parts:
            text = path.read_bytes()
            assert not [s for s in secrets_ if s.encode() in text], path


def env_without_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}


def decide(url: str, headers: dict[str, str], within_s: float = 120.0) -> str:
    """POST /v1/decide until the model's event has reached the decision service (409 before)."""
    deadline = time.monotonic() + within_s
    while True:
        reply = httpx.post(f"{url}/v1/decide", json=DECIDE, headers=headers, timeout=60)
        if reply.status_code == 200:
            return str(reply.json()["decision_id"])
        assert reply.status_code == 409 and time.monotonic() < deadline, reply.text
        time.sleep(0.2)


def projected(engine: Any, decision_id: str, within_s: float = 120.0) -> None:
    deadline = time.monotonic() + within_s
    query = select(tables.decisions.c.decision_id).where(
        tables.decisions.c.decision_id == decision_id
    )
    while True:
        with engine.connect() as conn:
            if conn.execute(query).first() is not None:
                return
        assert time.monotonic() < deadline, f"decision {decision_id} was never projected"
        time.sleep(0.2)


async def stream_state(settings: Settings) -> tuple[int, int]:
    """The log's last sequence once the projection's checkpoint reaches it, and its replicas."""
    assert settings.nats_url and settings.database_url
    bus = await EventBus.connect(settings, settings.nats_url, "test-site")
    engine = make_engine(settings.database_url, pool_size=1)
    try:
        info = await bus.js.stream_info(settings.stream)
        last = await bus.last_sequence()
        deadline = time.monotonic() + 120
        while True:
            with engine.connect() as conn:
                at = conn.execute(select(tables.checkpoints.c.last_seq)).scalar() or 0
            if at >= last:
                return last, int(info.config.num_replicas or 0)
            assert time.monotonic() < deadline, f"the projection stayed at {at} of {last}"
            await asyncio.sleep(0.2)
    finally:
        engine.dispose()
        await bus.close()
