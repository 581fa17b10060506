"""GET /metrics: a viewer's token, the request histogram by route template, and the
deployment's figures read from the projection and the log, equal to what was done."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

import hpc_ds1
from hpc_ds1.db.engine import make_engine
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import decide_subject
from hpc_ds1.events import (
    ApprovalRequested,
    DecisionMade,
    DeviceRegistered,
    DeviceStatusChanged,
    MeasurementRecorded,
    SessionStarted,
    TaskPlaced,
    TaskSubmitted,
    envelope,
)
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.gateway.edge.metrics import (
    RUN_BUCKETS,
    RequestMetrics,
    domain_families,
    gather_sources,
    request_histogram,
)
from hpc_ds1.settings import Settings
from tests.support.gateway import as_role, asgi_client, fold

GEMM = {"workload": "gemm", "size": 288, "config": {"ranks": 1, "threads": 1}}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def app(settings: Settings, bus: EventBus, engine: Engine, role_tokens: None) -> FastAPI:
    return create_app(settings, bus, engine)


@pytest.fixture
async def viewer(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async for http in asgi_client(app, headers=as_role("viewer")):
        yield http


async def scrape(http: httpx.AsyncClient) -> Samples:
    reply = await http.get("/metrics")
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def decision(i: int, mode: str) -> DecisionMade:
    return DecisionMade(
        decision_id=f"dec_{i}",
        device_id="dev-a",
        source="api",
        workload="gemm",
        size=288,
        config={"ranks": 1},
        choice="threads_up",
        confidence=0.9 if mode == "auto" else 0.6,
        mode=mode,  # type: ignore[arg-type]
    )


def run(i: int, status: str, runtime_s: float | None, purpose: str) -> MeasurementRecorded:
    return MeasurementRecorded(
        measurement_id=f"m_{i}",
        device_id="dev-a",
        workload="gemm",
        size=288,
        config={"ranks": 1},
        status=status,  # type: ignore[arg-type]
        runtime_s=runtime_s,
        purpose=purpose,
    )


def placed(task_id: str, device_id: str) -> list[Any]:
    return [
        TaskSubmitted(task_id=task_id, workload="gemm", size=288, submitted_by="tester"),
        TaskPlaced(
            task_id=task_id,
            attempt=1,
            device_id=device_id,
            config={"ranks": 1},
            expected_s=1.0,
            queue_s=0.0,
            basis="measured",
            reason="first",
        ),
    ]


async def test_metrics_need_a_viewer_token(app: FastAPI) -> None:
    async for bare in asgi_client(app):
        reply = await bare.get("/metrics")
        assert reply.status_code == 401
        assert reply.headers["www-authenticate"] == "Bearer"
        assert "hpcds1_" not in reply.text
    async for agent in asgi_client(app, headers=as_role("agent")):
        assert (await agent.get("/metrics")).status_code == 403


async def test_the_figures_are_what_was_done(
    viewer: httpx.AsyncClient, settings: Settings, bus: EventBus, engine: Engine
) -> None:
    before = await scrape(viewer)
    for mode in ("auto", "confirm", "escalate"):
        assert value(before, "hpcds1_decisions_total", mode=mode) == 0
    assert value(before, "hpcds1_sessions", status="running") == 0
    assert value(before, "hpcds1_approvals_waiting") == 0
    assert value(before, "hpcds1_metrics_source_up", source="postgres") == 1
    assert value(before, "hpcds1_metrics_source_up", source="nats") == 1

    modes = ["auto", "auto", "auto", "confirm", "escalate"]
    await fold(
        settings,
        bus,
        engine,
        DeviceRegistered(device_id="dev-a", hostname="a"),
        DeviceRegistered(device_id="dev-b", hostname="b"),
        DeviceStatusChanged(device_id="dev-a", status="online"),
        *(decision(i, m) for i, m in enumerate(modes)),
        run(1, "ok", 0.05, "setup"),
        run(2, "ok", 3.0, "setup"),
        run(3, "failed", None, "setup"),
        run(4, "ok", 0.2, "tune"),
        run(5, "ok", 1.0, "something-new"),
        SessionStarted(
            session_id="s1", device_id="dev-a", workload="gemm", size=288, start={"ranks": 1}
        ),
        SessionStarted(
            session_id="s2", device_id="dev-a", workload="gemm", size=288, start={"ranks": 1}
        ),
        ApprovalRequested(
            approval_id="ap1",
            session_id="s1",
            decision_id="dec_3",
            device_id="dev-a",
            workload="gemm",
            size=288,
            config={"ranks": 1},
            move="threads_up",
            confidence=0.6,
            mode="confirm",
        ),
        *placed("t1", "dev-a"),
        *placed("t2", "dev-a"),
        *placed("t3", "dev-b"),
    )
    after = await scrape(viewer)

    assert {m: value(after, "hpcds1_decisions_total", mode=m) for m in set(modes)} == {
        "auto": 3,
        "confirm": 1,
        "escalate": 1,
    }
    assert value(after, "hpcds1_runs_total", purpose="setup", status="ok") == 2
    assert value(after, "hpcds1_runs_total", purpose="setup", status="failed") == 1
    assert value(after, "hpcds1_runs_total", purpose="tune", status="ok") == 1
    # A purpose the gateway does not know is counted, under one bounded label.
    assert value(after, "hpcds1_runs_total", purpose="other", status="ok") == 1
    assert value(after, "hpcds1_run_duration_seconds_count", purpose="setup") == 2
    assert math.isclose(value(after, "hpcds1_run_duration_seconds_sum", purpose="setup"), 3.05)
    buckets = {
        b: value(after, "hpcds1_run_duration_seconds_bucket", purpose="setup", le=str(b))
        for b in RUN_BUCKETS
    }
    assert buckets[0.01] == 0 and buckets[0.1] == 1 and buckets[2.0] == 1 and buckets[5.0] == 2
    assert value(after, "hpcds1_run_duration_seconds_bucket", purpose="setup", le="+Inf") == 2

    assert value(after, "hpcds1_sessions", status="running") == 2
    assert value(after, "hpcds1_approvals_waiting") == 1
    assert value(after, "hpcds1_approvals_oldest_waiting_seconds") >= 0
    assert value(after, "hpcds1_device_queue_depth", device_id="dev-a") == 2
    assert value(after, "hpcds1_device_queue_depth", device_id="dev-b") == 1
    assert value(after, "hpcds1_device_tasks_running", device_id="dev-a") == 0
    assert value(after, "hpcds1_device_online", device_id="dev-a") == 1
    assert value(after, "hpcds1_device_online", device_id="dev-b") == 0
    assert value(after, "hpcds1_tasks", status="placed") == 3

    # Everything in the log is folded: no lag, the checkpoint is the log's end.
    last = value(after, "hpcds1_eventlog_last_sequence")
    assert last == value(after, "hpcds1_projector_checkpoint_sequence") > 0
    assert value(after, "hpcds1_projector_lag_events") == 0
    assert value(after, "hpcds1_projector_lag_seconds") == 0


async def test_projector_lag_counts_the_events_not_yet_folded(
    viewer: httpx.AsyncClient, settings: Settings, bus: EventBus
) -> None:
    folded = await scrape(viewer)
    assert value(folded, "hpcds1_projector_lag_events") == 0
    events = [decision(i, "auto") for i in range(3)]
    await bus.publish_many(
        [envelope(e, actor="tester", source="test", prefix=bus.prefix) for e in events]
    )
    behind = await scrape(viewer)
    assert value(behind, "hpcds1_projector_lag_events") == 3
    assert value(behind, "hpcds1_eventlog_last_sequence") == (
        value(folded, "hpcds1_eventlog_last_sequence") + 3
    )
    assert value(behind, "hpcds1_projector_lag_seconds") >= 0
    # Not projected, so not counted.
    assert value(behind, "hpcds1_decisions_total", mode="auto") == 0


async def test_request_latency_by_route_template_method_and_status_class(
    app: FastAPI, viewer: httpx.AsyncClient, settings: Settings, bus: EventBus
) -> None:
    async def decision_service(msg: Any) -> None:
        reply = {"ok": False, "status": 409, "error": "no model for device d1 yet"}
        await msg.respond(orjson.dumps(reply))

    sub = await bus.nc.subscribe(decide_subject(settings), cb=decision_service)
    try:
        async for engineer in asgi_client(app, headers=as_role("engineer")):
            for _ in range(3):
                assert (await engineer.post("/v1/decide", json=GEMM)).status_code == 409
            assert (await engineer.post("/v1/decide", json={"size": 1})).status_code == 422
            # Refused by the body limit before any route ran: no route handled it.
            big = b"x" * (settings.max_body_bytes + 1)
            assert (await engineer.post("/v1/decide", content=big)).status_code == 413
    finally:
        await sub.unsubscribe()
    for raw in ("/v1/sessions/raw-id-one", "/v1/sessions/raw-id-two"):
        assert (await viewer.get(raw)).status_code == 404
    assert (await viewer.get("/no/such/path/raw-id-three")).status_code == 404
    assert (await viewer.request("BREW", "/v1/decide")).status_code == 405

    reply = await viewer.get("/metrics")
    assert "raw-id" not in reply.text  # never a raw path: bounded cardinality
    assert "_created" not in reply.text  # no series per label set that nothing reads
    samples = await scrape(viewer)
    name = "hpcds1_http_request_duration_seconds_count"
    assert value(samples, name, method="POST", route="/v1/decide", status="4xx") == 4
    assert value(samples, name, method="GET", route="/v1/sessions/{session_id}", status="4xx") == 2
    assert value(samples, name, method="GET", route="unmatched", status="4xx") == 1
    assert value(samples, name, method="POST", route="unmatched", status="4xx") == 1
    assert value(samples, name, method="other", route="/v1/decide", status="4xx") == 1
    # The first scrape of this test is counted by the second one.
    assert value(samples, name, method="GET", route="/metrics", status="2xx") >= 1
    bucket = "hpcds1_http_request_duration_seconds_bucket"
    decide = {"method": "POST", "route": "/v1/decide", "status": "4xx"}
    assert value(samples, bucket, **decide, le="+Inf") == 4
    assert value(samples, bucket, **decide, le="0.001") <= value(
        samples, bucket, **decide, le="60.0"
    )
    assert value(samples, "hpcds1_build_info", version=hpc_ds1.__version__) == 1


async def test_openmetrics_when_the_scraper_asks(viewer: httpx.AsyncClient) -> None:
    reply = await viewer.get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("application/openmetrics-text")
    assert reply.text.rstrip().endswith("# EOF")


async def test_a_source_that_fails_is_reported_down_and_its_figures_left_out(
    bus: EventBus,
) -> None:
    dead = make_engine("postgresql://nobody:nothing@127.0.0.1:1/none", pool_size=1)
    try:
        sources = await gather_sources(bus, dead, timeout_s=2.0)
    finally:
        dead.dispose()
    assert sources.projection is None and sources.log is not None
    names = {f.name for f in domain_families(sources)}
    assert "hpcds1_eventlog_last_sequence" in names
    assert "hpcds1_decisions" not in names and "hpcds1_projector_lag_events" not in names
    up = {
        s.labels["source"]: s.value
        for f in domain_families(sources)
        if f.name == "hpcds1_metrics_source_up"
        for s in f.samples
    }
    assert up == {"postgres": 0.0, "nats": 1.0}


async def test_no_metrics_when_turned_off(
    settings: Settings, bus: EventBus, engine: Engine, role_tokens: None
) -> None:
    quiet = create_app(settings.model_copy(update={"metrics": False}), bus, engine)
    async for http in asgi_client(quiet, headers=as_role("viewer")):
        assert (await http.get("/metrics")).status_code == 404


async def test_a_request_cancelled_before_any_response_is_not_counted() -> None:
    """A client that goes away during a long poll was served nothing; an error that ends a
    request without a response is a 5xx (RequestLog, outside the tests, makes it a JSON 500)."""
    registry = CollectorRegistry()

    class Route:
        path_format = "/v1/agent/work"

    async def cancelled(scope: Any, receive: Any, send: Any) -> None:
        scope["route"] = Route()
        raise asyncio.CancelledError

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        scope["route"] = Route()
        raise RuntimeError("boom")

    async def nothing() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def sink(message: Any) -> None:
        return None

    histogram = request_histogram(registry)
    for inner, error in ((cancelled, asyncio.CancelledError), (broken, RuntimeError)):
        scope = {"type": "http", "method": "GET", "path": "/v1/agent/work"}
        with pytest.raises(error):
            await RequestMetrics(inner, histogram)(scope, nothing, sink)
    counted = {
        (s.labels["status"], s.value)
        for f in registry.collect()
        for s in f.samples
        if s.name.endswith("_count")
    }
    assert counted == {("5xx", 1.0)}
