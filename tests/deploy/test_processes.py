"""The deployment of docker-compose.yml proven without containers: every service its own
`hpc-ds1 service NAME` process (the compose file's command and environment) on one NATS and one
Postgres runs a decision, a tuning session with an approval and a fleet task; then two replicas
of the gateway (sharing the port) and of the decision service split the requests, each request
is decided once, a replica killed mid-load loses nothing, and a second projector waits as a
standby and takes over when the active one is killed, its fold and audit chain intact."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select

from hpc_ds1.db import make_engine, tables
from hpc_ds1.eventlog.audit import verify
from hpc_ds1.infra.ports import free_port
from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.model import TrainedModel
from hpc_ds1.settings import Settings
from tests.deploy.processes import (
    REPLICA,
    Deployment,
    caught_up,
    count,
    give_model,
    statuses,
    stream_ids,
)
from tests.support.databases import create_database, drop_database
from tests.support.waiting import wait_for

DECIDE = {
    "workload": "gemm",
    "size": 64,
    "config": {"ranks": 1, "threads": 1, "tile": 32},
    "telemetry": {"runtime_s": 0.004},
}
LOAD_REQUESTS = 60
CLIENTS = 3


@pytest.fixture(scope="module")
def deploy_settings(
    tmp_path_factory: pytest.TempPathFactory, nats_url: str, postgres_url: str
) -> Iterator[Settings]:
    database_url = create_database(postgres_url, "deploy")
    tag = uuid.uuid4().hex[:10]
    yield Settings(
        home=tmp_path_factory.mktemp("deploy") / "home",
        nats_url=nats_url,
        database_url=database_url,
        stream=f"DEP_{tag}",
        subject_prefix=f"d{tag}",
        port=free_port(),
        log_json=True,
    )
    drop_database(postgres_url, database_url)


@pytest.fixture(scope="module")
def model_onnx(trained: TrainedModel) -> tuple[str, bytes]:
    """The session's model trained on tiny real runs of this machine (tests/support/measured.py)."""
    return str(trained.version), trained.to_onnx()


@pytest.fixture(scope="module")
def deployment(
    deploy_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
    model_onnx: tuple[str, bytes],
) -> Iterator[Deployment]:
    # Every move needs an engineer (the session pauses for its approval); gateway replicas on
    # this host share the port.
    extra = {
        "HPC_DS1_AUTO_THRESHOLD": "1.0",
        "HPC_DS1_ESCALATE_THRESHOLD": "0.0",
        "HPC_DS1_REUSE_PORT": "true",
    }
    deployment = Deployment(deploy_settings, tmp_path_factory.mktemp("deploy-logs"), extra)
    assert set(deployment.spec) >= {"projector", "decision", "gateway", "agent", "coordinator"}
    with deployment.running(sorted(deployment.spec)):
        give_model(deploy_settings, fingerprint().device_id, *model_onnx)
        deployment.wait_ready()
        yield deployment


@pytest.fixture(scope="module")
def engine(deploy_settings: Settings) -> Iterator[Engine]:
    assert deploy_settings.database_url
    eng = make_engine(deploy_settings.database_url, pool_size=2)
    yield eng
    eng.dispose()


def event_types(engine: Engine, subject_part: str) -> list[str]:
    e = tables.events
    with engine.connect() as conn:
        rows = conn.execute(
            select(e.c.type).where(e.c.subject.contains(f".{subject_part}.")).order_by(e.c.seq)
        ).all()
    return [r[0] for r in rows]


def test_a_decision_a_session_with_an_approval_and_a_task_through_separate_processes(
    deployment: Deployment, engine: Engine
) -> None:
    headers = deployment.headers()
    http = httpx.Client(base_url=deployment.url, headers=headers, timeout=60)
    # A decision: gateway -> NATS -> decision service -> the log -> projector -> its row.
    reply = http.post("/v1/decide", json=DECIDE)
    assert reply.status_code == 200, reply.text
    decision_id = reply.json()["decision_id"]
    wait_for(
        "the decision's row",
        lambda: count(engine, tables.decisions, tables.decisions.c.decision_id == decision_id),
        within_s=180,
    )
    # A session: the coordinator runs each step on the agent and waits for an engineer.
    started = http.post(
        "/v1/sessions",
        json={"workload": "gemm", "size": 64, "start": {"ranks": 1, "threads": 1, "tile": 32}},
    )
    assert started.status_code == 201, started.text
    session_id = started.json()["session_id"]
    verdicts: list[str] = []

    def finished_or_approved() -> dict[str, Any] | None:
        reply = http.get(f"/v1/sessions/{session_id}")
        if reply.status_code == 404:  # not projected yet
            return None
        session = reply.json()
        if session["status"] == "finished":
            return dict(session)
        waiting = http.get("/v1/approvals").json()["approvals"]
        for approval in waiting:
            if approval["session_id"] == session_id:
                # The first move is approved, any after it rejected: the session ends.
                verdict = "approve" if not verdicts else "reject"
                answer = http.post(
                    f"/v1/approvals/{approval['approval_id']}", json={"decision": verdict}
                )
                assert answer.status_code == 200, answer.text
                verdicts.append(verdict)
        return None

    session = wait_for("the session to finish", finished_or_approved, within_s=300)
    assert verdicts and verdicts[0] == "approve", session
    types = event_types(engine, session_id)
    assert types[0] == "session.started" and types[-1] == "session.finished", types
    assert "session.paused" in types and "session.resumed" in types
    assert "session.step_run" in types
    # A fleet task: placement puts it on the agent's device, which runs it for real.
    submitted = http.post("/v1/tasks", json={"workload": "montecarlo", "size": 1_000_000})
    assert submitted.status_code == 201, submitted.text
    task_id = submitted.json()["task_id"]

    def task_done() -> dict[str, Any] | None:
        task = http.get(f"/v1/tasks/{task_id}").json()
        return dict(task) if task["status"] in ("finished", "failed") else None

    task = wait_for("the task to finish", task_done, within_s=180)
    assert task["status"] == "finished", task
    assert task["result"]["device_id"] == fingerprint().device_id
    assert task["result"]["runtime_s"] > 0
    types = event_types(engine, task_id)
    assert types[0] == "task.submitted" and "task.placed" in types and types[-1] == "task.finished"
    http.close()


def decide_with_retries(
    url: str, headers: dict[str, str], results: list[dict[str, Any]], errors: list[str], n: int
) -> None:
    """`n` decisions, each on a new connection (so the kernel spreads them over the gateway
    replicas); a refused, reset or timed-out request is sent again, as a client does."""
    for _ in range(n):
        for _attempt in range(20):
            try:
                reply = httpx.post(
                    f"{url}/v1/decide",
                    json=DECIDE,
                    headers={**headers, "Connection": "close"},
                    timeout=5.0,
                )
            except httpx.HTTPError as error:
                errors.append(repr(error))
                time.sleep(0.1)
                continue
            if reply.status_code == 200:
                results.append(
                    {"decision_id": reply.json()["decision_id"], "replica": reply.headers[REPLICA]}
                )
                break
            errors.append(f"{reply.status_code}: {reply.text[:200]}")
            time.sleep(0.1)
        else:
            raise AssertionError(f"no answer after 20 tries: {errors[-3:]}")


def test_replicas_share_the_load_and_a_killed_one_loses_nothing(
    deployment: Deployment, engine: Engine, deploy_settings: Settings
) -> None:
    headers = deployment.headers()
    first_gateway, first_decision = deployment.of("gateway")[0], deployment.of("decision")[0]
    first_projector = deployment.of("projector")[0]
    deployment.start("gateway")
    deployment.start("decision")
    standby = deployment.start("projector")
    wait_for(
        "two decision replicas",
        lambda: len(statuses(deploy_settings, "decision")) == 2,
        within_s=180,
        every_s=1.0,
    )
    wait_for(
        "two gateway replicas", lambda: _replicas_seen(deployment.url, headers) == 2, within_s=180
    )
    wait_for("the second projector to stand by", lambda: standby.logged("standby"), within_s=180)
    assert standby.logged("standby")[0]["active"].startswith(
        f"hpc-ds1 projector pid {first_projector.pid}"
    )
    # One projector answers for the fold: the standby is not active.
    assert [s["pid"] for s in statuses(deploy_settings, "projector")] == [first_projector.pid]

    results: list[dict[str, Any]] = []
    errors: list[str] = []
    clients = [
        threading.Thread(
            target=decide_with_retries,
            args=(deployment.url, headers, results, errors, LOAD_REQUESTS // CLIENTS),
        )
        for _ in range(CLIENTS)
    ]
    for client in clients:
        client.start()
    wait_for(
        "a third of the load",
        lambda: len(results) >= LOAD_REQUESTS // 3,
        every_s=0.05,
        within_s=180,
    )
    answered = {s["pid"]: s["answered"] for s in statuses(deploy_settings, "decision")}
    # Mid-load: kill -9 one gateway, one decision replica and the active projector.
    first_gateway.kill9()
    first_decision.kill9()
    first_projector.kill9()
    for client in clients:
        client.join(240)
    assert len(results) == LOAD_REQUESTS // CLIENTS * CLIENTS, errors[-5:]
    # Both gateways and both decision replicas took requests before the kill.
    by_replica: dict[str, int] = {}
    for r in results:
        by_replica[r["replica"]] = by_replica.get(r["replica"], 0) + 1
    assert len(by_replica) == 2, by_replica
    assert len(answered) == 2 and all(n > 0 for n in answered.values()), answered
    # The standby took over the fold; everything acknowledged is in the log once and projected.
    wait_for("the standby projector to take over", lambda: standby.logged("active"), 60)
    caught_up(engine, deploy_settings, within_s=120)
    ids = stream_ids(deploy_settings)
    assert len(ids) == len({i for i, _ in ids}), "an event was appended twice"
    made = [i for i, t in ids if t == "decision.made"]
    acknowledged = {r["decision_id"] for r in results}
    with engine.connect() as conn:
        rows = [r[0] for r in conn.execute(select(tables.decisions.c.decision_id)).all()]
    assert acknowledged <= set(rows), "an acknowledged decision is missing from the projection"
    assert len(rows) == len(set(rows)) == len(made), "a decision was projected twice or lost"
    assert verify(deploy_settings.audit_path).intact
    print(
        f"replicas: gateway {by_replica}, decision answered {answered} before the kill; "
        f"{len(errors)} retried requests after kill -9 of a gateway, a decision replica and "
        "the active projector"
    )


def _replicas_seen(url: str, headers: dict[str, str], tries: int = 20) -> int:
    seen = set()
    for _ in range(tries):
        with httpx.Client(base_url=url, headers={**headers, "Connection": "close"}) as http:
            reply = http.get("/v1/whoami")
            if reply.status_code == 200:
                seen.add(reply.headers[REPLICA])
    return len(seen)


def test_compose_file_names_every_service() -> None:
    from hpc_ds1.process.runtime import SERVICES
    from tests.deploy.processes import compose_services

    spec = compose_services()
    assert {tuple(s["command"]) for s in spec.values()} == {("service", n) for n in SERVICES}
