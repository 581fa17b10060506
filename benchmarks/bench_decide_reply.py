"""What the gateway spends on a decision's reply: POST /v1/decide answered by a one-route
FastAPI app that validates the decision service's answer into `Decision` and lets FastAPI
serialize it (before), against one that sends the service's JSON as it is with orjson, the
documented `response_model` unchanged (after, services/gateway/api/decide.py). In-process ASGI
calls, no network; the two alternate in rounds and each round's time is this process's CPU
time (time.process_time), so a busy shared machine inflates them less than wall time. Both
bodies are checked to be the same JSON first.
Run: `python benchmarks/bench_decide_reply.py [N] [--rounds R]`."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Response

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_metrics_middleware import BODY, decide_scope, per_request

from hpc_ds1.services.gateway.schemas import Decision

MOVES = ("RANKS_UP", "RANKS_DOWN", "THREADS_UP", "THREADS_DOWN", "TILE_UP", "TILE_DOWN", "STOP")
CONFIG = {"ranks": 1, "threads": 2, "tile": 128, "gpu": False}
# The shape of a real answer with telemetry: every field the decision service sends.
ANSWER: dict[str, Any] = {
    "decision_id": "3f2b8c1e-5d7a-4a4a-9b9b-0a1b2c3d4e5f",
    "device_id": "85410933ed2a9e97",
    "source": "api",
    "workload": "gemm",
    "size": 1280,
    "config": CONFIG,
    "choice": "THREADS_UP",
    "confidence": 0.9312,
    "mode": "auto",
    "reasons": [],
    "alternatives": {m: round(0.9 / len(MOVES), 4) for m in MOVES},
    "model_version": "4d719f4ec65790d5",
    "session_id": None,
    "telemetry": {"runtime_s": 0.031, "throughput": None},
    "ran": False,
    "predicted_runtime_s": 0.0301,
    "predicted_runtimes_s": dict.fromkeys(MOVES, 0.0302),
    "familiarity": {"distance": 0.41, "threshold": 1.2, "familiar": True},
    "system1": {
        "config": {**CONFIG, "ranks": 2, "threads": 1},
        "label": "ranks=2 threads=1 tile=128 gpu=False",
        "predicted_runtime_s": 0.028,
        "confidence": 0.8,
        "mode": "confirm",
        "reasons": ["confidence 0.80 below the auto threshold 0.85"],
    },
    "actor": "cli",
}


def validated_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/decide")
    async def decide(response: Response) -> Decision:
        return Decision.model_validate(ANSWER)

    return app


def forwarded_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/decide", response_model=Decision)
    async def decide(response: Response) -> Response:
        reply = Response(orjson.dumps(ANSWER), media_type="application/json")
        reply.raw_headers.extend(response.raw_headers)
        return reply

    return app


async def body_of(app: Any) -> Any:
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(decide_scope(), receive, send)
    return orjson.loads(b"".join(chunks))


@dataclass(frozen=True)
class Reply:
    validated_s: list[float]  # per round: CPU seconds per request
    forwarded_s: list[float]

    @property
    def saved_s(self) -> list[float]:
        return [a - b for a, b in zip(self.validated_s, self.forwarded_s, strict=True)]


async def measure(n: int, rounds: int) -> Reply:
    before, after = validated_app(), forwarded_app()
    if await body_of(before) != await body_of(after):
        raise AssertionError("the forwarded body is not the JSON FastAPI's serialization gives")
    await per_request(before, min(n, 500))  # warm both: FastAPI builds its caches on first use
    await per_request(after, min(n, 500))
    validated, forwarded = [], []
    for _ in range(rounds):
        validated.append(await per_request(before, n))
        forwarded.append(await per_request(after, n))
    return Reply(validated, forwarded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", type=int, nargs="?", default=3000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    r = asyncio.run(measure(args.n, args.rounds))
    us = 1e6
    print(f"POST /v1/decide's reply in-process, CPU time, {args.rounds} rounds of {args.n}")
    print(
        f"  validated into Decision: median {us * statistics.median(r.validated_s):.1f} µs/request"
    )
    print(
        f"  forwarded as it is     : median {us * statistics.median(r.forwarded_s):.1f} µs/request"
    )
    print(
        f"  saved: median {us * statistics.median(r.saved_s):.1f} µs/request "
        f"(min {us * min(r.saved_s):.1f}, max {us * max(r.saved_s):.1f}); ratio after/before "
        f"{statistics.median(r.forwarded_s) / statistics.median(r.validated_s):.2f}"
    )


if __name__ == "__main__":
    main()
