"""`hpc-ds1 serve` with its services in one process against each in its own process, in the same
run on the same home: POST /v1/decide with telemetry through the gateway (a decision event
appended for each), p50/p99 and requests/s with 1 and 8 clients (as bench_decide_http.py).
Run: `python benchmarks/bench_serve_modes.py [N] [--rounds R]`; the modes alternate R times
(default 2) so a change in the machine's load falls on both."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decide_http import _home_credential, _ready, measure, prepare
from loadgen import wrk_path

from hpc_ds1.infra.ports import free_port
from hpc_ds1.settings import Settings

MODES = {"one process": ["--one-process"], "separate processes": ["--processes"]}


async def one_mode(
    home: Path, port: int, flags: list[str], n: int, client: str = "auto"
) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(home), HPC_DS1_PORT=str(port), HPC_DS1_LOG_LEVEL="warning")
    serve = subprocess.Popen(
        [str(Path(sys.executable).parent / "hpc-ds1"), "serve", *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    launched = time.perf_counter()
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            while (await _ready(http)) is False:
                if serve.poll() is not None:
                    raise SystemExit("hpc-ds1 serve exited")
                await asyncio.sleep(0.2)
            ready_s = time.perf_counter() - launched
            headers = await _home_credential(http, home)
        one = await asyncio.to_thread(measure, url, n, 1, headers, None, client)
        many = await asyncio.to_thread(measure, url, n, 8, headers, None, client)
    finally:
        serve.terminate()
        serve.wait(120)
    return {
        "ready_s": ready_s,
        "p50_1": one.p50_ms,
        "p99_1": one.p99_ms,
        "rps_1": one.rps,
        "p50_8": many.p50_ms,
        "p99_8": many.p99_ms,
        "rps_8": many.rps,
    }


async def main(n: int, rounds: int, home: Path | None, client: str = "auto") -> None:
    if home is None:
        home = Path(tempfile.mkdtemp(prefix="hpcds1-bench-modes-"))
        settings = Settings(home=home, port=free_port(), log_level="warning")
        print(f"preparing: tiny real setup + training in {home} ...", flush=True)
        await prepare(settings)
    else:  # a home an earlier run prepared (printed above its figures)
        settings = Settings(home=home, port=free_port(), log_level="warning")
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for round_ in range(rounds):
        for mode, flags in MODES.items():
            started = time.perf_counter()
            found = await one_mode(home, settings.port, flags, n, client)
            results[mode].append(found)
            print(
                f"  round {round_ + 1} {mode:<19}: 1 client p50 {found['p50_1']:.2f} ms p99 "
                f"{found['p99_1']:.2f} ms; 8 clients p50 {found['p50_8']:.2f} ms p99 "
                f"{found['p99_8']:.2f} ms {found['rps_8']:.0f} requests/s; ready after "
                f"{found['ready_s']:.1f} s "
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    used = "wrk" if client == "wrk" or (client == "auto" and wrk_path()) else "httpx"
    per = "10 s of wrk" if used == "wrk" else f"{n} requests"
    print(f"POST /v1/decide with telemetry through `hpc-ds1 serve`, {per} per figure, ")
    print(f"median of {rounds} alternating rounds, on {os.cpu_count()} CPUs, load average")
    print(f"{os.getloadavg()[0]:.1f} at the end")
    print(f"  {'mode':<19} {'1 client p50/p99 ms':>20} {'req/s':>7} {'8 clients p50/p99 ms':>21}")
    medians: dict[str, dict[str, float]] = {}
    for mode, runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        medians[mode] = med
        print(
            f"  {mode:<19} {med['p50_1']:>9.2f} / {med['p99_1']:<8.2f} {med['rps_1']:>7.0f} "
            f"{med['p50_8']:>9.2f} / {med['p99_8']:<8.2f} {med['rps_8']:>7.0f} requests/s, "
            f"ready after {med['ready_s']:.1f} s"
        )
    base, new = medians["one process"], medians["separate processes"]
    print(
        f"  separate / one process: requests/s x{new['rps_8'] / base['rps_8']:.2f} with 8 "
        f"clients, p99 x{new['p99_1'] / base['p99_1']:.2f} with 1 client"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("n", nargs="?", type=int, default=1000, help="requests per figure")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the modes")
    parser.add_argument("--home", type=Path, help="reuse a home an earlier run prepared")
    parser.add_argument(
        "--client",
        choices=("auto", "wrk", "httpx"),
        default="auto",
        help="the load generator: wrk (C; auto picks it where installed) or httpx (Python)",
    )
    args = parser.parse_args()
    asyncio.run(main(args.n, args.rounds, args.home, args.client))
