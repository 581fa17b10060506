"""The HTTP load for the decide benchmarks: wrk (C, one thread) where it is installed, else an
httpx client in this Python process.

Both clients run on the machine they measure. On 2 cores an httpx client spends about as much
CPU per request as the server's gateway does, so it takes that CPU from the server and the
figures measure the client as much as the server: with 8 connections wrk got 450 requests/s
from the `serve` where httpx got 224-255 (19:00-19:07 on 30 Nov 2026, load 1-2). Serious HTTP
benchmarks use a C load generator for that reason. wrk: `apt install wrk`
(`deploy/install-wrk.sh`, run by `make bench-decide-http`)."""

from __future__ import annotations

import asyncio
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson


@dataclass(frozen=True)
class Load:
    client: str  # "wrk" or "httpx"
    connections: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def wrk_path() -> str | None:
    return shutil.which("wrk")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _latency_ms(text: str, label: str) -> float:
    found = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)
    if found is None:
        raise SystemExit(f"wrk printed no {label}% latency:\n{text}")
    return float(found[1]) * _UNIT_MS[found[2]]


def parse_wrk(text: str, connections: int) -> Load:
    """wrk --latency's report as a Load; a non-2xx answer stops the benchmark."""
    done = re.search(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m)", text, re.M)
    if done is None:
        raise SystemExit(f"wrk printed no request count:\n{text}")
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    if bad:
        raise SystemExit(f"{bad[1]} requests were refused:\n{text}")
    errors = re.search(r"Socket errors: .*", text)
    if errors and re.search(r"[1-9]", errors[0]):
        raise SystemExit(f"wrk: {errors[0]}")
    return Load(
        "wrk",
        connections,
        int(done[1]),
        float(done[2]) * _UNIT_MS[done[3]] / 1000,
        _latency_ms(text, "50"),
        _latency_ms(text, "99"),
    )


def run_wrk(
    url: str,
    path: str,
    body: dict[str, object],
    headers: dict[str, str],
    connections: int,
    seconds: float,
) -> Load:
    """POST `body` to `path` on `connections` keep-alive connections for `seconds`."""
    wrk = wrk_path()
    if wrk is None:
        raise SystemExit("wrk is not installed: apt install wrk (or --client httpx)")
    lines = [
        'wrk.method = "POST"',
        f"wrk.body = {_lua(orjson.dumps(body).decode())}",
        'wrk.headers["Content-Type"] = "application/json"',
        *(f"wrk.headers[{_lua(k)}] = {_lua(v)}" for k, v in headers.items()),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"  # holds the token: private, removed at once
        script.write_text("\n".join(lines) + "\n")
        script.chmod(0o600)
        command = [wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s"]
        done = subprocess.run(
            [*command, str(script), url + path], capture_output=True, text=True, check=False
        )
    if done.returncode != 0:
        raise SystemExit(f"wrk failed ({done.returncode}): {done.stderr[-500:]}")
    return parse_wrk(done.stdout, connections)


def _lua(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


async def run_httpx(
    url: str,
    path: str,
    body: dict[str, object],
    headers: dict[str, str],
    connections: int,
    n: int,
    around: Callable[[], Callable[[], None]] | None = None,
) -> Load:
    """POST `body` n times from `connections` concurrent httpx clients (after 50 warm-ups)."""
    latencies: list[float] = []
    queue = iter(range(n))

    async def client(http: httpx.AsyncClient) -> None:
        for _ in queue:
            started = time.perf_counter()
            reply = await http.post(path, json=body)
            latencies.append(time.perf_counter() - started)
            if reply.status_code != 200:
                raise SystemExit(f"{path} answered {reply.status_code}: {reply.text}")

    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30, headers=headers) as http:
        for _ in range(50):  # warm-up: connections, model load, caches
            await http.post(path, json=body)
        stop = around() if around else None
        try:
            started = time.perf_counter()
            await asyncio.gather(*(client(http) for _ in range(connections)))
            elapsed = time.perf_counter() - started
        finally:
            if stop:
                stop()
    return Load(
        "httpx",
        connections,
        n,
        elapsed,
        1000 * statistics.median(latencies),
        1000 * percentile(latencies, 0.99),
    )
