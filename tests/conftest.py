"""Session fixtures: one NATS (JetStream) and one Postgres for the whole run, started from the
pip packages on free loopback ports (or the servers named by HPC_DS1_NATS_URL /
HPC_DS1_DATABASE_URL). Each test gets its own stream, subject prefix, database and home."""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from hpc_ds1 import log, workloads
from hpc_ds1.bus import EventBus
from hpc_ds1.db import make_engine, normalize_url, upgrade
from hpc_ds1.infra.nats_server import EmbeddedNats
from hpc_ds1.infra.postgres import EmbeddedPostgres
from hpc_ds1.settings import Settings

log.configure("info", json=True)

pytest_plugins = ("tests.measured",)


@pytest.fixture(autouse=True)
def _logging_as_configured_here() -> None:
    """Each test starts with info-level JSON logs: a command run in-process may lower the level
    (setup, tune and decide keep their services to warnings), which must not leak into the
    next test's assertions on what was logged."""
    log.configure("info", json=True)


@pytest.fixture(autouse=True)
def _workload_registry_as_before() -> Iterator[None]:
    """A workload a test registers (a plug-in, a TOML file, a --home's files) ends with the
    test: it must not show up in a later test's list of known workloads."""
    with workloads.preserved():
        yield


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("HPC_DS1_NATS_URL")
    if external:
        yield external
        return
    server = EmbeddedNats(tmp_path_factory.mktemp("nats"), sync="default")
    yield server.start()
    server.stop()


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("HPC_DS1_DATABASE_URL")
    if external:
        yield normalize_url(external)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "data", durable=False)
        url = server.start()
    yield url
    server.stop()


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def database_url(postgres_url: str) -> Iterator[str]:
    """A fresh database per test, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(postgres_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(_libpq(postgres_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def settings(tmp_path: Path, nats_url: str, database_url: str) -> Settings:
    tag = uuid.uuid4().hex[:10]
    return Settings(
        home=tmp_path / "home",
        nats_url=nats_url,
        database_url=database_url,
        stream=f"EV_{tag}",
        subject_prefix=f"t{tag}",
        port=0,
        max_deliver=3,
        log_json=True,
    )


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    assert settings.database_url
    eng = make_engine(settings.database_url, pool_size=2)
    upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture
async def bus(settings: Settings, nats_url: str) -> AsyncIterator[EventBus]:
    connected = await EventBus.connect(settings, nats_url, "test")
    yield connected
    streams = (
        settings.stream,
        settings.dead_letter_stream,
        settings.work_stream,
        f"KV_{settings.liveness_bucket}",
        f"KV_{settings.claims_bucket}",
    )
    for stream in streams:
        try:
            await connected.js.delete_stream(stream)
        except Exception:
            pass
    await connected.close()


# `make pytest` runs two pytest-xdist workers (--dist loadscope). The unit of work is a module,
# except the folders below: their tests share a package or session fixture, or drive a
# machine-wide service, so each folder goes to one worker whole (the scheduler below), and the
# folders are queued first, longest first (CI's --durations), so that neither worker is left
# with one of them at the end. The scheduler groups by nodeid in the controller: xdist's own
# xdist_group marks do not reach its scheduler under pytest 9.2 (the nodeid suffix it sets is
# no longer read).
SHARED_FOLDERS = (
    "tests/e2e/",  # a really measured and trained device (package fixtures)
    "tests/fleet_e2e/",  # network namespaces, one per device
    "tests/console/",  # one browser and one served product (package fixtures)
    "tests/slurm/",  # one real slurmctld + slurmd for the session
)


def work_unit(nodeid: str) -> str:
    """What goes to one worker whole: a shared folder, else the test's module."""
    path = nodeid.split("::")[0]
    return next((folder for folder in SHARED_FOLDERS if path.startswith(folder)), path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {folder: i for i, folder in enumerate(SHARED_FOLDERS)}
    # stable: a module keeps its order
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFolderScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SharedFolderScheduling(config, log)  # type: ignore[arg-type]
