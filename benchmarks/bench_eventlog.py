"""Event log benchmark: publish → projected row, against the raw nats-py ceiling, in both NATS
sync settings. Run: `make bench-eventlog` (or `python benchmarks/bench_eventlog.py [N]`).

For each setting it starts an embedded nats-server and measures, in one run:
  raw ceiling   JetStream publishes/s with EventBus.publish_many, both ways: one at a time
                (512 sent at once, their acknowledgements awaited together: the baseline) and
                in atomic batches (one acknowledgement, one flush per batch of 512), then pull
                fetch(500)+ack/s (no Postgres);
  end to end    events/s from the first publish until the projector's checkpoint, committed in
                Postgres, covers the last event; the projector runs as its own process
                (`hpc-ds1 service projector`), as in docker-compose;
  lag           per event: the first poll (every 5 ms) that sees its sequence committed, minus
                the moment its publish was sent; p50/p99 over all events. Unpaced, the lag is
                mostly the backlog of a publisher faster than the projector (it grows with N);
                paced at the issue's target rate (5,000/s with sync always, 10,000/s with the
                default), it is the lag a steady load of that rate sees.
Postgres is the embedded one (pgserver), durable settings (fsync on).

Options: `--sync always|default` measures one setting only; `--no-serve` skips the `serve`
start-up figures; `--profile DIR` records a py-spy flame graph (SVG) of the projector process
during each end-to-end measurement (needs py-spy, in the dev extra, and ptrace rights)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import httpx
import psutil
from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url

from hpc_ds1.db import make_engine, tables, upgrade
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import Envelope, MeasurementRecorded, envelope
from hpc_ds1.infra.nats_server import EmbeddedNats
from hpc_ds1.infra.ports import free_port
from hpc_ds1.infra.postgres import EmbeddedPostgres
from hpc_ds1.settings import Settings


def fresh_database(server_url: str, name: str) -> str:
    """Each measurement projects into its own database, so no checkpoint carries over."""
    engine = make_engine(server_url).execution_options(isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    engine.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def make_events(prefix: str, n: int) -> list[Envelope]:
    return [
        envelope(
            MeasurementRecorded(
                measurement_id=f"m{i}",
                device_id="bench",
                workload="gemm",
                size=1024,
                config={"ranks": 1, "threads": 2, "tile": 64},
                status="ok",
                runtime_s=0.1,
                throughput=20.0,
                throughput_unit="GFLOP/s",
            ),
            actor="bench",
            source="bench",
            prefix=prefix,
        )
        for i in range(n)
    ]


async def raw_ceiling(url: str, n: int, batches: bool) -> tuple[float, float]:
    settings = Settings(stream="RAW", subject_prefix="raw", nats_url=url, database_url="x")
    bus = await EventBus.connect(settings, url, "bench-raw")
    bus.atomic_batches = bus.atomic_batches and batches
    events = make_events("raw", n)
    started = time.perf_counter()
    await bus.publish_many(events, window=512)
    publish_rate = n / (time.perf_counter() - started)
    sub = await bus.js.pull_subscribe("raw.>", durable="ceiling", stream="RAW")
    got = 0
    started = time.perf_counter()
    while got < n:
        msgs = await sub.fetch(500, timeout=5)
        for msg in msgs:
            await msg.ack()
        got += len(msgs)
    fetch_rate = n / (time.perf_counter() - started)
    await sub.unsubscribe()
    await bus.js.delete_stream("RAW")
    await bus.js.delete_stream(settings.dead_letter_stream)
    await bus.close()
    return publish_rate, fetch_rate


def profiler(pid: int, out: Path | None, name: str) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the projector until stopped with SIGINT (it then writes the SVG)."""
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).parent / "py-spy"
    command = [str(spy), "record", "--pid", str(pid), "--rate", "250", "--nonblocking"]
    return subprocess.Popen(
        [*command, "--format", "flamegraph", "--output", str(out / f"{name}.svg")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def stop_profiler(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is None:
        return
    spy.send_signal(signal.SIGINT)
    _, err = spy.communicate(timeout=120)
    if spy.returncode not in (0, -signal.SIGINT):
        print(f"py-spy failed ({spy.returncode}): {err.decode()[-500:]}", file=sys.stderr)


async def end_to_end(
    url: str,
    server_url: str,
    n: int,
    home: Path,
    profile: Path | None = None,
    batches: bool = True,
    rate: float | None = None,
) -> dict[str, float]:
    db_url = fresh_database(server_url, home.name.replace("-", "_"))
    settings = Settings(
        stream="E2E", subject_prefix="e2e", nats_url=url, database_url=db_url, home=home
    )
    engine = make_engine(db_url)
    upgrade(engine)
    bus = await EventBus.connect(settings, url, "bench-e2e")
    bus.atomic_batches = bus.atomic_batches and batches
    env = {
        **os.environ,
        "HPC_DS1_NATS_URL": url,
        "HPC_DS1_DATABASE_URL": db_url,
        "HPC_DS1_STREAM": "E2E",
        "HPC_DS1_SUBJECT_PREFIX": "e2e",
        "HPC_DS1_HOME": str(home),
        "HPC_DS1_LOG_LEVEL": "warning",
    }
    projector = subprocess.Popen(
        [str(Path(sys.executable).parent / "hpc-ds1"), "service", "projector"], env=env
    )
    try:
        await _started(engine, projector)
        spy = profiler(projector.pid, profile, f"projector-{home.name}")
        events = make_events("e2e", n)
        nats_server = _nats_server()
        before = _cpu_s(projector.pid)
        nats_before = _cpu_s(nats_server.pid) if nats_server else 0.0
        machine_before = _machine_busy_s()
        try:
            result = await _publish_and_watch(bus, engine, projector, events, rate)
        finally:
            stop_profiler(spy)
        # CPU per event: what the projector's own work costs, which other load on the machine
        # inflates far less than it inflates events/s; the machine's (every process: publisher,
        # nats-server, projector, Postgres) bounds the rate at cores / CPU per event.
        result["projector_cpu_us"] = 1e6 * (_cpu_s(projector.pid) - before) / n
        result["machine_cpu_us"] = 1e6 * (_machine_busy_s() - machine_before) / n
        if nats_server is not None:
            result["nats_cpu_us"] = 1e6 * (_cpu_s(nats_server.pid) - nats_before) / n
        return result
    finally:
        projector.terminate()
        projector.wait(30)
        await bus.js.delete_stream("E2E")
        await bus.js.delete_stream(settings.dead_letter_stream)
        await bus.close()
        engine.dispose()


async def _started(engine: Engine, projector: subprocess.Popen[bytes]) -> None:
    """Until the projector has read its checkpoint (it writes the row the first time), and a
    second more to subscribe: its start-up (imports) stays out of the clock and the profile."""
    for _ in range(1200):
        if projector.poll() is not None:
            raise RuntimeError(f"the projector exited with status {projector.returncode}")
        with engine.connect() as conn:
            if conn.execute(select(tables.checkpoints.c.last_seq)).first() is not None:
                break
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)


def _machine_busy_s() -> float:
    """CPU seconds every core spent busy since boot (all processes, this one included)."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def _nats_server() -> psutil.Process | None:
    """The embedded nats-server this process started (None for an external server)."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.name().startswith("nats-server"):
                return child
    return None


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def _publish_and_watch(
    bus: EventBus,
    engine: Engine,
    projector: subprocess.Popen[bytes],
    events: list[Envelope],
    rate: float | None = None,
) -> dict[str, float]:
    """As fast as the publisher goes (rate None: the lag is then mostly the backlog of a
    publisher faster than the projector, and grows with n), or paced at `rate` events/s in
    chunks every 10 ms (the lag a steady load of that rate sees)."""
    n = len(events)
    sent_at = [0.0] * (n + 1)
    seen_at = [0.0] * (n + 1)

    def checkpoint() -> int:
        with engine.connect() as conn:
            return int(conn.execute(select(tables.checkpoints.c.last_seq)).scalar() or 0)

    async def poll() -> None:
        last = 0
        while last < n:
            if projector.poll() is not None:
                raise RuntimeError(f"the projector exited with status {projector.returncode}")
            # The projector may append an audit anchor of its own past the last event.
            current = min(n, await asyncio.to_thread(checkpoint))
            now = time.perf_counter()
            for seq in range(last + 1, current + 1):
                seen_at[seq] = now
            last = max(last, current)
            await asyncio.sleep(0.005)

    poller = asyncio.create_task(poll())
    started = time.perf_counter()
    # events sent at once (one atomic batch, or their acks awaited together)
    window = 512 if rate is None else max(1, int(rate / 100))
    for start in range(0, n, window):
        chunk = events[start : start + window]
        if rate is not None:
            await asyncio.sleep(max(0.0, started + start / rate - time.perf_counter()))
        now = time.perf_counter()
        for i in range(len(chunk)):
            sent_at[start + i + 1] = now
        await bus.publish_many(chunk, window=window)
    published = time.perf_counter()
    await poller
    finished = time.perf_counter()
    lags = sorted(seen_at[s] - sent_at[s] for s in range(1, n + 1))
    return {
        "publish_per_s": n / (published - started),
        "e2e_per_s": n / (finished - started),
        "lag_p50_ms": 1000 * statistics.median(lags),
        "lag_p99_ms": 1000 * lags[int(0.99 * (n - 1))],
    }


def serve_start(home: Path) -> float:
    """Seconds from launching `hpc-ds1 serve` until /readyz answers 200 (polled every 50 ms)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(home), HPC_DS1_PORT=str(port), HPC_DS1_LOG_LEVEL="warning")
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "hpc-ds1"), "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while process.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"serve exited with status {process.returncode}")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", type=int, nargs="?", default=50_000, help="events per measurement")
    parser.add_argument("--sync", choices=("always", "default"), help="only this sync setting")
    parser.add_argument("--no-serve", action="store_true", help="skip the serve start-up figure")
    parser.add_argument("--profile", type=Path, help="write py-spy flame graphs (SVG) here")
    args = parser.parse_args()
    n = args.n
    root = Path(tempfile.mkdtemp(prefix="hpcds1-bench-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pg = EmbeddedPostgres(root / "pg")
        db_url = pg.start()
    print(f"event log benchmark: {n} events per measurement, {os.cpu_count()} CPUs")
    print(
        f"{'setting':<22}{'publish':<20}{'raw pub/s':>10}{'raw fetch+ack/s':>16}"
        f"{'e2e events/s':>13}{'of ceiling':>11}{'lag p50':>10}{'lag p99':>10}"
        f"{'projector CPU':>14}{'nats CPU':>10}{'machine CPU':>13}"
    )
    measured: dict[tuple[str, str], float] = {}
    try:
        for sync in (args.sync,) if args.sync else ("always", "default"):
            nats = EmbeddedNats(root / f"nats-{sync}", sync=sync)
            url = nats.start()
            label = "sync_interval=always" if sync == "always" else "default sync"
            offered = {"always": 5_000.0, "default": 10_000.0}[sync]  # issue 15's targets
            try:
                for how, batches, rate in (
                    ("one at a time", False, None),
                    ("atomic batches", True, None),
                    (f"batches, {offered:,.0f}/s", True, offered),
                ):
                    pub, fetch = (
                        asyncio.run(raw_ceiling(url, n, batches)) if rate is None else (0, 0)
                    )
                    home = root / f"home-{sync}-{len(measured)}"
                    e2e = asyncio.run(end_to_end(url, db_url, n, home, args.profile, batches, rate))
                    measured[sync, how] = e2e["e2e_per_s"]
                    ceiling = min(pub, fetch) if rate is None else rate
                    sent = f"sent {e2e['publish_per_s']:,.0f}/s"
                    raw = f"{pub:>10,.0f}{fetch:>16,.0f}" if rate is None else f"{sent:>26}"
                    print(
                        f"{label:<22}{how:<20}{raw}{e2e['e2e_per_s']:>13,.0f}"
                        f"{e2e['e2e_per_s'] / ceiling:>10.0%} {e2e['lag_p50_ms']:>7.0f} ms"
                        f"{e2e['lag_p99_ms']:>7.0f} ms{e2e['projector_cpu_us']:>8.0f} us/ev"
                        f"{e2e.get('nats_cpu_us', float('nan')):>6.0f} us/ev"
                        f"{e2e['machine_cpu_us']:>7.0f} us/ev",
                        flush=True,
                    )
                    label = ""
            finally:
                nats.stop()
    finally:
        pg.stop()
    print(
        "ceiling = min(raw publish, raw fetch+ack), or the offered rate (sent: the rate "
        "reached); lag = commit seen - publish sent; projector CPU = its user+system seconds "
        "during the run / events; nats CPU = nats-server's; machine CPU = busy CPU seconds "
        "of every core (publisher, nats-server, projector, Postgres) / events: the cores bound "
        "the rate at cores / machine CPU"
    )
    for sync in (args.sync,) if args.sync else ("always", "default"):
        ratio = measured[sync, "atomic batches"] / measured[sync, "one at a time"]
        print(f"{sync} sync: end to end with atomic batches / one at a time: x{ratio:.2f}")
    if args.no_serve:
        return
    cold = serve_start(root / "serve-home")
    warm = serve_start(root / "serve-home")
    print(
        f"hpc-ds1 serve to /readyz OK (embedded NATS + Postgres): cold {cold:.2f} s "
        f"(new home), warm {warm:.2f} s (existing home)"
    )


if __name__ == "__main__":
    main()
