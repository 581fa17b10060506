"""The deployment docker-compose.yml describes, without containers: one NATS, one Postgres, and
each service as its own `hpc-ds1 service NAME` process with the command and environment its
container has (the servers' URLs, the home and the port replaced by this run's own). Shared by
tests/deploy/test_processes.py and benchmarks/bench_replicas.py."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from sqlalchemy import Engine, func, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import status_subject
from hpc_ds1.events import Event, MeasurementRecorded, ModelPublished, envelope
from hpc_ds1.models_store import save_local
from hpc_ds1.settings import Settings
from hpc_ds1.workloads import get_workload

HPC_DS1 = str(Path(sys.executable).parent / "hpc-ds1")
COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
# Where the servers and the home are: this run's own, not the containers' names.
LOCATION = (
    "HPC_DS1_NATS_URL",
    "HPC_DS1_DATABASE_URL",
    "HPC_DS1_HOME",
    "HPC_DS1_PORT",
    "HPC_DS1_STREAM",
    "HPC_DS1_SUBJECT_PREFIX",
)
REPLICA = "hpc-replica"
MONTECARLO = {"ranks": 1, "threads": 1, "tile": get_workload("montecarlo").default_tile}


def compose_services(path: Path = COMPOSE) -> dict[str, dict[str, Any]]:
    """Each application container of the compose file: {"command": [...], "environment": {}}
    (merge keys resolved; the servers' own containers left out)."""
    doc = yaml.safe_load(path.read_text())
    found: dict[str, dict[str, Any]] = {}
    for name, spec in doc["services"].items():
        command = spec.get("command")
        if not (isinstance(command, list) and command[:1] == ["service"]):
            continue
        env = spec.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        found[name] = {
            "command": [str(part) for part in command],
            "environment": {str(k): str(v) for k, v in env.items()},
        }
    return found


@dataclass
class Copy:
    """One running copy of a service: its process and its log."""

    service: str
    process: subprocess.Popen[bytes]
    log_path: Path
    killed: bool = False  # by kill9: its end is no failure

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill9(self) -> None:
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(20)

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def logged(self, event: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log().splitlines():
            with contextlib.suppress(ValueError):
                record = orjson.loads(line)
                if isinstance(record, dict) and record.get("event") == event:
                    found.append(record)
        return found


@dataclass
class Deployment:
    """The compose file's services as processes against `settings`' NATS and Postgres."""

    settings: Settings
    root: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    copies: list[Copy] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.spec = compose_services()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.port}"

    def env(self, service: str) -> dict[str, str]:
        s = self.settings
        assert s.nats_url and s.database_url
        env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
        env.update({k: v for k, v in self.spec[service]["environment"].items()})
        env.update(
            HPC_DS1_NATS_URL=s.nats_url,
            HPC_DS1_DATABASE_URL=s.database_url,
            HPC_DS1_HOME=str(s.home),
            HPC_DS1_PORT=str(s.port),
            HPC_DS1_STREAM=s.stream,
            HPC_DS1_SUBJECT_PREFIX=s.subject_prefix,
            **self.extra_env,
        )
        return env

    def start(self, service: str) -> Copy:
        """One more copy of compose service `service`, as its container runs it."""
        n = sum(c.service == service for c in self.copies) + 1
        log_path = self.root / f"{service}-{n}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [HPC_DS1, *self.spec[service]["command"]],
                env=self.env(service),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        copy = Copy(service, process, log_path)
        self.copies.append(copy)
        return copy

    def of(self, service: str) -> list[Copy]:
        return [c for c in self.copies if c.service == service]

    def stop(self, grace_s: float = 5.0) -> dict[str, int | None]:
        """SIGTERM to every copy at once, then SIGKILL to those still running `grace_s` later.
        The grace is short on purpose: a gateway holds a request that a killed decision replica
        took (its NATS request waits out its 30 s timeout) and stops only when it ends, which a
        teardown has no reason to wait for."""
        for copy in self.copies:
            if copy.alive():
                copy.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        return {
            f"{c.service}/{c.pid}": c.stop(max(deadline - time.monotonic(), 0.1))
            for c in self.copies
        }

    @contextlib.contextmanager
    def running(self, services: list[str]) -> Iterator[Deployment]:
        try:
            for service in services:
                self.start(service)
            yield self
        finally:
            self.stop()

    def tails(self, lines: int = 8) -> str:
        return "\n".join(
            f"--- {c.service} pid {c.pid} ({'alive' if c.alive() else c.process.returncode})\n"
            + "\n".join(c.log().splitlines()[-lines:])
            for c in self.copies
        )

    def wait_ready(self, within_s: float = 240.0) -> dict[str, Any]:
        deadline = time.monotonic() + within_s
        last: Any = None
        while time.monotonic() < deadline:
            dead = [c for c in self.copies if not c.alive() and not c.killed]
            assert not dead, f"a service exited:\n{self.tails()}"
            try:
                reply = httpx.get(f"{self.url}/readyz", timeout=5.0)
                last = reply.text
                if reply.status_code == 200:
                    return dict(reply.json())
            except httpx.HTTPError as error:
                last = repr(error)
            time.sleep(0.3)
        raise AssertionError(f"not ready within {within_s:g} s: {last}\n{self.tails()}")

    def headers(self) -> dict[str, str]:
        """The home's CLI credential, registered by the gateway as the owner's admin token."""
        path = self.settings.home / "credentials" / "cli.token"
        for _ in range(600):
            if path.exists():
                headers = {"Authorization": f"Bearer {path.read_text().strip()}"}
                if httpx.get(f"{self.url}/v1/whoami", headers=headers).status_code == 200:
                    return headers
            time.sleep(0.1)
        raise AssertionError(f"{path} never became a valid credential")


# --- NATS: a few calls, each on a connection of its own ----------------------------------------


def nats_call(settings: Settings, work: Any) -> Any:
    async def run() -> Any:
        assert settings.nats_url
        bus = await EventBus.connect(settings, settings.nats_url, "test-deploy")
        try:
            return await work(bus)
        finally:
            await bus.close()

    return asyncio.run(run())


def publish(settings: Settings, *events: Event) -> None:
    async def work(bus: EventBus) -> None:
        for event in events:
            await bus.publish(
                envelope(event, actor="test", source="test", prefix=settings.subject_prefix)
            )

    nats_call(settings, work)


def statuses(settings: Settings, service: str, wait_s: float = 1.0) -> list[dict[str, Any]]:
    """Every copy's answer to one status request of `service` (each replica answers)."""

    async def work(bus: EventBus) -> list[dict[str, Any]]:
        inbox = bus.nc.new_inbox()
        answers: list[dict[str, Any]] = []

        async def take(msg: Any) -> None:
            answers.append(dict(orjson.loads(msg.data)))

        sub = await bus.nc.subscribe(inbox, cb=take)
        await bus.nc.publish(status_subject(settings, service), b"", reply=inbox)
        await asyncio.sleep(wait_s)
        await sub.unsubscribe()
        return answers

    result: list[dict[str, Any]] = nats_call(settings, work)
    return result


def stream_ids(settings: Settings) -> list[tuple[str, str]]:
    """(envelope id, type) of every message in the stream, in order, duplicates kept."""

    async def work(bus: EventBus) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        async for chunk in bus.replay(1):
            for raw in chunk:
                body = orjson.loads(raw.data)
                found.append((str(body["id"]), str(body["type"])))
        return found

    result: list[tuple[str, str]] = nats_call(settings, work)
    return result


def last_sequence(settings: Settings) -> int:
    async def work(bus: EventBus) -> int:
        return await bus.last_sequence()

    return int(nats_call(settings, work))


# --- Postgres ---------------------------------------------------------------------------------


def checkpoint(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(tables.checkpoints.c.last_seq)).scalar() or 0)


def caught_up(engine: Engine, settings: Settings, within_s: float = 60.0) -> None:
    target = last_sequence(settings)
    deadline = time.monotonic() + within_s
    while checkpoint(engine) < target:
        assert time.monotonic() < deadline, f"the projection stayed at {checkpoint(engine)}"
        time.sleep(0.1)


def count(engine: Engine, table: Any, *where: Any) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(select(func.count()).select_from(table).where(*where)).scalar() or 0
        )


# --- a device with a model ------------------------------------------------------------------


def give_model(settings: Settings, device_id: str, version: str, onnx: bytes) -> None:
    """The device's model where the services find it (the home's models directory: the shared
    volume of the compose file) and a measured montecarlo basis for placement."""
    save_local(settings.models_dir, version, device_id, onnx)
    publish(
        settings,
        ModelPublished(
            model_version=version,
            device_id=device_id,
            artifact=f"{device_id}/{version}.onnx",
            sha256=hashlib.sha256(onnx).hexdigest(),
            trained_on=1,
        ),
        MeasurementRecorded(
            measurement_id=f"m-basis-{device_id}",
            device_id=device_id,
            workload="montecarlo",
            size=1_000_000,
            config=MONTECARLO,
            status="ok",
            runtime_s=0.02,
            repeats=3,
        ),
    )
