"""One gateway serving N simulated long-polling agents on loopback: dispatch latency and the
gateway's CPU. Run: `python benchmarks/bench_longpoll.py [--agents 1000] [--items 2000]`.

`--tls both` (issue 45) runs it twice in one run, plain HTTP then HTTPS, each on a fresh home,
the gateway bound to 0.0.0.0 and the agents connecting to this machine's own non-loopback
address (loopback stays plain HTTP by design), the HTTPS agents trusting the home's CA alone
(pinned, as real agents do); it prints both and the ratio of the dispatch p50s (target: TLS
costs at most 10 %). `--tls on` / `off`: one of them on that address.

It owns a fresh temporary home (embedded NATS and Postgres, or the servers named by
HPC_DS1_NATS_URL / HPC_DS1_DATABASE_URL) with the projector in this process, and runs the
gateway alone in its own process (`hpc-ds1 service gateway`), so its CPU is its own. Then:
  tokens    N device credentials (token.created, role agent), folded by the projector;
  tasks     M tasks submitted and placed on random devices (the events the gateway checks a
            work item against), folded before anything is timed;
  agents    N agents, each one keep-alive HTTP/1.1 connection (raw asyncio: a client this
            light leaves the CPU to the gateway) long-polling GET /v1/agent/work with its own
            token, polling again at once after each answer;
  connect   the time until every agent's first poll holds its device's queue consumer;
  idle      the gateway's CPU over a few seconds with all N polls held and nothing to send
            (what remains is heartbeats: the gateway refreshes each polling device's);
  dispatch  the M work items enqueued on the devices' queues at a steady rate; for each, the
            latency from enqueue to its agent holding the item (same clock, this process),
            and the gateway's CPU over the phase.
Every item must reach its own device's agent, once."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import resource
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil

from hpc_ds1 import log
from hpc_ds1.events import TaskPlaced, TaskSubmitted, TokenCreated, envelope
from hpc_ds1.fleet.work import WorkItem, consumer_name, enqueue, ensure_work_stream
from hpc_ds1.infra import tls
from hpc_ds1.infra.ports import free_port
from hpc_ds1.security.credentials import reachable_host
from hpc_ds1.security.tokens import new_token, token_hash
from hpc_ds1.settings import Settings
from hpc_ds1.stack import Stack, open_stack

CONFIG = {"ranks": 1, "threads": 1, "tile": 64, "gpu": False}


@dataclass
class LongpollConfig:
    agents: int = 1000
    items: int = 2000
    rate: float = 100.0  # work items enqueued per second
    wait_s: float = 25.0  # each poll's `wait`
    idle_s: float = 10.0
    heartbeat_interval_s: float = 5.0
    nats_sync: str = "always"
    home: Path | None = None
    quiet: bool = False
    tls: bool | None = None  # None: loopback, plain; False/True: this machine's address, HTTPS?


@dataclass
class LongpollResult:
    agents: int
    items: int
    rate: float
    connect_s: float
    latencies: list[float]
    received: dict[str, str]  # task id -> the device whose agent got it
    placed_on: dict[str, str]  # task id -> the device it was queued for
    errors: list[str]
    polls: int
    empty_polls: int
    idle_cpu: float  # gateway CPU, in cores (1.0 = one core busy)
    dispatch_cpu: float
    bench_cpu: float  # this process (agents, enqueuer, projector) during dispatch
    server_cpu: dict[str, float]  # embedded NATS and Postgres during dispatch
    by_tenth: list[float]  # median latency of each tenth of the items, in enqueue order
    dispatch_s: float
    gateway_rss_mib: float
    heartbeat_interval_s: float = 5.0
    gateway_exit: int | None = None
    transport: str = "http on loopback"


class Agent:
    """One simulated device: a keep-alive connection long-polling for its work."""

    def __init__(
        self,
        device: str,
        token: str,
        port: int,
        wait_s: float,
        on_item: Callable[[str, dict[str, Any]], None],
        errors: list[str],
        host: str = "127.0.0.1",
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.device = device
        self.port = port
        self.host = host
        self.context = context  # TLS trusting the home's CA alone, as a pinned agent does
        self.request = (
            f"GET /v1/agent/work?wait={wait_s:g} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\nAccept: application/json\r\n\r\n"
        ).encode()
        self.on_item = on_item
        self.errors = errors
        self.polls = 0
        self.empty = 0

    async def run(self, stop: asyncio.Event) -> None:
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.context)
        try:
            while not stop.is_set():
                writer.write(self.request)
                status, body = await self._answer(reader)
                self.polls += 1
                if status == 204:
                    self.empty += 1
                elif status == 200:
                    self.on_item(self.device, orjson.loads(body))
                else:
                    self.errors.append(f"{self.device}: {status} {body[:200]!r}")
                    await asyncio.sleep(1.0)
        except (ConnectionError, asyncio.IncompleteReadError) as error:
            if not stop.is_set():
                self.errors.append(f"{self.device}: connection lost: {error!r}")
        finally:
            writer.close()

    @staticmethod
    async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        body = await reader.readexactly(length) if length else b""
        return status, body


def _raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _say(config: LongpollConfig, text: str) -> None:
    if not config.quiet:
        print(text, flush=True)


async def _publish(stack: Stack, events: list[Any], actor: str) -> None:
    envs = [envelope(e, actor=actor, source="bench", prefix=stack.bus.prefix) for e in events]
    await stack.bus.publish_many(envs, window=256)


async def _gateway_ready(port: int, process: subprocess.Popen[bytes], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the gateway exited with {process.returncode}")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await reader.read(64)
            writer.close()
            if b" 200 " in answer:
                return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise SystemExit("the gateway did not answer /healthz")


def _cpu(process: psutil.Process | list[psutil.Process]) -> float:
    total = 0.0
    for one in process if isinstance(process, list) else [process]:
        try:
            times = one.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _servers(me: psutil.Process) -> dict[str, list[psutil.Process]]:
    """The embedded NATS and Postgres processes this benchmark started (empty: external)."""
    found: dict[str, list[psutil.Process]] = {"nats": [], "postgres": []}
    for child in me.children(recursive=True):
        try:
            name = child.name()
        except psutil.NoSuchProcess:
            continue
        if "nats-server" in name:
            found["nats"].append(child)
        elif "postgres" in name:
            found["postgres"].append(child)
    return {k: v for k, v in found.items() if v}


async def longpoll(config: LongpollConfig) -> LongpollResult:
    _raise_open_files()
    home = config.home or Path(tempfile.mkdtemp(prefix="hpcds1-bench-longpoll-"))
    port = free_port()
    settings = Settings(
        home=home,
        port=port,
        host="127.0.0.1" if config.tls is None else "0.0.0.0",
        log_level="warning",
        long_poll_s=max(config.wait_s, 1.0),
        heartbeat_interval_s=config.heartbeat_interval_s,
        nats_sync=config.nats_sync,
        nats_url=os.environ.get("HPC_DS1_NATS_URL") or None,
        database_url=os.environ.get("HPC_DS1_DATABASE_URL") or None,
    )
    devices = [f"dev-{i:05d}" for i in range(config.agents)]
    tokens = {d: new_token() for d in devices}
    rng = random.Random(7)
    placed_on = {f"task-{i:06d}": rng.choice(devices) for i in range(config.items)}
    _say(config, f"home {home}: starting NATS, Postgres and the projector ...")
    async with open_stack(settings, ("projector",), "bench-longpoll") as stack:
        started = time.perf_counter()
        await _publish(
            stack,
            [
                TokenCreated(token_id=f"tok_{d}", holder=d, role="agent", sha256=token_hash(t))
                for d, t in tokens.items()
            ],
            "admin",
        )
        events: list[Any] = []
        for task_id, device in placed_on.items():
            events.append(
                TaskSubmitted(task_id=task_id, workload="gemm", size=64, submitted_by="b")
            )
            events.append(
                TaskPlaced(
                    task_id=task_id,
                    attempt=1,
                    device_id=device,
                    config=CONFIG,
                    expected_s=1.0,
                    queue_s=0.0,
                    basis="measured",
                    reason="bench",
                )
            )
        await _publish(stack, events, "placement")
        await stack.caught_up(within_s=300)
        await ensure_work_stream(stack.bus.js, settings)
        _say(
            config,
            f"  {config.agents} tokens and {config.items} placed tasks folded in "
            f"{time.perf_counter() - started:.1f} s",
        )
        return await _measure(config, settings, stack, tokens, placed_on)


def _transport(config: LongpollConfig, settings: Settings) -> tuple[str, ssl.SSLContext | None]:
    """Where the agents connect, and their TLS context (None: plain)."""
    if config.tls is None:
        return "127.0.0.1", None
    host = reachable_host("0.0.0.0")
    if host.startswith("127.") or not host[0].isdigit():
        raise SystemExit(f"no non-loopback address to measure on (found {host})")
    if not config.tls:
        return host, None
    paths, _ = tls.ensure_server_cert(settings.home, [host])
    return host, tls.client_context(paths.ca_cert.read_text())


async def _measure(
    config: LongpollConfig,
    settings: Settings,
    stack: Stack,
    tokens: dict[str, str],
    placed_on: dict[str, str],
) -> LongpollResult:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(
        HPC_DS1_HOME=str(settings.home),
        HPC_DS1_PORT=str(settings.port),
        HPC_DS1_LOG_LEVEL="warning",
        HPC_DS1_LONG_POLL_S=str(settings.long_poll_s),
        HPC_DS1_HEARTBEAT_INTERVAL_S=str(settings.heartbeat_interval_s),
    )
    if settings.nats_url and settings.database_url:
        env.update(HPC_DS1_NATS_URL=settings.nats_url, HPC_DS1_DATABASE_URL=settings.database_url)
    host, context = _transport(config, settings)
    env.update(HPC_DS1_HOST=settings.host)
    if context is not None:
        paths = tls.HomeTLS.of(settings.home)
        env.update(HPC_DS1_TLS_CERT=str(paths.cert), HPC_DS1_TLS_KEY=str(paths.key))
    gateway = subprocess.Popen(
        [str(Path(sys.executable).parent / "hpc-ds1"), "service", "gateway"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    errors: list[str] = []
    sent: dict[str, float] = {}
    latencies: list[float] = []
    by_task: dict[str, float] = {}
    received: dict[str, str] = {}
    all_in = asyncio.Event()

    def on_item(device: str, body: dict[str, Any]) -> None:
        now = time.perf_counter()
        item = WorkItem.model_validate(body)
        if item.device_id != device:
            errors.append(f"{device} got {item.task_id}, queued for {item.device_id}")
        if item.task_id in received:
            errors.append(f"{item.task_id} handed out twice")
        received[item.task_id] = device
        if item.task_id in sent:
            latencies.append(now - sent[item.task_id])
            by_task[item.task_id] = now - sent[item.task_id]
        if len(received) >= len(placed_on):
            all_in.set()

    stop = asyncio.Event()
    agents = [
        Agent(d, t, settings.port, config.wait_s, on_item, errors, host, context)
        for d, t in tokens.items()
    ]
    runners: list[asyncio.Task[None]] = []
    me = psutil.Process()
    try:
        await _gateway_ready(settings.port, gateway, 120)
        proc = psutil.Process(gateway.pid)
        started = time.perf_counter()
        runners = [asyncio.create_task(a.run(stop)) for a in agents]
        await _all_subscribed(stack, settings, len(agents), errors, within_s=600)
        connect_s = time.perf_counter() - started
        _say(
            config,
            f"  {len(agents)} agents polling, each device's consumer made: {connect_s:.1f} s",
        )

        await asyncio.sleep(1.0)
        cpu0, wall0 = _cpu(proc), time.perf_counter()
        await asyncio.sleep(config.idle_s)
        idle_cpu = (_cpu(proc) - cpu0) / (time.perf_counter() - wall0)

        servers = _servers(me)
        servers0 = {k: _cpu(v) for k, v in servers.items()}
        cpu0, mine0, wall0 = _cpu(proc), _cpu(me), time.perf_counter()
        interval = 1.0 / config.rate
        for n, (task_id, device) in enumerate(placed_on.items()):
            due = wall0 + n * interval
            if (ahead := due - time.perf_counter()) > 0:
                await asyncio.sleep(ahead)
            item = WorkItem(
                task_id=task_id,
                attempt=1,
                device_id=device,
                workload="gemm",
                size=64,
                config=CONFIG,
                expected_s=1.0,
            )
            sent[task_id] = time.perf_counter()
            await enqueue(stack.bus.js, settings, item)
        try:
            await asyncio.wait_for(all_in.wait(), timeout=60 + config.wait_s)
        except TimeoutError:
            errors.append(f"only {len(received)} of {len(placed_on)} items arrived")
        elapsed = time.perf_counter() - wall0
        in_order = [by_task[t] for t in placed_on if t in by_task]
        step = max(1, math.ceil(len(in_order) / 10))
        by_tenth = [
            statistics.median(in_order[i : i + step]) for i in range(0, len(in_order), step)
        ]
        dispatch_cpu = (_cpu(proc) - cpu0) / elapsed
        bench_cpu = (_cpu(me) - mine0) / elapsed
        server_cpu = {k: (_cpu(v) - servers0[k]) / elapsed for k, v in servers.items()}
        rss = proc.memory_info().rss / 2**20
    finally:
        stop.set()
        for runner in runners:
            runner.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
        gateway.terminate()
        try:
            exit_code: int | None = gateway.wait(60)
        except subprocess.TimeoutExpired:
            gateway.kill()
            exit_code = None
    return LongpollResult(
        agents=len(agents),
        items=len(placed_on),
        rate=config.rate,
        connect_s=connect_s,
        latencies=latencies,
        received=received,
        placed_on=placed_on,
        errors=errors,
        polls=sum(a.polls for a in agents),
        empty_polls=sum(a.empty for a in agents),
        idle_cpu=idle_cpu,
        dispatch_cpu=dispatch_cpu,
        bench_cpu=bench_cpu,
        server_cpu=server_cpu,
        by_tenth=by_tenth,
        dispatch_s=elapsed,
        gateway_rss_mib=rss,
        heartbeat_interval_s=settings.heartbeat_interval_s,
        gateway_exit=exit_code,
        transport=f"{'https' if context else 'http'} to {host}",
    )


async def _all_subscribed(
    stack: Stack, settings: Settings, count: int, errors: list[str], within_s: float
) -> None:
    """Until the work stream has a consumer for every device (each made by its first poll)."""
    wanted = {consumer_name(f"dev-{i:05d}") for i in range(count)}
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            info = await stack.bus.js.stream_info(settings.work_stream)
        except TimeoutError:  # nats' TimeoutError is one: the server is busy making consumers
            continue
        if info.state.consumer_count >= len(wanted):
            return
        if errors:
            raise SystemExit(f"agents failed: {errors[:3]}")
        await asyncio.sleep(0.25)
    raise SystemExit("not every agent's poll reached its queue in time")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(result: LongpollResult) -> str:
    ms = [1000 * v for v in result.latencies] or [float("nan")]
    lines = [
        f"One gateway process, {result.agents} long-polling agents, {result.transport} "
        f"({os.cpu_count()} CPUs here, shared with NATS, Postgres and the agents):",
        f"  connect  every agent polling its own queue after {result.connect_s:.1f} s "
        "(first poll of each device makes its durable consumer)",
        f"  idle     gateway CPU {100 * result.idle_cpu:.1f} % of one core with "
        f"{result.agents} polls held (each device's heartbeat refreshed every "
        f"{result.heartbeat_interval_s:g} s)",
        f"  dispatch {result.items} items at {result.rate:g}/s to random devices: enqueue -> "
        f"agent has it p50 {statistics.median(ms):.2f} ms, p90 {percentile(ms, 0.9):.2f} ms, "
        f"p99 {percentile(ms, 0.99):.2f} ms, max {max(ms):.2f} ms",
        "           median by tenth of the run: "
        + " ".join(f"{1000 * v:.0f}" for v in result.by_tenth)
        + " ms",
        f"           gateway CPU {100 * result.dispatch_cpu:.1f} % of one core "
        f"({1000 * result.dispatch_cpu * result.dispatch_s / max(1, result.items):.2f} ms CPU "
        f"per item); this process (agents, enqueuer, projector) {100 * result.bench_cpu:.1f} %"
        + "".join(f", {k} {100 * v:.1f} %" for k, v in result.server_cpu.items()),
        f"           gateway RSS {result.gateway_rss_mib:.0f} MiB; {result.polls} polls answered, "
        f"{result.empty_polls} of them empty after their wait",
        f"  errors   {len(result.errors)}" + (f": {result.errors[:3]}" if result.errors else ""),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=100.0, help="items enqueued per second")
    parser.add_argument("--wait", type=float, default=25.0, help="each poll's wait (s)")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU sampling")
    parser.add_argument(
        "--heartbeat-interval", type=float, default=5.0, help="the gateway's heartbeat refresh (s)"
    )
    parser.add_argument(
        "--nats-sync", choices=("always", "default"), default="always", help="NATS fsync policy"
    )
    parser.add_argument(
        "--tls",
        choices=("loopback", "off", "on", "both"),
        default="loopback",
        help="loopback: plain HTTP on 127.0.0.1 (as before); off/on: plain/HTTPS to this "
        "machine's own address; both: off then on in one run, with the ratio of their p50s",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --tls both: this many rounds of (http, https), alternating, so that the "
        "load others put on the machine falls on both alike; the ratio is of the median p50s",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    config = LongpollConfig(
        agents=args.agents,
        items=args.items,
        rate=args.rate,
        wait_s=args.wait,
        idle_s=args.idle,
        heartbeat_interval_s=args.heartbeat_interval,
        nats_sync=args.nats_sync,
    )
    log.configure("warning")
    modes = {"loopback": [None], "off": [False], "on": [True], "both": [False, True]}[args.tls]
    results: dict[bool | None, list[LongpollResult]] = {mode: [] for mode in modes}
    for _ in range(args.rounds if args.tls == "both" else 1):
        for mode in modes:
            config.tls = mode
            result = asyncio.run(longpoll(config))
            print(summary(result), flush=True)
            results[mode].append(result)
    if args.tls == "both":
        print(compare(results[False], results[True]))
    return 1 if any(r.errors for rs in results.values() for r in rs) else 0


def compare(plain: list[LongpollResult], secured: list[LongpollResult]) -> str:
    """HTTPS against HTTP of the same run: the median over rounds of each round's p50 (and
    p99, CPU per item), each round's figures listed."""

    def p50(r: LongpollResult) -> float:
        return statistics.median(1000 * v for v in r.latencies)

    def p99(r: LongpollResult) -> float:
        return percentile([1000 * v for v in r.latencies], 0.99)

    def cpu_ms(r: LongpollResult) -> float:
        return 1000 * r.dispatch_cpu * r.dispatch_s / max(1, r.items)

    def both(f: Callable[[LongpollResult], float]) -> tuple[float, float]:
        return statistics.median(f(r) for r in secured), statistics.median(f(r) for r in plain)

    (s50, h50), (s99, h99), (scpu, hcpu) = both(p50), both(p99), both(cpu_ms)
    ratio = s50 / h50
    rounds = "; ".join(f"{p50(b):.2f} / {p50(a):.2f}" for a, b in zip(plain, secured, strict=True))
    return (
        f"HTTPS / HTTP, same run, {len(plain)} round(s) alternating: dispatch p50 {s50:.2f} / "
        f"{h50:.2f} ms = x{ratio:.3f} (target <= x1.10: {'met' if ratio <= 1.10 else 'MISSED'}); "
        f"p99 {s99:.2f} / {h99:.2f} ms; gateway CPU per item {scpu:.2f} / {hcpu:.2f} ms; "
        f"p50 by round (https / http): {rounds}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
