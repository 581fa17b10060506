"""The per-request cost of GET /metrics' request timing: ASGI calls with and without the
`RequestMetrics` middleware, in-process, no network, no I/O.

Two comparisons, each alternating the two variants in rounds: the middleware alone, around an
app that answers at once; then the gateway's real edge (RequestLog -> BodyLimit -> a one-route
FastAPI app answering POST /v1/decide with a small JSON body, the route a decision takes) with
and without RequestMetrics outermost. It prints the median time per request of each and their
difference (the middleware's cost) with its spread over rounds. Times are this process's CPU
time (time.process_time), so a busy shared machine inflates them less than wall time.
Run: `python benchmarks/bench_metrics_middleware.py [N] [--rounds R]`."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import MutableMapping
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from hpc_ds1.log import configure
from hpc_ds1.services.gateway.edge.metrics import RequestMetrics, request_histogram
from hpc_ds1.services.gateway.edge.middleware import BodyLimit, RequestLog

BODY = b'{"workload":"gemm","size":64,"config":{"ranks":1,"threads":2,"tile":32}}'


def build(with_metrics: bool) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/decide")
    async def decide() -> dict[str, Any]:
        return {"choice": "threads_up", "confidence": 0.9, "mode": "auto"}

    app.add_middleware(BodyLimit, max_bytes=1 << 20)
    app.add_middleware(RequestLog)
    if with_metrics:
        app.add_middleware(RequestMetrics, histogram=request_histogram(CollectorRegistry()))
    return app


def decide_scope() -> dict[str, Any]:
    """The ASGI scope of POST /v1/decide with BODY, as uvicorn hands it to the app."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/decide",
        "raw_path": b"/v1/decide",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"gw"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BODY)).encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8765),
    }


async def per_request(app: Any, n: int) -> float:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        return None

    # CPU time of this process: on a shared machine, time spent preempted is not counted.
    scope = decide_scope()
    started = time.process_time()
    for _ in range(n):
        await app(dict(scope), receive, send)
    return (time.process_time() - started) / n


class _Bare:
    """An ASGI app that answers at once, as a routed FastAPI endpoint would (the route in the
    scope): what is left of a request is the middleware's own work."""

    def __init__(self) -> None:
        self.route = build(False).router.routes[-1]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        scope["route"] = self.route
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def main(n: int, rounds: int) -> None:
    configure("warning", json=True)  # the request log line is built but not printed
    bare = _Bare()
    alone = RequestMetrics(bare, request_histogram(CollectorRegistry()))  # type: ignore[arg-type]
    await compare(
        "the middleware alone, around an app that answers at once", bare, alone, n, rounds
    )
    await compare(
        "the gateway's edge (RequestLog, BodyLimit) and a FastAPI route",
        build(False),
        build(True),
        n,
        rounds,
    )


async def compare(what: str, plain: Any, timed: Any, n: int, rounds: int) -> None:
    await per_request(plain, 500)  # warm both (FastAPI builds its route caches on first use)
    await per_request(timed, 500)
    without, with_, diffs = [], [], []
    for _ in range(rounds):
        a = await per_request(plain, n)
        b = await per_request(timed, n)
        without.append(a)
        with_.append(b)
        diffs.append(b - a)
    print(f"{what}: in-process ASGI calls, CPU time, {rounds} alternating rounds of {n}")
    print(f"  without RequestMetrics: median {1e6 * statistics.median(without):.1f} µs/request")
    print(f"  with RequestMetrics   : median {1e6 * statistics.median(with_):.1f} µs/request")
    print(
        f"  difference: median {1e6 * statistics.median(diffs):.1f} µs/request "
        f"(min {1e6 * min(diffs):.1f}, max {1e6 * max(diffs):.1f})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", type=int, nargs="?", default=5000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.rounds))
