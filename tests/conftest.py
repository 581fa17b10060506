"""Session fixtures: one NATS (JetStream) and one Postgres for the whole run, started from the
pip packages on free loopback ports (or the servers named by HPC_DS1_NATS_URL /
HPC_DS1_DATABASE_URL). Each test gets its own stream, subject prefix, database and home."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select

from hpc_ds1 import log, workloads
from hpc_ds1.db import make_engine, normalize_url, tables, upgrade
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import DeviceRegistered, MeasurementRecorded, envelope
from hpc_ds1.infra.nats_server import EmbeddedNats
from hpc_ds1.infra.ports import free_port
from hpc_ds1.infra.postgres import EmbeddedPostgres
from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.process.runtime import run_service
from hpc_ds1.security.credentials import read_cli_token, read_join_token
from hpc_ds1.settings import Settings
from tests.fleet.coordinator import CONFIG, SIZE, START_S, Coordinator, bearer
from tests.support.commands import HPC_DS1, cli_env
from tests.support.databases import create_database, drop_database, fresh_database
from tests.support.tiers import (
    DURATIONS,
    FOLDER_TIERS,
    SHARED_FOLDERS,
    heavy_modules,
    module_of,
    module_seconds,
    work_unit,
)

log.configure("info", json=True)

pytest_plugins = ("tests.support.measured",)


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


@pytest.fixture
def database_url(postgres_url: str) -> Iterator[str]:
    """A fresh database per test, dropped afterwards."""
    with fresh_database(postgres_url, "t") as url:
        yield url


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


# A real coordinator and a device's own home, for the fleet's tests (tests/fleet, tests/slurm);
# what they hold is in tests/fleet/coordinator.py.
@pytest.fixture
def coordinator(settings: Settings, engine: Any, tmp_path: Path) -> Iterator[Coordinator]:
    """`hpc-ds1 serve` of the test's home on a free port."""
    port = free_port()
    env = {**cli_env(settings), "HPC_DS1_PORT": str(port), "HPC_DS1_HEARTBEAT_INTERVAL_S": "1"}
    out, err = open(tmp_path / "serve.out", "w"), open(tmp_path / "serve.err", "w")
    proc = subprocess.Popen(
        [HPC_DS1, "serve"], env=env, stdout=out, stderr=err, start_new_session=True
    )
    server = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        join = cli = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.err").read_text()[-3000:]
            join, cli = read_join_token(settings.home), read_cli_token(settings.home)
            if join and cli:
                with contextlib.suppress(httpx.HTTPError):
                    ready = httpx.get(f"{server}/readyz", headers=bearer(cli), timeout=2)
                    if ready.status_code == 200:
                        break
            time.sleep(0.2)
        else:
            raise AssertionError(
                "serve did not get ready\n" + (tmp_path / "serve.err").read_text()[-3000:]
            )
        assert join and cli
        yield Coordinator(server, join, cli, settings)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        out.close()
        err.close()


@pytest.fixture
async def device_home(tmp_path: Path, nats_url: str, postgres_url: str) -> AsyncIterator[Settings]:
    """A device's own home as its setup leaves it: its own log (stream) and database, holding
    its local device and a measurement of the job the test submits."""
    tag = uuid.uuid4().hex[:10]
    settings = Settings(
        home=tmp_path / "device-home",
        nats_url=nats_url,
        database_url=create_database(postgres_url, "t"),
        stream=f"EV_{tag}",
        subject_prefix=f"t{tag}",
        log_json=True,
    )
    assert settings.database_url
    engine = make_engine(settings.database_url, pool_size=1)
    upgrade(engine)
    bus = await EventBus.connect(settings, nats_url, "device-home")
    await bus.ensure_streams()
    stop = asyncio.Event()
    projector = asyncio.create_task(
        run_service("projector", settings, nats_url, settings.database_url, stop)
    )
    try:
        hw = await asyncio.to_thread(fingerprint)
        registered = DeviceRegistered(
            device_id=hw.device_id,
            hostname=hw.hostname,
            fingerprint=hw.model_dump(mode="json"),
            local=True,
        )
        measured = MeasurementRecorded(
            measurement_id=f"m-{tag}",
            device_id=hw.device_id,
            workload="montecarlo",
            size=SIZE,
            config=CONFIG,
            status="ok",
            runtime_s=0.002,
            repeats=3,
            spread=0.01,
            check_ok=True,
            purpose="setup",
        )
        for event in (registered, measured):
            await bus.publish(envelope(event, actor="setup", source="test", prefix=bus.prefix))
        target = await bus.last_sequence()
        for _ in range(600):
            with engine.connect() as conn:
                seq = conn.execute(select(tables.checkpoints.c.last_seq)).scalar()
            if seq is not None and seq >= target:
                break
            await asyncio.sleep(0.05)
        yield settings
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(projector, 30)
        for stream in (settings.stream, settings.dead_letter_stream):
            with contextlib.suppress(Exception):
                await bus.js.delete_stream(stream)
        await bus.close()
        engine.dispose()
        drop_database(postgres_url, settings.database_url)


def recorded_heavy_modules(root: Path) -> set[str]:
    path = root / DURATIONS
    if not path.exists():
        return set()
    return heavy_modules(json.loads(path.read_text()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    heavy = recorded_heavy_modules(config.rootpath)
    for item in items:
        if module_of(item.nodeid) in heavy:
            item.add_marker("heavy")
        path = item.nodeid.split("::")[0]
        for folder, tier in FOLDER_TIERS.items():
            if path.startswith(folder):
                item.add_marker(tier)
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


# `make test-durations` sets this: each test's report (setup, call, teardown) is appended to the
# file as it comes, from the controller only (xdist's workers forward their reports to it).
RECORD_DURATIONS = os.environ.get("HPC_DS1_RECORD_DURATIONS")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if RECORD_DURATIONS and os.environ.get("PYTEST_XDIST_WORKER") is None:
        with open(RECORD_DURATIONS, "a") as out:
            out.write(json.dumps({"nodeid": report.nodeid, "duration": report.duration}) + "\n")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if RECORD_DURATIONS and os.environ.get("PYTEST_XDIST_WORKER") is None:
        path = Path(RECORD_DURATIONS)
        lines = path.read_text().splitlines() if path.exists() else []
        reports = [json.loads(line) for line in lines]
        # merged: a run of one folder updates its modules and keeps the others'
        target = session.config.rootpath / DURATIONS
        seconds = json.loads(target.read_text()) if target.exists() else {}
        seconds.update(module_seconds(reports))
        target.write_text(json.dumps(dict(sorted(seconds.items())), indent=1) + "\n")
