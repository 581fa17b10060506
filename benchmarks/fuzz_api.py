"""Generated requests against the gateway's own OpenAPI spec (schemathesis + hypothesis), for each
role and for no credential, on a real stack: embedded NATS and Postgres (or the servers named by
HPC_DS1_NATS_URL / HPC_DS1_DATABASE_URL), the projector, the decision service, the coordinator
and the gateway, with no agent: no device ever joins, so a decision or a session that would run a
job is refused (409) and nothing runs for real.

Run: `python benchmarks/fuzz_api.py [--requests 5000] [--seed 1]`. Prints the requests sent,
the responses by status class, and the responses that broke the spec (a status it does not
declare, a body that does not match the declared schema, or any 5xx), in total and per role.
Exit status 1 when any response was >= 500 or broke the spec.

GET /readyz is left out: it takes no input, and with services deliberately absent (the agent)
its honest answer is 503; tests/services/gateway/test_gateway.py covers it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import Engine

from hpc_ds1 import log
from hpc_ds1.db import make_engine
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.infra.ports import free_port
from hpc_ds1.process.runtime import NatsUrls, run_services
from hpc_ds1.security.credentials import publish_token
from hpc_ds1.security.tokens import new_token
from hpc_ds1.settings import Settings

ROLES: tuple[str | None, ...] = ("viewer", "engineer", "admin", "agent", None)
SERVICES = ("projector", "decision", "coordinator", "gateway")
# /v1/stream never ends (Server-Sent Events): tests/console/test_console_serving.py checks it.
SKIPPED = {("GET", "/readyz"), ("GET", "/v1/stream")}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def role_name(role: str | None) -> str:
    return role or "none"


@dataclass
class Report:
    requests: int = 0
    by_class: Counter[str] = field(default_factory=Counter)
    by_role: dict[str, Counter[str]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    violations_by_role: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def server_errors(self) -> int:
        return self.by_class["5xx"]

    def record(self, role: str | None, status: int) -> None:
        kind = f"{status // 100}xx"
        self.requests += 1
        self.by_class[kind] += 1
        self.by_role.setdefault(role_name(role), Counter())[kind] += 1

    def violation(self, role: str | None, where: str, failures: list[Failure]) -> None:
        self.violations_by_role[role_name(role)] += 1
        titles = "; ".join(sorted({f.title for f in failures}))
        self.violations.append(f"{where} as {role_name(role)}: {titles}")

    def lines(self) -> list[str]:
        classes = "  ".join(f"{k} {v}" for k, v in sorted(self.by_class.items()))
        out = [
            f"generated requests: {self.requests} in {self.seconds:.1f} s",
            f"responses by status class: {classes}",
            f"responses >= 500: {self.server_errors}",
            f"responses breaking the spec: {len(self.violations)}",
            "per role:",
        ]
        for role in (role_name(r) for r in ROLES):
            counts = self.by_role.get(role, Counter())
            shown = "  ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            out.append(
                f"  {role:<9} {sum(counts.values()):>6} requests  {shown}  "
                f"spec violations {self.violations_by_role[role]}"
            )
        out += [f"  ! {v}" for v in self.violations[:20]]
        return out


def fuzz(base_url: str, tokens: dict[str, str], total: int, seed: int) -> Report:
    """About `total` generated requests, spread over every operation, role and generation mode
    (positive: valid input; negative: input the spec forbids). Blocking."""
    report = Report()
    session = requests.Session()
    spec = session.get(f"{base_url}/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(spec)
    operations = [
        result.ok()
        for result in schema.get_all_operations()
        if (result.ok().method.upper(), result.ok().path) not in SKIPPED
    ]
    modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    runs = [(op, role, mode) for op in operations for role in ROLES for mode in modes]
    started = time.perf_counter()
    # Operations with little to vary run out of new inputs early: rounds with fresh seeds go
    # on until `total` requests were sent.
    for round_ in range(100):
        before = report.requests
        per_run = max(1, math.ceil((total - report.requests) / len(runs)))
        for operation, role, mode in runs:
            if report.requests >= total:
                break
            headers = {"Authorization": f"Bearer {tokens[role]}"} if role else {}
            _run(operation, mode, role, headers, base_url, session, per_run, seed + round_, report)
        if report.requests >= total or report.requests == before:
            break
    report.seconds = time.perf_counter() - started
    return report


def _run(
    operation: Any,
    mode: GenerationMode,
    role: str | None,
    headers: dict[str, str],
    base_url: str,
    session: requests.Session,
    examples: int,
    seed: int,
    report: Report,
) -> None:
    where = f"{operation.method.upper()} {operation.path} ({mode.value})"

    @hypothesis.seed(seed)
    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def one(case: Any) -> None:
        response = case.call(base_url=base_url, session=session, headers=headers, timeout=60)
        report.record(role, response.status_code)
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except FailureGroup as group:
            report.violation(role, f"{where} -> {response.status_code}", list(group.exceptions))
        except Failure as failure:
            report.violation(role, f"{where} -> {response.status_code}", [failure])

    try:
        one()
    except hypothesis.errors.Unsatisfiable:
        pass  # a negative mode with nothing to negate (no parameters): nothing to send


async def grant_roles(bus: EventBus, engine: Engine) -> dict[str, str]:
    """One token per role, registered and folded by the running projector."""
    tokens: dict[str, str] = {}
    for role in ROLES:
        if role is None:
            continue
        token = new_token()
        active = await publish_token(
            bus,
            engine,
            token,
            holder=f"fuzz-{role}",
            role=role,
            source="fuzz",
            wait_s=60,  # type: ignore[arg-type]
        )
        if not active:
            raise RuntimeError(f"the {role} token was not folded within 60 s")
        tokens[role] = token
    return tokens


@contextlib.asynccontextmanager
async def fuzz_stack(
    settings: Settings, nats_url: NatsUrls, database_url: str, cli_nats_url: str
) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """The services the gateway calls and the gateway itself (no agent: nothing can run), and a
    token per role. Yields (base URL, tokens)."""
    stop = asyncio.Event()
    running = asyncio.create_task(run_services(SERVICES, settings, nats_url, database_url, stop))
    bus = await EventBus.connect(settings, cli_nats_url, "fuzz")
    engine = make_engine(database_url, pool_size=2)
    base = f"http://127.0.0.1:{settings.port}"
    try:
        async with httpx.AsyncClient(base_url=base) as http:
            for _ in range(600):
                if running.done():
                    running.result()
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/healthz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        tokens = await grant_roles(bus, engine)
        yield base, tokens
    finally:
        stop.set()
        await bus.close()
        engine.dispose()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 60)


async def run_fuzz(
    settings: Settings,
    nats_url: NatsUrls,
    database_url: str,
    cli_nats_url: str,
    total: int,
    seed: int,
) -> Report:
    async with fuzz_stack(settings, nats_url, database_url, cli_nats_url) as (base, tokens):
        return await asyncio.to_thread(fuzz, base, tokens, total, seed)


async def main(total: int, seed: int) -> int:
    import os

    from hpc_ds1.infra.home import Endpoints, own_home

    log.configure("error", json=False)  # one line per request would drown the figures
    home = Path(tempfile.mkdtemp(prefix="hpcds1-fuzz-"))
    settings = Settings(
        home=home,
        port=free_port(),
        log_level="error",
        nats_url=os.environ.get("HPC_DS1_NATS_URL"),
        database_url=os.environ.get("HPC_DS1_DATABASE_URL"),
    )
    print(f"fuzzing the gateway in {home}: ~{total} generated requests, seed {seed}", flush=True)
    with own_home(settings) as ends:
        endpoints: Endpoints = ends
        report = await run_fuzz(
            settings,
            endpoints.nats_url_for,
            endpoints.app_database_url(),
            endpoints.nats_url_for("cli"),
            total,
            seed,
        )
    for line in report.lines():
        print(line)
    return 1 if report.server_errors or report.violations else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.requests, args.seed)))
