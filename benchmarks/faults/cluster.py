"""Real infrastructure for the fault scenarios: one nats-server (`sync_interval: always`) and one
Postgres under a temporary directory, on free loopback ports, started with the project's own
classes, and the services as separate `hpc-ds1 service NAME` processes configured by
environment. Every process started here carries a marker in its environment, so whatever it
leaves behind (an `mpiexec`, a rank) can be found, counted and removed by that marker alone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import orjson
import psutil
from sqlalchemy import Engine, func, select
from sqlalchemy.engine import make_url

from hpc_ds1.db import make_engine, tables, upgrade
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import status_subject
from hpc_ds1.infra.nats_server import EmbeddedNats
from hpc_ds1.infra.postgres import EmbeddedPostgres
from hpc_ds1.settings import Settings

# HPCDS1_ (not HPC_DS1_): the runner passes that prefix on to the job it starts.
MARKER = "HPCDS1_FAULTS_MARKER"
HPC_DS1 = str(Path(sys.executable).parent / "hpc-ds1")


def wait_until(
    condition: Callable[[], bool], within_s: float, what: str, every_s: float = 0.02
) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {within_s:g} s")
        time.sleep(every_s)


def marked(marker: str) -> list[psutil.Process]:
    """Every live process whose environment carries this marker (ours and its descendants)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(MARKER) == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def kill_marked(marker: str) -> int:
    procs = marked(marker)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=5)
    return len(procs)


JOB_WORDS = ("hpc_ds1.runner.rank", "mpiexec", "hydra", "guard.py")


def rank_processes(marker: str) -> list[psutil.Process]:
    """The job processes (mpiexec, hydra proxies, ranks) started under this marker."""
    found = []
    for proc in marked(marker):
        with contextlib.suppress(psutil.Error):
            line = " ".join(proc.cmdline())
            if any(word in line for word in JOB_WORDS):
                found.append(proc)
    return found


class Service:
    """One `hpc-ds1 service NAME` process, in its own session, its output in a log file."""

    def __init__(self, name: str, env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                [HPC_DS1, "service", name],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)

    def stop(self, timeout: float = 20.0) -> None:
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()

    def tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class Cluster:
    """NATS and Postgres (durable) under `root`; services as processes. NATS fsyncs every
    write (`sync="always"`) where the scenario kills it; elsewhere its sync policy cannot change
    what survives, and the periodic one keeps the load cheap to publish."""

    def __init__(
        self, root: Path, postgres: bool = True, nats_sync: Literal["always", "default"] = "always"
    ) -> None:
        self.root = root
        self.marker = f"faults-{uuid.uuid4().hex[:12]}"
        self.nats_sync: Literal["always", "default"] = nats_sync
        self.nats = EmbeddedNats(root / "nats", sync=nats_sync)
        self.pg: EmbeddedPostgres | None = None
        self.want_postgres = postgres
        self.services: list[Service] = []
        self._logs = 0

    # --- servers ---------------------------------------------------------------------------

    def start(self) -> None:
        self.nats.start()
        if self.want_postgres:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.pg = EmbeddedPostgres(self.root / "pg" / "data")
                self.pg.start()

    @property
    def nats_url(self) -> str:
        return self.nats.url

    @property
    def postgres_url(self) -> str:
        assert self.pg is not None
        return self.pg.url

    def nats_pid(self) -> int:
        """The nats-server process serving our store, found by its config file."""
        config = str(self.nats.directory / "nats.conf")
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if config in (proc.info["cmdline"] or []):
                return int(proc.info["pid"])
        raise LookupError(f"no nats-server runs with {config}")

    def kill_nats(self) -> None:
        pid = self.nats_pid()
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(10)

    def restart_nats(self) -> None:
        """Same store, same port, a new process."""
        self.nats = EmbeddedNats(self.nats.directory, port=self.nats.port, sync=self.nats_sync)
        self.nats.start()

    def postmaster_pid(self) -> int:
        assert self.pg is not None
        return int((self.pg.pgdata / "postmaster.pid").read_text().splitlines()[0])

    def kill_postgres(self) -> None:
        pid = self.postmaster_pid()
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(10)

    def restart_postgres(self, attempts: int = 20) -> None:
        """Same data directory and port. Backends of the killed postmaster exit on their own
        once they notice it is gone; until then the shared memory is busy, so retry."""
        assert self.pg is not None
        error: Exception | None = None
        for _ in range(attempts):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.pg = EmbeddedPostgres(self.pg.pgdata, port=self.pg.port)
                try:
                    self.pg.start()
                    return
                except RuntimeError as failed:
                    error = failed
            time.sleep(0.5)
        raise RuntimeError(f"Postgres did not come back: {error}")

    # --- per-run databases, streams and homes ----------------------------------------------

    def database(self, name: str) -> str:
        engine = make_engine(self.postgres_url).execution_options(isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        engine.dispose()
        return make_url(self.postgres_url).set(database=name).render_as_string(False)

    def settings(self, tag: str, database: bool = True, **extra: object) -> Settings:
        db_url = self.database(f"f_{tag}") if database else "postgresql://unused"
        return Settings(
            home=self.root / "homes" / tag,
            nats_url=self.nats_url,
            database_url=db_url,
            stream=f"F_{tag}",
            subject_prefix=f"f{tag}",
            port=0,
            log_json=True,
            **extra,  # type: ignore[arg-type]
        )

    def env(self, settings: Settings, marker: str | None = None) -> dict[str, str]:
        env = {
            **os.environ,
            MARKER: marker or self.marker,
            "HPC_DS1_NATS_URL": self.nats_url,
            "HPC_DS1_DATABASE_URL": settings.database_url or "",
            "HPC_DS1_HOME": str(settings.home),
            "HPC_DS1_STREAM": settings.stream,
            "HPC_DS1_SUBJECT_PREFIX": settings.subject_prefix,
            "HPC_DS1_AUTO_THRESHOLD": str(settings.auto_threshold),
            "HPC_DS1_ESCALATE_THRESHOLD": str(settings.escalate_threshold),
            "HPC_DS1_LOG_LEVEL": "info",
            "HPC_DS1_LOG_JSON": "true",
        }
        return env

    def spawn(self, name: str, settings: Settings, marker: str | None = None) -> Service:
        self._logs += 1
        log = self.root / "logs" / f"{self._logs:03d}-{settings.stream}-{name}.log"
        service = Service(name, self.env(settings, marker), log)
        self.services.append(service)
        return service

    def close(self) -> None:
        for service in self.services:
            with contextlib.suppress(Exception):
                service.stop(10)
        kill_marked(self.marker)
        with contextlib.suppress(Exception):
            self.nats.stop()
        if self.pg is not None:
            with contextlib.suppress(Exception):
                self.pg.stop()

    @contextlib.contextmanager
    def running(self) -> Iterator[Cluster]:
        try:
            self.start()
            yield self
        finally:
            self.close()


# --- reading back what is stored ------------------------------------------------------------


async def stream_ids(bus: EventBus) -> list[str]:
    """The envelope id of every message in the stream, in order (duplicates kept)."""
    ids: list[str] = []
    async for chunk in bus.replay(1):
        ids += [str(orjson.loads(raw.data)["id"]) for raw in chunk]
    return ids


async def wait_answering(
    bus: EventBus, settings: Settings, name: str, within_s: float, fact: str | None = None
) -> dict:
    """Wait until service `name` answers its status request (with `fact` among its facts,
    when given); returns its facts."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            reply = await bus.nc.request(status_subject(settings, name), b"", timeout=1.0)
            facts = dict(orjson.loads(reply.data))
            if fact is None or fact in facts:
                return facts
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"service {name} did not answer within {within_s:g} s")
        await asyncio.sleep(0.2)


def checkpoint(engine: Engine) -> int:
    with engine.connect() as conn:
        value = conn.execute(select(tables.checkpoints.c.last_seq)).scalar()
    return int(value or 0)


def count_rows(engine: Engine, table: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar() or 0)  # type: ignore[arg-type]


def migrated(url: str) -> Engine:
    engine = make_engine(url, pool_size=2)
    upgrade(engine)
    return engine
