"""POST /v1/decide over loopback, through the gateway and the decision service (NATS), with
telemetry given (one forward pass, nothing runs). Run: `python benchmarks/bench_decide_http.py`.

It starts the whole stack on embedded NATS and Postgres in a fresh temporary home, measures a
tiny real setup (gemm and montecarlo at small sizes) and trains the model, then:
  latency     one client, requests one after another: p50/p99 over N requests;
  throughput  C concurrent clients (httpx, keep-alive) for N requests: requests/s, p50/p99.
Every request is a real decision: a decision event is appended to the log for each one.

`--tls both` (issue 45): `serve --host 0.0.0.0` twice on the same prepared home, plain HTTP
(HPC_DS1_TLS=off) then HTTPS (its own CA), the load sent to this machine's own non-loopback
address both times (loopback stays plain by design), and the ratio of their requests/s with 8
clients (target: HTTPS keeps at least 90 %). wrk does not verify certificates; the handshake
and the encryption are what it pays for.

Options: `--home DIR` keeps the prepared home there and reuses it on the next run (no second
setup and training); `--profile DIR` records py-spy flame graphs (SVG) of `serve` and its
subprocesses during each measurement (needs py-spy, in the dev extra, and ptrace rights)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import psutil
from loadgen import Load, run_httpx, run_wrk, wrk_path

from hpc_ds1.eventlog.subjects import train_subject
from hpc_ds1.infra import tls
from hpc_ds1.infra.ports import free_port
from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.security.credentials import reachable_host, read_cli_token
from hpc_ds1.settings import Settings
from hpc_ds1.setup import PROFILES, Campaign, plan_jobs
from hpc_ds1.space import ConfigSpace
from hpc_ds1.stack import open_stack
from hpc_ds1.workloads import get_workload

BODY = {
    "workload": "gemm",
    "size": 64,
    "config": {"ranks": 1, "threads": 2, "tile": 32},
    "telemetry": {"runtime_s": 0.004},
}


async def prepare(settings: Settings) -> None:
    fp = fingerprint()
    chunks = []
    for name, sizes in {"gemm": [48, 64, 96], "montecarlo": [20_000, 40_000]}.items():
        wl = get_workload(name)
        chunks += plan_jobs([wl], {name: ConfigSpace.for_device(fp, wl)}, PROFILES["quick"], sizes)
    async with open_stack(settings, ("projector", "agent", "trainer"), "bench") as stack:
        device = await stack.local_device()
        await Campaign(stack, device).run(chunks, lambda *_: None)
        await stack.caught_up()
        reply = await stack.bus.nc.request(
            train_subject(settings), orjson.dumps({"device_id": device}), timeout=900
        )
        answer = orjson.loads(reply.data)
        if not answer.get("ok"):
            raise SystemExit(f"training failed: {answer.get('error')}")


def cpu_by_process(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by `serve` and each process under it, by name:
    a figure that other load on the machine inflates far less than latency."""
    root = psutil.Process(pid)
    used: dict[str, float] = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            command = process.cmdline()
        except psutil.Error:
            continue
        service = re.search(r"\bservice (\w+)", " ".join(command))
        title = process.name()  # a forked service names itself hpcds1-NAME (serve --processes)
        if service:
            name = service.group(1)
        elif title.startswith("hpcds1-"):
            name = title.removeprefix("hpcds1-")
        else:
            name = Path(command[0]).name
        used[name] = used.get(name, 0.0) + times.user + times.system
    return used


def cpu_per_request(before: dict[str, float], after: dict[str, float], n: int) -> str:
    spent = {k: after[k] - before.get(k, 0.0) for k in after}
    total = sum(spent.values())
    top = sorted(spent.items(), key=lambda kv: -kv[1])[:4]
    parts = ", ".join(f"{k} {1000 * v / n:.2f}" for k, v in top)
    return f"CPU {1000 * total / n:.2f} ms/request ({parts})"


def profiler(pid: int, out: Path | None, name: str) -> subprocess.Popen[bytes] | None:
    """py-spy sampling `serve` (and any process it starts) until stopped with SIGINT."""
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).parent / "py-spy"
    command = [str(spy), "record", "--pid", str(pid), "--subprocesses", "--rate", "250"]
    return subprocess.Popen(
        [*command, "--format", "flamegraph", "--output", str(out / f"{name}.svg"), "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def stop_profiler(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is None:
        return
    spy.send_signal(signal.SIGINT)  # py-spy writes the flame graph on SIGINT
    _, err = spy.communicate(timeout=120)
    if spy.returncode not in (0, -signal.SIGINT):
        print(f"py-spy failed ({spy.returncode}): {err.decode()[-500:]}", file=sys.stderr)


def measure(
    url: str,
    n: int,
    clients: int,
    headers: dict[str, str],
    spy: tuple[int, Path | None, str] | None = None,
    client: str = "auto",
    seconds: float = 10.0,
) -> Load:
    """One measurement: wrk for `seconds` (after a 2 s warm-up) where installed and not told
    otherwise, else n requests from httpx (after 50 warm-ups)."""
    use_wrk = client == "wrk" or (client == "auto" and wrk_path() is not None)
    if not use_wrk:

        def around() -> Callable[[], None]:
            recorder = profiler(*spy) if spy else None
            return lambda: stop_profiler(recorder)

        return asyncio.run(run_httpx(url, "/v1/decide", BODY, headers, clients, n, around))
    run_wrk(url, "/v1/decide", BODY, headers, clients, 2)  # warm-up: connections, caches
    recorder = profiler(*spy) if spy else None
    try:
        return run_wrk(url, "/v1/decide", BODY, headers, clients, seconds)
    finally:
        stop_profiler(recorder)


async def main(
    n: int,
    kept: Path | None,
    profile: Path | None,
    extra: list[str],
    client: str = "auto",
    seconds: float = 10.0,
    tls_mode: str = "loopback",
    rounds: int = 1,
) -> None:
    home = kept or Path(tempfile.mkdtemp(prefix="hpcds1-bench-decide-"))
    settings = Settings(home=home, port=free_port(), log_level="warning")
    # A home with a model of its own (a real setup) is used as it is: preparing it would add
    # the tiny measurements to it and train its next model on them.
    has_model = any(settings.models_dir.glob("*.onnx"))
    if kept is not None and ((home / PREPARED).exists() or has_model):
        print(f"reusing the prepared home {home}", flush=True)
    else:
        print(f"preparing: tiny real setup + training in {home} ...", flush=True)
        started = time.perf_counter()
        await prepare(settings)
        (home / PREPARED).touch()
        print(f"  ready in {time.perf_counter() - started:.0f} s", flush=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(home), HPC_DS1_PORT=str(settings.port), HPC_DS1_LOG_LEVEL="warning")
    env.update(item.partition("=")[::2] for item in extra)
    modes: list[str | None] = {"loopback": [None], "off": ["off"], "on": ["on"]}.get(
        tls_mode, ["off", "on"]
    )
    measured: dict[str | None, list[tuple[Load, Load]]] = {mode: [] for mode in modes}
    for _ in range(rounds if len(modes) == 2 else 1):  # alternating: others' load hits both
        for mode in modes:
            mode_env = dict(env)
            if mode is not None:
                tls_setting = "auto" if mode == "on" else "off"
                mode_env.update(HPC_DS1_HOST="0.0.0.0", HPC_DS1_TLS=tls_setting)
            measured[mode].append(
                await _against_serve(
                    mode_env, settings.port, mode, home, n, profile, client, seconds
                )
            )
    if len(modes) == 2:
        plain = statistics.median(many.rps for _, many in measured["off"])
        secured = statistics.median(many.rps for _, many in measured["on"])
        ratio = secured / plain
        by_round = "; ".join(
            f"{b[1].rps:.0f} / {a[1].rps:.0f}"
            for a, b in zip(measured["off"], measured["on"], strict=True)
        )
        print(
            f"HTTPS / HTTP, same run, {len(measured['on'])} round(s) alternating, 8 clients: "
            f"median {secured:.0f} / {plain:.0f} requests/s = {100 * ratio:.1f} % (target >= "
            f"90 %: {'met' if ratio >= 0.9 else 'MISSED'}); by round (https / http): {by_round}"
        )


async def _against_serve(
    env: dict[str, str],
    port: int,
    mode: str | None,
    home: Path,
    n: int,
    profile: Path | None,
    client: str,
    seconds: float,
) -> tuple[Load, Load]:
    """One `serve` of the prepared home, measured with 1 then 8 clients; printed."""
    serve = subprocess.Popen(
        [str(Path(sys.executable).parent / "hpc-ds1"), "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    local = f"http://127.0.0.1:{port}"
    if mode is None:
        url, where = local, "loopback"
    else:
        host = reachable_host("0.0.0.0")
        if host.startswith("127.") or not host[0].isdigit():
            raise SystemExit(f"no non-loopback address to measure on (found {host})")
        url = f"{'https' if mode == 'on' else 'http'}://{host}:{port}"
        where = f"{url.split(':')[0]} to {host} (serve --host 0.0.0.0)"
    try:
        async with httpx.AsyncClient(base_url=local) as http:
            while (await _ready(http)) is False:
                if serve.poll() is not None:
                    raise SystemExit("hpc-ds1 serve exited")
                await asyncio.sleep(0.2)
            # Every call carries a credential: the home's own CLI token, as the CLI sends it.
            headers = await _home_credential(http, home)
        if mode == "on":
            pin = tls.home_pin(home)
            async with httpx.AsyncClient(
                verify=tls.client_context(tls.HomeTLS.of(home).ca_cert.read_text())
            ) as pinned:  # HTTPS really served, with the home's CA
                assert (await pinned.get(f"{url}/healthz")).status_code == 200, pin
        cpu_start = cpu_by_process(serve.pid)
        spy = (serve.pid, profile, f"decide-1-client{'-' + mode if mode else ''}")
        one = await asyncio.to_thread(measure, url, n, 1, headers, spy, client, seconds)
        cpu_one = cpu_by_process(serve.pid)
        spy = (serve.pid, profile, f"decide-8-clients{'-' + mode if mode else ''}")
        many = await asyncio.to_thread(measure, url, n, 8, headers, spy, client, seconds)
        cpu_many = cpu_by_process(serve.pid)
    finally:
        serve.terminate()
        serve.wait(60)
    warm = 50 if one.client == "httpx" else 0  # wrk's warm-up requests are not counted
    print(
        f"POST /v1/decide with telemetry, {where}, to `hpc-ds1 serve` (gateway -> NATS -> "
        f"decision service -> decision event), client {one.client}, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    rows = (("1 client ", one, (cpu_start, cpu_one)), ("8 clients", many, (cpu_one, cpu_many)))
    for label, load, cpu in rows:
        print(
            f"  {label}: p50 {load.p50_ms:.2f} ms  p99 {load.p99_ms:.2f} ms  "
            f"{load.rps:.0f} requests/s ({load.requests} in {load.seconds:.1f} s)  "
            f"{cpu_per_request(*cpu, load.requests + warm)}",
            flush=True,
        )
    return one, many


async def _home_credential(http: httpx.AsyncClient, home: Path) -> dict[str, str]:
    for _ in range(300):
        token = read_cli_token(home)
        if token is not None:
            headers = {"Authorization": f"Bearer {token}"}
            if (await http.get("/v1/whoami", headers=headers)).status_code == 200:
                return headers
        await asyncio.sleep(0.1)
    raise SystemExit("the home's CLI token never became valid")


async def _ready(http: httpx.AsyncClient) -> bool:
    try:
        return (await http.get("/readyz")).status_code == 200
    except httpx.HTTPError:
        return False


PREPARED = "bench-decide-prepared"  # marks a home whose setup and training are done

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", type=int, nargs="?", default=2000, help="requests per measurement")
    parser.add_argument("--home", type=Path, help="keep (and reuse) the prepared home here")
    parser.add_argument("--profile", type=Path, help="write py-spy flame graphs (SVG) here")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for `serve` (e.g. HPC_DS1_TOKEN_CACHE_S=0: the gateway's token cache "
        "off, for a before/after in one run)",
    )
    parser.add_argument(
        "--client",
        choices=("auto", "wrk", "httpx"),
        default="auto",
        help="the load generator: wrk (C; auto picks it where installed) or httpx (Python)",
    )
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="length of each wrk measurement"
    )
    parser.add_argument(
        "--tls",
        choices=("loopback", "off", "on", "both"),
        default="loopback",
        help="loopback: plain HTTP on 127.0.0.1 (as before); off/on: serve --host 0.0.0.0, "
        "plain/HTTPS to this machine's address; both: off then on, with the ratio",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --tls both: rounds of (http, https), alternating; the ratio is of medians",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    if any("=" not in item for item in args.env):
        parser.error("--env takes NAME=VALUE")
    asyncio.run(
        main(
            args.n,
            args.home,
            args.profile,
            args.env,
            args.client,
            args.seconds,
            args.tls,
            args.rounds,
        )
    )
