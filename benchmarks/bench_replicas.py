"""Replicas under kill -9: the compose file's services as `hpc-ds1 service NAME` processes on one
NATS and one Postgres, with two gateways (sharing the port), two decision services and two
projectors (one active, one standby). Each round sends decisions from C clients (a new
connection each, retried on an error, as a client does) and, a third of the way in, kills -9
one gateway, one decision replica and the active projector, then starts a new copy of each (as
a container's restart policy would). After each round: every acknowledged decision is in the
log once and projected once, nothing appended twice, the audit chain intact.
Run: `make bench-replicas` or `python benchmarks/bench_replicas.py [--rounds R] [--requests N]`.
It first measures a tiny real setup and trains a model on it (a few minutes)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_decide_http import prepare
from sqlalchemy import Engine, select

from hpc_ds1.db import make_engine, tables, upgrade
from hpc_ds1.eventlog.audit import verify
from hpc_ds1.infra.nats_server import EmbeddedNats
from hpc_ds1.infra.ports import free_port
from hpc_ds1.infra.postgres import EmbeddedPostgres
from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.settings import Settings
from tests.deploy.processes import Deployment, caught_up, give_model, statuses, stream_ids
from tests.deploy.test_processes import decide_with_retries


def wait(what: str, check: Any, within_s: float = 180.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {within_s:g} s")
        time.sleep(0.3)


def one_round(
    deployment: Deployment, engine: Engine, headers: dict[str, str], n: int, clients: int
) -> dict[str, Any]:
    settings = deployment.settings
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    threads = [
        threading.Thread(
            target=decide_with_retries,
            args=(deployment.url, headers, results, errors, n // clients),
        )
        for _ in range(clients)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    while len(results) < n // 3:
        time.sleep(0.02)
    answered = {s["pid"]: s["answered"] for s in statuses(settings, "decision")}
    victims = [
        next(c for c in deployment.of("gateway") if c.alive()),
        next(c for c in deployment.of("decision") if c.alive()),
        next(c for c in deployment.of("projector") if c.alive() and c.logged("active")),
    ]
    killed_at = time.time()
    for victim in victims:
        victim.kill9()
    for thread in threads:
        thread.join(600)
    elapsed = time.perf_counter() - started
    # The killed ones come back (a restart policy); the standby projector is active now.
    for victim in victims:
        deployment.start(victim.service)
    takeover = _takeover_s(deployment, killed_at)
    caught_up(engine, settings, within_s=180)
    ids = stream_ids(settings)
    made = [i for i, t in ids if t == "decision.made"]
    with engine.connect() as conn:
        rows = [r[0] for r in conn.execute(select(tables.decisions.c.decision_id)).all()]
    acknowledged = {r["decision_id"] for r in results}
    by_replica: dict[str, int] = {}
    for r in results:
        by_replica[r["replica"]] = by_replica.get(r["replica"], 0) + 1
    return {
        "acknowledged": len(acknowledged),
        "lost": len(acknowledged - set(rows)),
        "duplicated_events": len(ids) - len({i for i, _ in ids}),
        "duplicated_rows": len(rows) - len(set(rows)),
        "unprojected": len(made) - len(rows),
        "retries": len(errors),
        "gateways": sorted(by_replica.values()),
        "decision_answered": sorted(answered.values()),
        "takeover_s": takeover,
        "requests_per_s": len(results) / elapsed,
        "audit_intact": verify(settings.audit_path).intact,
    }


def _takeover_s(deployment: Deployment, killed_at: float) -> float:
    """Seconds from the kill to the standby projector saying it is active (by its log)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for copy in deployment.of("projector"):
            took = [r for r in copy.logged("active") if r.get("took_over")]
            if took and copy.alive():
                at = datetime.fromisoformat(took[-1]["timestamp"].replace("Z", "+00:00"))
                return at.timestamp() - killed_at
        time.sleep(0.2)
    return float("nan")


def main(rounds: int, n: int, clients: int, model: Path | None) -> int:
    root = Path(tempfile.mkdtemp(prefix="hpcds1-bench-replicas-"))
    nats = EmbeddedNats(root / "nats", sync="default")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pg = EmbeddedPostgres(root / "pg", durable=False)
        database_url = pg.start()
    try:
        settings = Settings(
            home=root / "home",
            nats_url=nats.start(),
            database_url=database_url,
            port=free_port(),
            log_level="info",
            log_json=True,
        )
        engine = make_engine(database_url, pool_size=2)
        upgrade(engine)
        if model is None:
            print(f"preparing: tiny real setup + training in {root} ...", flush=True)
            asyncio.run(prepare(settings))
        else:  # a model trained earlier on this machine (its file name is its version)
            give_model(settings, fingerprint().device_id, model.stem, model.read_bytes())
        deployment = Deployment(settings, root / "logs", {"HPC_DS1_REUSE_PORT": "true"})
        with deployment.running(sorted(deployment.spec)):
            deployment.wait_ready()
            for service in ("gateway", "decision", "projector"):
                deployment.start(service)
            wait("two decision replicas", lambda: len(statuses(settings, "decision")) == 2, 240)
            headers = deployment.headers()
            outcomes = []
            print(f"{rounds} rounds of {n} decisions from {clients} clients, kill -9 mid-load")
            for round_ in range(rounds):
                wait(
                    "two decision replicas",
                    lambda: len(statuses(settings, "decision")) == 2,
                    240,
                )
                deployment.wait_ready()
                outcome = one_round(deployment, engine, headers, n, clients)
                outcomes.append(outcome)
                print(f"  round {round_ + 1}: {outcome}", flush=True)
        bad = [
            o
            for o in outcomes
            if o["lost"] or o["duplicated_events"] or o["duplicated_rows"] or o["unprojected"]
        ]
        bad += [o for o in outcomes if not o["audit_intact"] or len(o["gateways"]) < 2]
        takeovers = [o["takeover_s"] for o in outcomes]
        print(
            f"summary: {sum(o['acknowledged'] for o in outcomes)} acknowledged decisions, "
            f"{sum(o['lost'] for o in outcomes)} lost, "
            f"{sum(o['duplicated_events'] + o['duplicated_rows'] for o in outcomes)} duplicated; "
            f"{sum(o['retries'] for o in outcomes)} client retries; projector takeover median "
            f"{statistics.median(takeovers):.1f} s (max {max(takeovers):.1f} s); "
            f"{statistics.median(o['requests_per_s'] for o in outcomes):.0f} decisions/s "
            f"median through the kills"
        )
        engine.dispose()
        return 1 if bad else 0
    finally:
        nats.stop()
        pg.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=300, help="decisions per round")
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument(
        "--model",
        type=Path,
        help="VERSION.onnx trained on this machine (e.g. from a home's models/): no setup first",
    )
    args = parser.parse_args()
    raise SystemExit(main(args.rounds, args.requests, args.clients, args.model))
