"""Soak: `hpc-ds1 serve` under a steady mixed load for a while, its memory and the projection lag
sampled all along. Run: `python benchmarks/bench_soak.py --minutes 30` (`make bench-soak`).

It starts `hpc-ds1 serve` (every service, embedded NATS and Postgres) in a fresh temporary home,
creates an engineer token and a model for this machine, then for --minutes keeps up:
  decisions   POST /v1/decide with telemetry (one forward pass and one decision event each),
              --decide-rate per second from --decide-clients clients;
  sessions    one tuning session after another (POST /v1/sessions, real gemm runs on the
              agent), every move approved by the engineer (POST /v1/approvals/{id}) -- the
              server runs with HPC_DS1_AUTO_THRESHOLD=1 so that every move waits for one;
  reads       GET /v1/events, following the log page by page, now and then an older page.
Every --sample-s it prints the RSS of the serve process (all services, Python) and of its
NATS and Postgres, the events appended, and the projection lag: how long the projection took
to hold everything the log held at a probe (a probe every half second).

Verdicts: the serve process's RSS grows at most 10 % from the end of warm-up (the first
--warmup fraction of the run) to the end, and the p99 projection lag is at most 1 s. The model
is trained by the trainer service on synthetic measurements (a smooth runtime law over this
machine's configuration space) unless --real-setup measures a tiny real setup first."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
from sqlalchemy import func, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.subjects import train_subject
from hpc_ds1.events import MeasurementRecorded, TokenCreated, envelope
from hpc_ds1.infra.home import running_owner
from hpc_ds1.infra.ports import free_port
from hpc_ds1.machine.hardware import Fingerprint
from hpc_ds1.security.tokens import new_token, new_token_id, token_hash
from hpc_ds1.settings import Settings
from hpc_ds1.space import ConfigSpace
from hpc_ds1.stack import Stack, open_stack
from hpc_ds1.workloads import get_workload

RSS_GROWTH_LIMIT = 0.10
LAG_P99_LIMIT_S = 1.0
# Synthetic training data: two sizes per workload, the two middle tiles (training takes tens
# of seconds whatever the count: it compares several model candidates).
SIZES = {"gemm": [48, 96], "montecarlo": [20_000, 80_000]}
SESSION_BODY = {"workload": "gemm", "size": 48, "start": {"ranks": 1, "threads": 1, "tile": 32}}
SESSION_LIMIT_S = 600.0


@dataclass
class SoakConfig:
    minutes: float = 30.0
    sample_s: float = 30.0
    decide_rate: float = 20.0
    decide_clients: int = 2
    read_rate: float = 5.0
    sessions: bool = True
    warmup: float = 0.2
    real_setup: bool = False
    home: Path | None = None
    quiet: bool = False


@dataclass
class Sample:
    t: float
    serve_rss: int
    nats_rss: int
    postgres_rss: int
    last_seq: int
    lag_max_s: float
    decisions: int
    approvals: int
    sessions: int
    reads: int
    errors: int


@dataclass
class Counters:
    decisions: int = 0
    approvals: int = 0
    sessions_started: int = 0
    sessions_finished: int = 0
    reads: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class SoakResult:
    config: SoakConfig
    samples: list[Sample]
    lags: list[tuple[float, float]]  # (seconds into the load, lag in seconds)
    counters: Counters
    last_seq: int
    checkpoint: int
    stream_messages: int
    projected_rows: int
    serve_exit: int | None
    rss_growth: float | None
    lag_p99_s: float | None

    @property
    def all_projected(self) -> bool:
        return self.checkpoint == self.last_seq and self.projected_rows == self.stream_messages

    @property
    def rss_ok(self) -> bool | None:
        return None if self.rss_growth is None else self.rss_growth <= RSS_GROWTH_LIMIT

    @property
    def lag_ok(self) -> bool | None:
        return None if self.lag_p99_s is None else self.lag_p99_s <= LAG_P99_LIMIT_S


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))]


def median(values: list[int]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return (ordered[middle] + ordered[~middle]) / 2


def rss_growth(samples: list[Sample], warmup: float, duration_s: float) -> float | None:
    """Serve RSS at the end of the run against the end of warm-up: the median of the samples in
    the tenth of the run after warm-up, and of those in its last tenth."""
    start = warmup * duration_s
    window = max(0.1 * duration_s, 1e-9)
    base = [s.serve_rss for s in samples if start <= s.t <= start + window]
    end = [s.serve_rss for s in samples if s.t >= duration_s - window]
    if not base or not end:
        return None
    return median(end) / median(base) - 1


# --- the serving process ------------------------------------------------------------------


def start_serve(
    home: Path, port: int, settings: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """`hpc-ds1 serve` on `home`, its stdout and stderr (not a terminal) in home/serve.log;
    `settings`: HPC_DS1_* variables over the soak's own; `cwd`: its working directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(
        HPC_DS1_HOME=str(home),
        HPC_DS1_PORT=str(port),
        HPC_DS1_LOG_LEVEL="warning",
        HPC_DS1_LOG_JSON="true",
        # Every session move waits for an engineer: the load approves them over HTTP.
        HPC_DS1_AUTO_THRESHOLD="1.0",
    )
    env.update(settings or {})
    home.mkdir(parents=True, exist_ok=True)
    with (home / "serve.log").open("ab") as log:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "hpc-ds1"), "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )


async def wait_served(serve: subprocess.Popen[bytes], home: Path, url: str) -> None:
    deadline = time.monotonic() + 180
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        while True:
            if serve.poll() is not None:
                tail = (home / "serve.log").read_text(errors="replace")[-2000:]
                raise SystemExit(f"hpc-ds1 serve exited with {serve.returncode}:\n{tail}")
            if running_owner(home) is not None:
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/healthz")).status_code == 200:
                        return
            if time.monotonic() > deadline:
                raise SystemExit("hpc-ds1 serve did not answer within 180 s")
            await asyncio.sleep(0.2)


def postgres_processes(home: Path) -> list[psutil.Process]:
    """The embedded Postgres of `home`: its postmaster (started detached by pg_ctl, so not a
    child of serve) and the postmaster's children."""
    data = str(home / "postgres")
    for process in psutil.process_iter(["name", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            cmdline = " ".join(process.info["cmdline"] or [])
            if "postgres" in (process.info["name"] or "") and data in cmdline:
                return [process, *process.children(recursive=True)]
    return []


def memory(serve: subprocess.Popen[bytes], postgres: list[psutil.Process]) -> tuple[int, int, int]:
    """RSS of the serve process, of its nats-server, and of its Postgres processes (summed)."""

    def rss(processes: list[psutil.Process]) -> int:
        total = 0
        for process in processes:
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
        return total

    try:
        process = psutil.Process(serve.pid)
        children = process.children(recursive=True)
        nats = [c for c in children if "nats" in c.name()]
        return process.memory_info().rss, rss(nats), rss(postgres)
    except psutil.Error:
        return 0, 0, 0


def stop_serve(serve: subprocess.Popen[bytes]) -> int | None:
    if serve.poll() is None:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()
    return serve.returncode


# --- preparing: a token and a model ------------------------------------------------------


async def engineer_token(stack: Stack) -> str:
    token = new_token()
    event = TokenCreated(
        token_id=new_token_id(), holder="soak", role="engineer", sha256=token_hash(token)
    )
    await stack.bus.publish(envelope(event, actor="soak", source="cli", prefix=stack.bus.prefix))
    await stack.caught_up()
    return token


def fingerprint_of(stack: Stack, device_id: str) -> Fingerprint:
    with stack.engine.connect() as conn:
        raw = conn.execute(
            select(tables.devices.c.fingerprint).where(tables.devices.c.device_id == device_id)
        ).scalar_one()
    return Fingerprint.model_validate(raw)


def synthetic_runtime(
    workload: str, size: int, config: Any, cpus: int, rng: random.Random
) -> float:
    """A smooth law with an optimum: parallel work that saturates at the CPUs, a per-rank
    start-up cost, and a best tile in the middle of the workload's tiles."""
    work = 2e-9 * size**3 if workload == "gemm" else 5e-7 * size
    workers = config.ranks * config.threads
    speedup = min(workers, cpus) ** 0.85 / (1 + 0.3 * max(0, workers - cpus))
    tile_factor = 1 + 0.1 * abs((config.tile.bit_length() if config.tile else 1) - 6)
    return (work * tile_factor / speedup + 0.05 * config.ranks) * rng.uniform(0.97, 1.03)


async def synthetic_model(stack: Stack, device_id: str) -> int:
    fp = await asyncio.to_thread(fingerprint_of, stack, device_id)
    rng = random.Random(7)
    events = []
    for name, sizes in SIZES.items():
        space = ConfigSpace.for_device(fp, get_workload(name)).runnable()
        middle = space.tiles[len(space.tiles) // 2 - 1 : len(space.tiles) // 2 + 1]
        configs = [c for c in space.configs() if c.tile in middle]
        for size, config in itertools.product(sizes, configs):
            runtime = synthetic_runtime(name, size, config, fp.logical_cpus, rng)
            measured = MeasurementRecorded(
                measurement_id=(
                    f"soak-{name}-{size}-{config.ranks}-{config.threads}-{config.tile}-{config.gpu}"
                ),
                device_id=device_id,
                workload=name,
                size=size,
                config=config.model_dump(),
                status="ok",
                runtime_s=runtime,
                throughput=1.0 / runtime,
                throughput_unit="runs/s",
                repeats=3,
                spread=0.02,
                check_ok=True,
                purpose="setup",
            )
            events.append(envelope(measured, actor="soak", source="cli", prefix=stack.bus.prefix))
    await stack.bus.publish_many(events)
    return len(events)


async def real_model(stack: Stack, device_id: str) -> int:
    from hpc_ds1.setup import PROFILES, Campaign, plan_jobs

    fp = await asyncio.to_thread(fingerprint_of, stack, device_id)
    chunks = []
    for name, sizes in {"gemm": [48, 64, 96], "montecarlo": [20_000, 40_000]}.items():
        wl = get_workload(name)
        chunks += plan_jobs([wl], {name: ConfigSpace.for_device(fp, wl)}, PROFILES["quick"], sizes)
    report = await Campaign(stack, device_id).run(chunks, lambda *_: None)
    return int(report.measured)


def existing_model(stack: Stack, device_id: str) -> str | None:
    t = tables.models
    with stack.engine.connect() as conn:
        query = select(t.c.model_version).where(t.c.device_id == device_id).order_by(t.c.seq.desc())
        found = conn.execute(query).first()
    return None if found is None else str(found[0])


def gemm_configs(stack: Stack, device_id: str) -> list[dict[str, Any]]:
    """Configurations of this device's space for gemm that the decide load sends."""
    space = ConfigSpace.for_device(fingerprint_of(stack, device_id), get_workload("gemm"))
    return [c.model_dump() for c in space.runnable().configs() if c.ranks <= 2 and not c.gpu]


async def train(stack: Stack, device_id: str) -> str:
    await stack.caught_up(within_s=300)
    reply = await stack.bus.nc.request(
        train_subject(stack.settings), orjson.dumps({"device_id": device_id}), timeout=900
    )
    answer = orjson.loads(reply.data)
    if not answer.get("ok"):
        raise SystemExit(f"training failed: {answer.get('error')}")
    await stack.caught_up()
    return str(answer["version"])


# --- the load -----------------------------------------------------------------------------


class Load:
    def __init__(
        self,
        http: httpx.AsyncClient,
        config: SoakConfig,
        stop: asyncio.Event,
        configs: list[dict[str, Any]],
    ) -> None:
        self.http = http
        self.configs = configs
        self.config = config
        self.stop = stop
        self.count = Counters()
        self.rng = random.Random(11)

    def error(self, what: str, reply: httpx.Response | Exception) -> None:
        detail = (
            f"{reply.status_code} {reply.text[:300]}"
            if isinstance(reply, httpx.Response)
            else repr(reply)
        )
        self.count.errors.append(f"{what}: {detail}")

    async def paced(self, rate: float, step: Callable[[], Awaitable[None]]) -> None:
        interval = 1.0 / rate
        next_at = time.monotonic()
        while not self.stop.is_set():
            try:
                await step()
            except httpx.HTTPError as error:
                self.error("http", error)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), delay)
            else:
                next_at = time.monotonic()  # behind: do not burst to catch up

    async def decide(self) -> None:
        body = {
            "workload": "gemm",
            "size": self.rng.choice([48, 64, 96, 128, 256]),
            "config": self.rng.choice(self.configs),
            "telemetry": {"runtime_s": round(self.rng.uniform(0.001, 2.0), 6)},
        }
        reply = await self.http.post("/v1/decide", json=body)
        if reply.status_code == 200:
            self.count.decisions += 1
        else:
            self.error("decide", reply)

    async def read_events(self, cursor: list[int]) -> None:
        after = cursor[0] if self.rng.random() > 0.1 else self.rng.randrange(0, cursor[0] + 1)
        reply = await self.http.get("/v1/events", params={"after": after, "limit": 100})
        if reply.status_code != 200:
            self.error("events", reply)
            return
        self.count.reads += 1
        rows = reply.json()["events"]
        if rows and after == cursor[0]:
            cursor[0] = int(rows[-1]["seq"])

    async def sessions(self) -> None:
        while not self.stop.is_set():
            try:
                await self.one_session()
            except httpx.HTTPError as error:
                self.error("session", error)
                await asyncio.sleep(1.0)

    async def one_session(self) -> None:
        reply = await self.http.post("/v1/sessions", json=SESSION_BODY)
        if reply.status_code != 201:
            self.error("start session", reply)
            await asyncio.sleep(1.0)
            return
        session_id = reply.json()["session_id"]
        self.count.sessions_started += 1
        started = time.monotonic()
        answered: set[str] = set()
        while not self.stop.is_set():
            state = await self.http.get(f"/v1/sessions/{session_id}")
            if state.status_code == 200 and state.json()["status"] == "finished":
                self.count.sessions_finished += 1
                return
            if state.status_code not in (200, 404):  # 404: not projected yet
                self.error("session", state)
            waiting = await self.http.get("/v1/approvals")
            if waiting.status_code != 200:
                self.error("approvals", waiting)
            else:
                for approval in waiting.json()["approvals"]:
                    aid = approval["approval_id"]
                    if approval["session_id"] != session_id or aid in answered:
                        continue
                    verdict = await self.http.post(
                        f"/v1/approvals/{aid}", json={"decision": "approve", "note": "soak"}
                    )
                    answered.add(aid)
                    if verdict.status_code == 200:
                        self.count.approvals += 1
                    else:
                        self.error("approve", verdict)
            if time.monotonic() - started > SESSION_LIMIT_S:
                self.error("session", RuntimeError(f"{session_id} ran over {SESSION_LIMIT_S} s"))
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.5)


async def warm(http: httpx.AsyncClient, config: dict[str, Any], within_s: float = 120.0) -> None:
    """One decision before the clock starts: the decision service loads the model on first use."""
    body = {"workload": "gemm", "size": 64, "config": config, "telemetry": {"runtime_s": 0.01}}
    deadline = time.monotonic() + within_s
    while (reply := await http.post("/v1/decide", json=body)).status_code != 200:
        if reply.status_code != 503 or time.monotonic() > deadline:
            raise SystemExit(f"the first decision failed: {reply.status_code} {reply.text}")
        await asyncio.sleep(1.0)


def checkpoint_of(stack: Stack) -> int:
    with stack.engine.connect() as conn:
        return int(conn.execute(select(tables.checkpoints.c.last_seq)).scalar() or 0)


async def probe_lag(
    stack: Stack, stop: asyncio.Event, lags: list[tuple[float, float]], t0: float
) -> None:
    """Every half second: the log's last sequence now, then how long until the projection's
    checkpoint holds it (polled every 20 ms)."""
    while not stop.is_set():
        asked = time.monotonic()
        target = await stack.bus.last_sequence()
        while await asyncio.to_thread(checkpoint_of, stack) < target:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        lags.append((asked - t0, time.monotonic() - asked))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, 0.5 - (time.monotonic() - asked)))


def say(config: SoakConfig, text: str) -> None:
    if not config.quiet:
        print(text, flush=True)


def sample_line(s: Sample) -> str:
    mib = 1 << 20
    return (
        f"{s.t:7.0f}  {s.serve_rss / mib:8.1f}  {s.nats_rss / mib:7.1f}  "
        f"{s.postgres_rss / mib:8.1f}  {s.last_seq:8d}  {1000 * s.lag_max_s:8.0f}  "
        f"{s.decisions:9d}  {s.approvals:9d}  {s.sessions:8d}  {s.reads:7d}  {s.errors:6d}"
    )


HEADER = (
    "    t_s  serve_MiB  nats_MiB  pg_MiB    last_seq  lag_max_ms  decisions  approvals  "
    "sessions    reads  errors"
)


async def soak(config: SoakConfig) -> SoakResult:
    home = config.home or Path(tempfile.mkdtemp(prefix="hpcds1-soak-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    say(config, f"starting hpc-ds1 serve in {home} (port {port}) ...")
    serve = start_serve(home, port)
    serve_exit: int | None = None
    try:
        await wait_served(serve, home, url)
        settings = Settings(home=home, port=port, log_level="warning")
        async with open_stack(settings, (), "soak") as stack:
            result = await _soak(config, serve, stack, url)
    finally:
        serve_exit = stop_serve(serve)
    result.serve_exit = serve_exit
    if serve_exit != 0:
        result.counters.errors.append(f"hpc-ds1 serve exited with {serve_exit}")
    return result


async def _soak(
    config: SoakConfig, serve: subprocess.Popen[bytes], stack: Stack, url: str
) -> SoakResult:
    device_id = await stack.local_device()
    token = await engineer_token(stack)
    started = time.perf_counter()
    version = await asyncio.to_thread(existing_model, stack, device_id)
    if version is not None:
        say(config, f"model {version} of device {device_id} found in the home: used as it is")
    else:
        made = await (real_model if config.real_setup else synthetic_model)(stack, device_id)
        version = await train(stack, device_id)
        kind = "real" if config.real_setup else "synthetic"
        say(
            config,
            f"model {version} trained on {made} {kind} measurements of device {device_id} in "
            f"{time.perf_counter() - started:.0f} s",
        )
    load_configs = await asyncio.to_thread(gemm_configs, stack, device_id)
    duration = config.minutes * 60
    stop = asyncio.Event()
    lags: list[tuple[float, float]] = []
    samples: list[Sample] = []
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as http:
        load = Load(http, config, stop, load_configs)
        await warm(http, load_configs[0])
        cursor = [0]
        tasks = [
            asyncio.create_task(load.paced(config.decide_rate / config.decide_clients, load.decide))
            for _ in range(config.decide_clients)
        ]
        tasks.append(
            asyncio.create_task(load.paced(config.read_rate, lambda: load.read_events(cursor)))
        )
        if config.sessions:
            tasks.append(asyncio.create_task(load.sessions()))
        postgres = await asyncio.to_thread(postgres_processes, stack.settings.home)
        t0 = time.monotonic()
        tasks.append(asyncio.create_task(probe_lag(stack, stop, lags, t0)))
        say(
            config,
            f"load for {config.minutes:g} min: {config.decide_rate:g} decisions/s, "
            f"{config.read_rate:g} event reads/s, sessions {'on' if config.sessions else 'off'}; "
            f"a sample every {config.sample_s:g} s",
        )
        say(config, HEADER)
        seen = 0
        try:
            while (now := time.monotonic() - t0) < duration:
                await asyncio.sleep(min(config.sample_s, max(0.0, duration - now)))
                for task in tasks:
                    if task.done() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                serve_rss, nats_rss, pg_rss = memory(serve, postgres)
                recent = [lag for _, lag in lags[seen:]]
                seen = len(lags)
                sample = Sample(
                    t=time.monotonic() - t0,
                    serve_rss=serve_rss,
                    nats_rss=nats_rss,
                    postgres_rss=pg_rss,
                    last_seq=await stack.bus.last_sequence(),
                    lag_max_s=max(recent, default=0.0),
                    decisions=load.count.decisions,
                    approvals=load.count.approvals,
                    sessions=load.count.sessions_finished,
                    reads=load.count.reads,
                    errors=len(load.count.errors),
                )
                samples.append(sample)
                say(config, sample_line(sample))
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    def final() -> tuple[int, int]:
        with stack.engine.connect() as conn:
            rows = conn.execute(select(func.count()).select_from(tables.events)).scalar()
        return checkpoint_of(stack), int(rows or 0)

    # A session started by the load may still append after the load stops (the coordinator
    # carries it on), so the log and its projection are compared only across a reading in
    # which the log did not grow.
    for _ in range(20):
        await stack.caught_up(within_s=120)
        before = await stack.bus.js.stream_info(stack.bus.stream)
        checkpoint, rows = await asyncio.to_thread(final)
        info = await stack.bus.js.stream_info(stack.bus.stream)
        if info.state.last_seq == before.state.last_seq:
            break
    measured = [lag for t, lag in lags]
    return SoakResult(
        config=config,
        samples=samples,
        lags=lags,
        counters=load.count,
        last_seq=int(info.state.last_seq),
        checkpoint=checkpoint,
        stream_messages=int(info.state.messages),
        projected_rows=rows,
        serve_exit=None,
        rss_growth=rss_growth(samples, config.warmup, duration),
        lag_p99_s=nearest_rank(measured, 0.99) if measured else None,
    )


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def summary(result: SoakResult) -> str:
    c = result.counters
    minutes = result.config.minutes
    lags = [lag for _, lag in result.lags]
    lines = [
        f"soak of {minutes:g} min: {c.decisions} decisions, {c.sessions_started} sessions "
        f"started ({c.sessions_finished} finished, {c.approvals} moves approved), {c.reads} "
        f"event reads, {len(c.errors)} errors",
        f"log: {result.stream_messages} events, last sequence {result.last_seq}; projection "
        f"checkpoint {result.checkpoint}, {result.projected_rows} rows: "
        f"{'every event projected' if result.all_projected else 'NOT every event projected'}",
    ]
    if result.rss_growth is not None:
        peak = max(s.serve_rss for s in result.samples) / (1 << 20)
        lines.append(
            f"serve RSS growth after warm-up ({result.config.warmup:.0%} of the run): "
            f"{100 * result.rss_growth:+.1f} % (limit +{100 * RSS_GROWTH_LIMIT:.0f} %, peak "
            f"{peak:.1f} MiB): {verdict(result.rss_ok)}"
        )
    if lags and result.lag_p99_s is not None:
        lines.append(
            f"projection lag over {len(lags)} probes: p50 {1000 * nearest_rank(lags, 0.5):.0f} "
            f"ms, p99 {1000 * result.lag_p99_s:.0f} ms, max {1000 * max(lags):.0f} ms "
            f"(limit p99 {1000 * LAG_P99_LIMIT_S:.0f} ms): {verdict(result.lag_ok)}"
        )
    for error in c.errors[:10]:
        lines.append(f"  error: {error}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="load duration (30)")
    parser.add_argument("--sample-s", type=float, help="seconds between samples (minutes*2)")
    parser.add_argument("--decide-rate", type=float, default=20.0, help="decisions/s (20)")
    parser.add_argument("--decide-clients", type=int, default=2, help="decide clients (2)")
    parser.add_argument("--read-rate", type=float, default=5.0, help="event reads/s (5)")
    parser.add_argument("--no-sessions", action="store_true", help="no tuning sessions")
    parser.add_argument("--warmup", type=float, default=0.2, help="warm-up fraction (0.2)")
    parser.add_argument("--real-setup", action="store_true", help="train on real runs")
    parser.add_argument("--home", type=Path, help="home folder (default: a new temporary one)")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.decide_rate <= 0 or args.read_rate <= 0:
        parser.error("--minutes, --decide-rate and --read-rate must be above 0")
    if args.decide_clients < 1 or not 0 <= args.warmup < 0.9:
        parser.error("--decide-clients must be at least 1 and --warmup in [0, 0.9)")
    config = SoakConfig(
        minutes=args.minutes,
        sample_s=args.sample_s or max(2.0, min(60.0, args.minutes * 2)),
        decide_rate=args.decide_rate,
        decide_clients=args.decide_clients,
        read_rate=args.read_rate,
        sessions=not args.no_sessions,
        warmup=args.warmup,
        real_setup=args.real_setup,
        home=args.home,
    )
    result = asyncio.run(soak(config))
    print(summary(result))
    ok = not result.counters.errors and result.all_projected
    return 0 if ok and result.rss_ok is not False and result.lag_ok is not False else 1


if __name__ == "__main__":
    raise SystemExit(main())
