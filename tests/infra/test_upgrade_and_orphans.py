"""A home from before credentials is upgraded with its data kept; the servers of an owner killed
with SIGKILL never leave a second nats-server on the same store."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from hpc_ds1.db import make_engine, upgrade
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import DeviceRegistered, envelope
from hpc_ds1.infra.home import own_home
from hpc_ds1.infra.nats_server import EmbeddedNats, leftover_servers
from hpc_ds1.infra.postgres import EmbeddedPostgres, hba_methods
from hpc_ds1.settings import Settings

from .homes import home_settings, libpq

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def registration(prefix: str) -> bytes:
    event = DeviceRegistered(device_id="dev-1", hostname="h", fingerprint={}, local=False)
    return envelope(event, actor="test", source="test", prefix=prefix).to_json()


async def publish_one(settings: Settings, url: str) -> None:
    bus = await EventBus.connect(settings, url, "test")
    try:
        await bus.js.publish(
            f"{settings.subject_prefix}.device.dev-1.registered", registration("hpcds1")
        )
    finally:
        await bus.close()


async def last_sequence(settings: Settings, url: str) -> int:
    bus = await EventBus.connect(settings, url, "test")
    try:
        return await bus.last_sequence()
    finally:
        await bus.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])


async def test_a_trust_home_is_upgraded_and_keeps_its_data(scratch: Path) -> None:
    home = scratch / "home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    settings = home_settings(home)
    # The home as earlier versions left it: trust Postgres, data in database `postgres` owned
    # by the superuser, an open NATS store with one event.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old_pg = EmbeddedPostgres(home / "postgres")
        engine = make_engine(old_pg.start(), pool_size=1)
    try:
        upgrade(engine)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE canary (x int)"))
            conn.execute(text("INSERT INTO canary VALUES (42)"))
    finally:
        engine.dispose()
        old_pg.stop()
    assert "trust" in hba_methods(home / "postgres")
    old_nats = EmbeddedNats(home / "nats", sync="default")
    try:
        await publish_one(settings, old_nats.start())
    finally:
        old_nats.stop()

    with own_home(settings) as ends:
        assert hba_methods(home / "postgres") == {"scram-sha-256"}
        with psycopg.connect(libpq(ends.app_database_url())) as conn:
            assert conn.execute("SELECT x FROM canary").fetchall() == [(42,)]
            owners = conn.execute(
                "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall()
            assert owners == [("hpcds1",)]
            assert conn.execute("SELECT current_database()").fetchone() == ("hpcds1",)
        superuser = make_url(ends.database_url).set(username="postgres", database="postgres")
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(libpq(superuser.render_as_string(hide_password=False))).close()
        assert await last_sequence(settings, ends.nats_url_for("cli")) == 1


def test_a_leftover_nats_server_of_the_store_is_stopped_first(tmp_path: Path) -> None:
    # Started from a worker thread, the first server does not die with its owner: the case of
    # a server whose owner was killed.
    first = EmbeddedNats(tmp_path / "nats", sync="default")
    started = threading.Thread(target=first.start)
    started.start()
    started.join()
    assert first._process is not None
    old = first._process.pid
    assert leftover_servers(first.config_path, first.pid_file) == [old]
    second = EmbeddedNats(tmp_path / "nats", sync="default")
    try:
        second.start()
        assert second._process is not None
        assert first._process.poll() is not None  # stopped, not merely orphaned
        assert leftover_servers(second.config_path, second.pid_file) == [second._process.pid]
        assert int(second.pid_file.read_text()) == second._process.pid
    finally:
        second.stop()
        first.stop()


OWNER = """
import asyncio, sys, time
from pathlib import Path
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.infra.home import own_home
from hpc_ds1.settings import Settings
from sqlalchemy import text
from hpc_ds1.db import make_engine

settings = Settings(home=Path(sys.argv[1]), nats_url=None, database_url=None,
                    nats_sync="default", log_level="warning")
with own_home(settings) as ends:
    async def publish():
        bus = await EventBus.connect(settings, ends.nats_url_for("cli"), "owner")
        await bus.js.publish("hpcds1.device.dev-1.registered", sys.argv[2].encode())
        await bus.close()
    asyncio.run(publish())
    engine = make_engine(ends.app_database_url(), pool_size=1)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE canary (x int)"))
        conn.execute(text("INSERT INTO canary VALUES (7)"))
    engine.dispose()
    print("ready", flush=True)
    time.sleep(600)
"""


def test_an_owner_killed_with_sigkill_leaves_one_nats_server(scratch: Path) -> None:
    home = scratch / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(home), registration("hpcds1").decode()],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert owner.stdout is not None
        said = []
        for line in owner.stdout:  # its log lines, then "ready"; EOF if it failed
            said.append(line)
            if line.strip() == "ready":
                break
        else:
            raise AssertionError("the owner failed:\n" + "".join(said))
        config, pid_file = home / "nats/nats.conf", home / "nats/nats.pid"
        [old_nats] = leftover_servers(config, pid_file)
        old_postgres = postmaster_pid(home / "postgres")
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    # Started from the owner's main thread, nats-server dies with it; Postgres (a daemon of
    # pg_ctl) stays until the next owner stops it.
    assert wait_gone(old_nats)
    assert alive(old_postgres)

    settings = home_settings(home)
    with own_home(settings) as ends:
        servers = leftover_servers(config, pid_file)
        assert len(servers) == 1 and servers[0] != old_nats
        assert wait_gone(old_postgres)
        assert postmaster_pid(home / "postgres") != old_postgres
        assert asyncio.run(last_sequence(settings, ends.nats_url_for("cli"))) == 1
        with psycopg.connect(libpq(ends.app_database_url())) as conn:
            assert conn.execute("SELECT x FROM canary").fetchall() == [(7,)]
    assert leftover_servers(config, pid_file) == []
