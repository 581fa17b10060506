"""The agent transport on real NATS and Postgres: each device's work comes only to its own
long-poll, a device reports only on its own current attempt, a result posted twice is recorded
once, stale work is skipped and work the projector has not caught up with is not lost,
measurements and models are recorded under the credential's device whatever the body says."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import placement_subject
from hpc_ds1.events import (
    TaskPlaced,
    TaskRequeued,
    TaskSubmitted,
    TokenCreated,
    decode,
)
from hpc_ds1.fleet.liveness import last_beat, liveness_bucket
from hpc_ds1.fleet.work import WorkItem, enqueue, ensure_work_stream
from hpc_ds1.model import TrainedModel
from hpc_ds1.models_store import models_bucket
from hpc_ds1.security.tokens import new_token, token_hash
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.gateway.agents.routes import close_agent_polls
from hpc_ds1.settings import Settings
from tests.model.unsafe_models import (
    bomb_in,
    external_in,
    heavy_in,
    open_watch,
    peak_rss_growth,
)
from tests.support.gateway import as_role, asgi_client, fold, role_token_events

from ..fleet_fixtures import Fleet, bearer, fleet, placement_service, projector

__all__ = ["fleet", "placement_service", "projector"]

DEVICE_TOKENS = {d: new_token() for d in ("dev-a", "dev-b")}
CONFIG = {"ranks": 1, "threads": 1, "tile": 64, "gpu": False}


def as_device(device: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {DEVICE_TOKENS[device]}"}


def device_token_events() -> list[TokenCreated]:
    return [
        TokenCreated(token_id=f"tok_{d}", holder=d, role="agent", sha256=token_hash(t))
        for d, t in DEVICE_TOKENS.items()
    ]


@pytest.fixture
async def http(
    settings: Settings, bus: EventBus, engine: Engine
) -> AsyncIterator[httpx.AsyncClient]:
    await fold(settings, bus, engine, *role_token_events(), *device_token_events())
    await ensure_work_stream(bus.js, settings)
    app = create_app(settings, bus, engine)
    async with app.router.lifespan_context(app):  # its shutdown ends the device subscriptions
        async for client in asgi_client(app, timeout=60):
            yield client


def placed(task_id: str, device: str, attempt: int = 1) -> list[Any]:
    events: list[Any] = [
        TaskPlaced(
            task_id=task_id,
            attempt=attempt,
            device_id=device,
            config=CONFIG,
            expected_s=2.0,
            queue_s=0.0,
            basis="measured",
            reason=f"{device}: best measured 2.0 s",
        )
    ]
    if attempt == 1:
        events.insert(0, TaskSubmitted(task_id=task_id, workload="gemm", size=64, submitted_by="t"))
    return events


def item(task_id: str, device: str, attempt: int = 1) -> WorkItem:
    return WorkItem(
        task_id=task_id,
        attempt=attempt,
        device_id=device,
        workload="gemm",
        size=64,
        config=CONFIG,
        expected_s=2.0,
    )


async def place(
    settings: Settings, bus: EventBus, engine: Engine, task_id: str, device: str
) -> None:
    await fold(settings, bus, engine, *placed(task_id, device))
    await enqueue(bus.js, settings, item(task_id, device))


async def events_of(bus: EventBus, event_type: str) -> list[dict[str, Any]]:
    found = []
    async for chunk in bus.replay():
        for raw in chunk:
            env = decode(raw.data, raw.subject)
            if env.type == event_type:
                found.append({**env.data, "_actor": env.actor, "_id": env.id})
    return found


def task_row(engine: Engine, task_id: str) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(select(tables.tasks).where(tables.tasks.c.task_id == task_id))
        return dict(row.mappings().one())


RESULT = {"attempt": 1, "status": "ok", "config": CONFIG, "runtime_s": 1.5, "check_ok": True}


async def test_work_reaches_only_its_own_device_and_the_poll_keeps_it_alive(
    settings: Settings, bus: EventBus, engine: Engine, http: httpx.AsyncClient
) -> None:
    await place(settings, bus, engine, "t-one", "dev-a")

    # dev-b's poll gets nothing and is held for its `wait`; dev-a's gets the item at once.
    started = time.monotonic()
    other = await http.get("/v1/agent/work", params={"wait": 0.6}, headers=as_device("dev-b"))
    assert other.status_code == 204 and other.content == b""
    assert time.monotonic() - started >= 0.55
    got = await http.get("/v1/agent/work", params={"wait": 5}, headers=as_device("dev-a"))
    assert got.status_code == 200
    assert WorkItem.model_validate(got.json()) == item("t-one", "dev-a")
    # Handed out once: acked, so the next poll finds nothing.
    again = await http.get("/v1/agent/work", params={"wait": 0.3}, headers=as_device("dev-a"))
    assert again.status_code == 204

    # Both polls refreshed their device's heartbeat, stamped with the server's time.
    kv = await liveness_bucket(bus.js, settings)
    for device in ("dev-a", "dev-b"):
        beat = await last_beat(kv, device)
        assert beat is not None and abs(beat.time - time.time()) < 30

    # Longer than allowed, a person's token, or no token: refused.
    too_long = await http.get(
        "/v1/agent/work", params={"wait": settings.long_poll_s + 1}, headers=as_device("dev-a")
    )
    assert too_long.status_code == 422
    person = await http.get("/v1/agent/work", params={"wait": 0.1}, headers=as_role("admin"))
    assert person.status_code == 403 and "agent token" in person.json()["error"]
    assert (await http.get("/v1/agent/work", params={"wait": 0.1})).status_code == 401


async def test_a_newer_poll_of_the_same_device_takes_over(
    settings: Settings, bus: EventBus, engine: Engine, http: httpx.AsyncClient
) -> None:
    """An agent that lost its connection polls again: the old, orphaned poll ends and the new
    one gets the work (it does not wait behind the old poll's `wait`)."""
    old = asyncio.create_task(
        http.get("/v1/agent/work", params={"wait": 20}, headers=as_device("dev-a"))
    )
    await asyncio.sleep(0.5)
    new = asyncio.create_task(
        http.get("/v1/agent/work", params={"wait": 20}, headers=as_device("dev-a"))
    )
    assert (await asyncio.wait_for(old, 10)).status_code == 204
    await place(settings, bus, engine, "t-new", "dev-a")
    got = await asyncio.wait_for(new, 10)
    assert got.status_code == 200 and got.json()["task_id"] == "t-new"


async def raw_poll(app: Any, device: str, wait_s: float, hang_up_after_s: float) -> list[Any]:
    """GET /v1/agent/work straight through ASGI, the caller hanging up after a while."""
    sent: list[Any] = []
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(hang_up_after_s)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/agent/work",
        "raw_path": b"/v1/agent/work",
        "root_path": "",
        "query_string": f"wait={wait_s:g}".encode(),
        "headers": [(b"authorization", f"Bearer {DEVICE_TOKENS[device]}".encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("gw", 80),
    }
    await app(scope, receive, send)
    return sent


async def test_a_poll_ends_when_its_caller_hangs_up_or_the_gateway_stops(
    settings: Settings, bus: EventBus, engine: Engine, http: httpx.AsyncClient
) -> None:
    app = create_app(settings, bus, engine)
    # Hung up after 0.3 s of a 20 s wait: the poll ends there, holding nothing back.
    sent = await asyncio.wait_for(raw_poll(app, "dev-a", 20, 0.3), 10)
    assert sent[0]["status"] == 204
    await place(settings, bus, engine, "t-after", "dev-a")
    got = await http.get("/v1/agent/work", params={"wait": 5}, headers=as_device("dev-a"))
    assert got.status_code == 200 and got.json()["task_id"] == "t-after"

    # The gateway stops: its open polls answer 204 at once, later ones too.
    polling = asyncio.create_task(raw_poll(app, "dev-b", 20, 60))
    await asyncio.sleep(0.5)
    await close_agent_polls(app)
    sent = await asyncio.wait_for(polling, 10)
    assert sent[0]["status"] == 204
    sent = await asyncio.wait_for(raw_poll(app, "dev-b", 20, 60), 10)
    assert sent[0]["status"] == 204


async def test_stale_work_is_skipped_and_lagging_work_is_not_lost(
    settings: Settings, bus: EventBus, engine: Engine, http: httpx.AsyncClient
) -> None:
    # Attempt 1 went to dev-a, was requeued and placed again on dev-b: dev-a's item is stale.
    await place(settings, bus, engine, "t-stale", "dev-a")
    requeue = TaskRequeued(task_id="t-stale", attempt=1, device_id="dev-a", reason="test")
    await fold(settings, bus, engine, requeue, *placed("t-stale", "dev-b", attempt=2))
    await place(settings, bus, engine, "t-fresh", "dev-a")
    got = await http.get("/v1/agent/work", params={"wait": 5}, headers=as_device("dev-a"))
    assert got.status_code == 200 and got.json()["task_id"] == "t-fresh"
    assert (
        await http.get("/v1/agent/work", params={"wait": 0.3}, headers=as_device("dev-a"))
    ).status_code == 204  # the stale item was acked and dropped, not handed out later

    # Queued before the projector wrote the task's row: the poll waits for the row.
    await bus.publish_many([_env(settings, e) for e in placed("t-lag", "dev-a")], window=1)
    await enqueue(bus.js, settings, item("t-lag", "dev-a"))
    poll = asyncio.create_task(
        http.get("/v1/agent/work", params={"wait": 5}, headers=as_device("dev-a"))
    )
    await asyncio.sleep(0.4)
    await fold(settings, bus, engine)
    got = await poll
    assert got.status_code == 200 and got.json()["task_id"] == "t-lag"

    # Never projected within the poll: not handed out, not dropped either.
    await bus.publish_many([_env(settings, e) for e in placed("t-later", "dev-a")], window=1)
    await enqueue(bus.js, settings, item("t-later", "dev-a"))
    empty = await http.get("/v1/agent/work", params={"wait": 1.5}, headers=as_device("dev-a"))
    assert empty.status_code == 204
    await fold(settings, bus, engine)
    got = await http.get("/v1/agent/work", params={"wait": 5}, headers=as_device("dev-a"))
    assert got.status_code == 200 and got.json()["task_id"] == "t-later"


def _env(settings: Settings, event: Any) -> Any:
    from hpc_ds1.events import envelope

    return envelope(event, actor="placement", source="test", prefix=settings.subject_prefix)


async def test_a_result_posted_twice_is_recorded_once(
    settings: Settings, bus: EventBus, engine: Engine, http: httpx.AsyncClient
) -> None:
    await place(settings, bus, engine, "t-twice", "dev-a")
    assert (
        await http.get("/v1/agent/work", params={"wait": 5}, headers=as_device("dev-a"))
    ).status_code == 200
    url = "/v1/agent/tasks/t-twice"
    started = await http.post(f"{url}/started", json={"attempt": 1}, headers=as_device("dev-a"))
    assert started.status_code == 204
    await fold(settings, bus, engine)
    assert task_row(engine, "t-twice")["status"] == "running"
    kv = await liveness_bucket(bus.js, settings)
    running = await last_beat(kv, "dev-a")
    assert running is not None and running.running == "t-twice"  # for placement's queue

    first = await http.post(f"{url}/result", json=RESULT, headers=as_device("dev-a"))
    assert first.status_code == 200, first.text
    assert first.json() == {"recorded": True, "measurement_id": "task-t-twice-1", "why": None}
    idle = await last_beat(kv, "dev-a")
    assert idle is not None and idle.running is None
    # Again before the projector saw it (the log's de-duplication), and after (the row).
    second = await http.post(f"{url}/result", json=RESULT, headers=as_device("dev-a"))
    assert second.status_code == 200 and second.json()["recorded"] is False
    await fold(settings, bus, engine)
    third = await http.post(f"{url}/result", json=RESULT, headers=as_device("dev-a"))
    assert third.status_code == 200 and third.json()["recorded"] is False
    assert "recorded before" in third.json()["why"]

    finished = await events_of(bus, "task.finished")
    assert len(finished) == 1 and finished[0]["device_id"] == "dev-a"
    assert finished[0]["runtime_s"] == 1.5 and finished[0]["expected_s"] == 2.0
    measured = await events_of(bus, "measurement.recorded")
    assert len(measured) == 1
    assert measured[0]["purpose"] == "task" and measured[0]["device_id"] == "dev-a"
    assert measured[0]["workload"] == "gemm" and measured[0]["config"] == CONFIG
    assert measured[0]["_actor"] == "dev-a"
    row = task_row(engine, "t-twice")
    assert row["status"] == "finished" and row["measurement_id"] == "task-t-twice-1"

    # A started for a finished task is refused; a result missing its runtime is invalid.
    late = await http.post(f"{url}/started", json={"attempt": 1}, headers=as_device("dev-a"))
    assert late.status_code == 409 and "already finished" in late.json()["error"]
    bad = await http.post(
        f"{url}/result", json={**RESULT, "runtime_s": None}, headers=as_device("dev-a")
    )
    assert bad.status_code == 422


async def test_a_device_reports_only_on_its_own_current_attempt(
    settings: Settings, bus: EventBus, engine: Engine, http: httpx.AsyncClient
) -> None:
    await place(settings, bus, engine, "t-b", "dev-b")
    url = "/v1/agent/tasks/t-b"
    # dev-a posting on dev-b's attempt: refused, nothing recorded.
    started = await http.post(f"{url}/started", json={"attempt": 1}, headers=as_device("dev-a"))
    assert started.status_code == 403 and "dev-b" in started.json()["error"]
    result = await http.post(f"{url}/result", json=RESULT, headers=as_device("dev-a"))
    assert result.status_code == 403
    # A device_id in the body is not the caller's to give.
    named = await http.post(
        f"{url}/result", json={**RESULT, "device_id": "dev-b"}, headers=as_device("dev-a")
    )
    assert named.status_code == 422
    assert await events_of(bus, "measurement.recorded") == []
    assert await events_of(bus, "task.started") == []
    assert (
        await http.post("/v1/agent/tasks/nope/result", json=RESULT, headers=as_device("dev-a"))
    ).status_code == 404

    # dev-b's attempt 1 is requeued and placed again on dev-a: dev-b's late result is not
    # the task's result any more.
    requeue = TaskRequeued(task_id="t-b", attempt=1, device_id="dev-b", reason="offline")
    await fold(settings, bus, engine, requeue, *placed("t-b", "dev-a", attempt=2))
    late = await http.post(f"{url}/result", json=RESULT, headers=as_device("dev-b"))
    assert late.status_code == 409 and "not current" in late.json()["error"]
    future = await http.post(
        f"{url}/result", json={**RESULT, "attempt": 3}, headers=as_device("dev-a")
    )
    assert future.status_code == 409
    assert await events_of(bus, "measurement.recorded") == []

    # dev-a's attempt 2 ran and failed: its measurement and a run failure with the device's
    # error, once (again before and after the projector saw it).
    failed = {
        "attempt": 2,
        "status": "failed",
        "config": CONFIG,
        "repeats": 1,
        "error": "rank 0 died",
    }
    answer = await http.post(f"{url}/result", json=failed, headers=as_device("dev-a"))
    assert answer.status_code == 200 and answer.json()["recorded"] is True
    again = await http.post(f"{url}/result", json=failed, headers=as_device("dev-a"))
    assert again.status_code == 200 and again.json()["recorded"] is False
    await fold(settings, bus, engine)
    again = await http.post(f"{url}/result", json=failed, headers=as_device("dev-a"))
    assert again.status_code == 200 and again.json()["recorded"] is False
    run_failed = await events_of(bus, "task.run_failed")
    assert [(e["device_id"], e["attempt"]) for e in run_failed] == [("dev-a", 2)]
    assert "rank 0 died" in run_failed[0]["error"]
    measured = await events_of(bus, "measurement.recorded")
    assert [(m["device_id"], m["status"]) for m in measured] == [("dev-a", "failed")]
    assert task_row(engine, "t-b")["failures"][-1].startswith("failed on dev-a")


async def test_an_attempt_refused_before_it_ran_has_no_measurement(
    settings: Settings, bus: EventBus, engine: Engine, http: httpx.AsyncClient
) -> None:
    await place(settings, bus, engine, "t-refused", "dev-a")
    body = {"attempt": 1, "status": "failed", "config": CONFIG, "error": "too long for max_run_s"}
    answer = await http.post(
        "/v1/agent/tasks/t-refused/result", json=body, headers=as_device("dev-a")
    )
    assert answer.status_code == 200
    assert answer.json() == {"recorded": True, "measurement_id": None, "why": None}
    await fold(settings, bus, engine)
    assert await events_of(bus, "measurement.recorded") == []
    assert task_row(engine, "t-refused")["failures"] == [
        "failed on dev-a: the run failed: too long for max_run_s"
    ]


async def test_heartbeat_is_stored_with_the_server_time(
    settings: Settings, bus: EventBus, engine: Engine, http: httpx.AsyncClient
) -> None:
    await fold(settings, bus, engine, *placed("t-x", "dev-b"))
    body = {"running": "t-x", "running_for_s": 3.0, "queued": 2}
    answer = await http.post("/v1/agent/heartbeat", json=body, headers=as_device("dev-b"))
    assert answer.status_code == 204
    beat = await last_beat(await liveness_bucket(bus.js, settings), "dev-b")
    assert beat is not None and beat.device_id == "dev-b"
    assert (beat.running, beat.queued) == ("t-x", 2) and abs(beat.time - time.time()) < 30
    named = await http.post(
        "/v1/agent/heartbeat", json={**body, "device_id": "dev-a"}, headers=as_device("dev-b")
    )
    assert named.status_code == 422
    assert await last_beat(await liveness_bucket(bus.js, settings), "dev-a") is None


async def test_a_heartbeat_speaks_only_for_the_devices_own_task(
    settings: Settings, bus: EventBus, engine: Engine, http: httpx.AsyncClient
) -> None:
    await fold(settings, bus, engine, *placed("t-a", "dev-a"), *placed("t-b", "dev-b"))
    url = "/v1/agent/heartbeat"
    own = await http.post(url, json={"running": "t-b"}, headers=as_device("dev-b"))
    assert own.status_code == 204
    kv = await liveness_bucket(bus.js, settings)
    before = await last_beat(kv, "dev-b")
    assert before is not None and before.running == "t-b"

    theirs = await http.post(url, json={"running": "t-a"}, headers=as_device("dev-b"))
    assert theirs.status_code == 403
    assert theirs.json()["error"] == (
        "dev-b may not report running task t-a: attempt 1 is on dev-a (placed)"
    )
    none = await http.post(url, json={"running": "t-none"}, headers=as_device("dev-b"))
    assert none.status_code == 403
    assert none.json()["error"] == "dev-b may not report running task t-none: there is no such task"
    # Nothing of the refused beats was stored: dev-b's last word stands.
    assert await last_beat(kv, "dev-b") == before
    # After its own task moved to dev-a (requeued and placed again), dev-b may not claim it.
    await fold(
        settings,
        bus,
        engine,
        TaskRequeued(task_id="t-b", attempt=1, device_id="dev-b", reason="offline"),
        *placed("t-b", "dev-a", attempt=2),
    )
    idle = await http.post(url, json={}, headers=as_device("dev-b"))
    assert idle.status_code == 204
    moved = await http.post(url, json={"running": "t-b"}, headers=as_device("dev-b"))
    assert moved.status_code == 403 and "attempt 2 is on dev-a" in moved.json()["error"]


def measurement(mid: str, **extra: Any) -> dict[str, Any]:
    return {
        "measurement_id": mid,
        "workload": "gemm",
        "size": 64,
        "config": CONFIG,
        "status": "ok",
        "runtime_s": 0.01,
        "repeats": 3,
        "purpose": "setup",
        **extra,
    }


async def test_measurements_are_recorded_as_the_device_once(
    settings: Settings, bus: EventBus, engine: Engine, http: httpx.AsyncClient
) -> None:
    url = "/v1/agent/measurements"
    batch = [measurement(f"m-{i}") for i in range(3)]
    first = await http.post(url, json={"measurements": batch}, headers=as_device("dev-a"))
    assert first.status_code == 200
    assert first.json() == {"accepted": 3, "known": 0, "refused": []}
    # The same again at once (the log's de-duplication) and after projection (the table).
    again = await http.post(url, json={"measurements": batch}, headers=as_device("dev-a"))
    assert again.json() == {"accepted": 0, "known": 3, "refused": []}
    await fold(settings, bus, engine)
    more = [*batch, measurement("m-3"), measurement("m-3")]
    third = await http.post(url, json={"measurements": more}, headers=as_device("dev-a"))
    assert third.json() == {"accepted": 1, "known": 4, "refused": []}
    # dev-b with the same ids (identical machines measure under the same setup ids) keeps its
    # own: each device's ids are its own, so neither shadows nor squats the other's.
    theirs = await http.post(url, json={"measurements": batch[:1]}, headers=as_device("dev-b"))
    assert theirs.json() == {"accepted": 1, "known": 0, "refused": []}
    await fold(settings, bus, engine)
    with engine.connect() as conn:
        rows = conn.execute(
            select(tables.measurements.c.measurement_id, tables.measurements.c.device_id)
        ).all()
    expected = [(f"dev-a:m-{i}", "dev-a") for i in range(4)] + [("dev-b:m-0", "dev-b")]
    assert sorted(rows) == expected
    assert len(await events_of(bus, "measurement.recorded")) == 5

    # The device is the credential's: a device_id field is refused, as are bad values.
    named = [measurement("m-9", device_id="dev-b")]
    assert (
        await http.post(url, json={"measurements": named}, headers=as_device("dev-a"))
    ).status_code == 422
    nan = [measurement("m-9", runtime_s="NaN")]
    assert (
        await http.post(url, json={"measurements": nan}, headers=as_device("dev-a"))
    ).status_code == 422
    # Over 1 MiB of JSON: read (this path has its own body limit), then refused: over 5000.
    too_many = [measurement(f"{'x' * 100}-{i}") for i in range(5001)]
    assert len(orjson.dumps({"measurements": too_many})) > settings.max_body_bytes
    big = await http.post(url, json={"measurements": too_many}, headers=as_device("dev-a"))
    assert big.status_code == 422 and "measurements" in big.json()["error"]


async def test_model_upload_checks_stores_and_publishes_as_the_device(
    settings: Settings,
    bus: EventBus,
    engine: Engine,
    http: httpx.AsyncClient,
    trained: TrainedModel,
) -> None:
    data = trained.to_onnx()
    digest = hashlib.sha256(data).hexdigest()
    url = "/v1/agent/model"
    params = {"version": "v1", "trained_on": 42, "sha256": digest}
    headers = {**as_device("dev-a"), "content-type": "application/octet-stream"}

    wrong = await http.post(
        url, params={**params, "sha256": "0" * 64}, content=data, headers=headers
    )
    assert wrong.status_code == 422 and "SHA-256" in wrong.json()["error"]
    junk = b"not a model" * 200_000  # 2.2 MB: past the general body limit, within the model's
    junk_sha = hashlib.sha256(junk).hexdigest()
    refused = await http.post(
        url, params={**params, "sha256": junk_sha}, content=junk, headers=headers
    )
    assert refused.status_code == 422 and "not an hpc_ds1 ONNX model" in refused.json()["error"]
    assert await events_of(bus, "model.published") == []

    metrics = {"runtime_mape": 0.12}
    good = await http.post(
        url,
        params=params,
        content=data,
        headers={**headers, "x-model-metrics": orjson.dumps(metrics).decode()},
    )
    assert good.status_code == 201, good.text
    assert good.json() == {"model_version": "dev-a:v1"}
    published = await events_of(bus, "model.published")
    assert len(published) == 1
    assert published[0]["device_id"] == "dev-a" and published[0]["_actor"] == "dev-a"
    assert published[0]["artifact"] == "dev-a/v1.onnx" and published[0]["sha256"] == digest
    assert published[0]["trained_on"] == 42 and published[0]["metrics"] == metrics
    store = await models_bucket(bus.js, settings, create=False)
    assert store is not None
    assert (await store.get("dev-a/v1.onnx")).data == data

    # The same version again: accepted (idempotent); other bytes under it: refused.
    await fold(settings, bus, engine)
    assert (await http.post(url, params=params, content=data, headers=headers)).status_code == 201
    other = data + b"\0"
    clash = await http.post(
        url,
        params={**params, "sha256": hashlib.sha256(other).hexdigest()},
        content=other,
        headers=headers,
    )
    assert clash.status_code == 409
    assert len(await events_of(bus, "model.published")) == 1


async def test_model_upload_past_its_limit_is_413(
    settings: Settings, bus: EventBus, engine: Engine
) -> None:
    small = settings.model_copy(update={"max_model_bytes": 1 << 20})
    await fold(settings, bus, engine, *device_token_events())
    async for http in asgi_client(create_app(small, bus, engine)):
        body = b"x" * ((1 << 20) + 1)
        answer = await http.post(
            "/v1/agent/model",
            params={"version": "v1", "trained_on": 1, "sha256": hashlib.sha256(body).hexdigest()},
            content=body,
            headers=as_device("dev-a"),
        )
        assert answer.status_code == 413


async def upload_model(http: httpx.AsyncClient, data: bytes, version: str) -> httpx.Response:
    return await http.post(
        "/v1/agent/model",
        params={"version": version, "trained_on": 1, "sha256": hashlib.sha256(data).hexdigest()},
        content=data,
        headers={**as_device("dev-a"), "content-type": "application/octet-stream"},
    )


async def test_a_model_bomb_is_refused_and_the_gateway_stays_small(
    bus: EventBus, http: httpx.AsyncClient, trained: TrainedModel
) -> None:
    """Issue 41's probe, inside an otherwise valid model: a 1 GiB constant the optimizing
    session used to fold in the gateway (accepted, after the gateway grew by 1 GiB); and 2 GiB
    no static bound sees, which only the sandbox's memory cap stops."""
    with peak_rss_growth() as growth:
        bomb = await upload_model(http, bomb_in(trained.to_onnx()), "bomb")
        heavy = await upload_model(http, heavy_in(trained.to_onnx()), "heavy")
    assert bomb.status_code == 422, bomb.text
    assert "ConstantOfShape" in bomb.json()["error"]
    assert heavy.status_code == 422, heavy.text
    assert "memory" in heavy.json()["error"] or "MB it may use" in heavy.json()["error"]
    assert growth.mb < 200
    for answer in (bomb, heavy):  # our words: onnxruntime's never reach the device
        assert "ONNXRuntimeError" not in answer.text and "onnxruntime_src" not in answer.text
    assert await events_of(bus, "model.published") == []


async def test_a_model_with_external_data_is_refused_without_reading_the_file(
    http: httpx.AsyncClient,
    trained: TrainedModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe's `home/credentials/join.token`: a location relative to the gateway's working
    directory, of a file big enough for the tensor (onnxruntime read it, before the fix)."""
    (tmp_path / "home" / "credentials").mkdir(parents=True)
    secret = tmp_path / "home" / "credentials" / "join.token"
    secret.write_bytes(b"\0" * 4096)
    monkeypatch.chdir(tmp_path)
    errors: list[str] = []
    with open_watch(secret) as watch:
        for location in ("home/credentials/join.token", "home/credentials/missing.token"):
            data = external_in(trained.to_onnx(), location)
            answer = await upload_model(http, data, f"ext-{len(errors)}")
            assert answer.status_code == 422, answer.text
            errors.append(answer.json()["error"])
    assert not watch.opened()
    assert "in an external file: every tensor must be inside the upload" in errors[0]
    assert errors[0] == errors[1]  # whether the file exists is not told


# --- runtimes that must make sense (the probe: a device uploads 1e-6 s for gemm 512, 1024) ---


async def task_view(fleet: Fleet, task_id: str, *statuses: str) -> dict[str, Any]:
    """GET /v1/tasks/{id} once it shows one of `statuses`."""
    view: dict[str, Any] = {}
    for _ in range(300):
        reply = await fleet.http.get(f"/v1/tasks/{task_id}", headers=as_role("viewer"))
        view = reply.json()
        if reply.status_code == 200 and view["status"] in statuses:
            return view
        await asyncio.sleep(0.1)
    raise AssertionError(f"task {task_id} is not {statuses}: {view}")


async def submitted(fleet: Fleet) -> str:
    body = {"workload": "gemm", "size": 512}
    reply = await fleet.http.post("/v1/tasks", json=body, headers=as_role("engineer"))
    assert reply.status_code == 201, reply.text
    task_id: str = reply.json()["task_id"]
    return task_id


async def runs(fleet: Fleet, device: dict[str, str], task_id: str, runtime_s: float) -> Any:
    """The device takes its next work item (`task_id`), starts it and reports `runtime_s`."""
    got = await fleet.http.get("/v1/agent/work", params={"wait": 10}, headers=device)
    assert got.status_code == 200 and got.json()["task_id"] == task_id, got.text
    url = f"/v1/agent/tasks/{task_id}"
    started = await fleet.http.post(f"{url}/started", json={"attempt": 1}, headers=device)
    assert started.status_code == 204, started.text
    body = {**RESULT, "config": got.json()["config"], "runtime_s": runtime_s}
    return await fleet.http.post(f"{url}/result", json=body, headers=device)


async def test_runtimes_that_cannot_be_true_are_refused_held_to_the_verified_and_flagged(
    settings: Settings, fleet: Fleet, placement_service: None
) -> None:
    devices = {}
    for name in ("deva", "devb"):
        joined = await fleet.join(name=name)
        assert joined.status_code == 201, joined.text
        devices[name] = bearer(joined.json()["token"])
    deva, devb = devices["deva"], devices["devb"]
    url = "/v1/agent/measurements"

    # deva's 1e-6 s for gemm 512 and 1024 is beyond its 8 CPUs: refused, each with why; its
    # 0.002 s for 512 (a lie the hardware cannot tell) is recorded, as is devb's 0.1 s.
    lies = [
        measurement("m-512", size=512, runtime_s=1e-6),
        measurement("m-1024", size=1024, runtime_s=1e-6),
        measurement("m-claim", size=512, runtime_s=0.002),
    ]
    upload = await fleet.http.post(url, json={"measurements": lies}, headers=deva)
    assert upload.status_code == 200, upload.text
    answer = upload.json()
    assert (answer["accepted"], answer["known"]) == (1, 0)
    assert [r["measurement_id"] for r in answer["refused"]] == ["m-512", "m-1024"]
    assert answer["refused"][0]["why"].startswith(
        "1e-06 s for gemm size 512 is 2.68e+14 FLOP/s, over the 3.07e+12 FLOP/s its claimed "
        "hardware could reach (8 CPUs x 6 GHz x 16 FLOP/cycle (fma), with a margin of 4 x)"
    )
    honest = [measurement("m-b", size=512, runtime_s=0.1)]
    upload = await fleet.http.post(url, json={"measurements": honest}, headers=devb)
    assert upload.json() == {"accepted": 1, "known": 0, "refused": []}
    t = tables.measurements
    with fleet.engine.connect() as conn:
        kept = conn.execute(select(t.c.measurement_id).where(t.c.device_id == "deva")).scalars()
        assert set(kept) <= {"deva:m-claim"}  # never a refused one

    # devb runs gemm 512 for the fleet while deva is offline (it has said nothing yet).
    assert (await fleet.http.post("/v1/agent/heartbeat", json={}, headers=devb)).status_code == 204
    first = await submitted(fleet)
    assert (await task_view(fleet, first, "placed"))["placement"]["device_id"] == "devb"
    ran = await runs(fleet, devb, first, 0.1)
    assert ran.status_code == 200 and ran.json()["recorded"] is True
    assert (await task_view(fleet, first, "finished"))["result"]["off_estimate"] is None
    # Now 20 times devb's verified run is more than the same hardware is believed to gain.
    ahead = [measurement("m-ahead", size=512, runtime_s=0.005)]
    upload = await fleet.http.post(url, json={"measurements": ahead}, headers=deva)
    assert upload.json()["refused"] == [
        {
            "measurement_id": "m-ahead",
            "why": "0.005 s for gemm size 512 is 20 x faster than devb's verified 0.1 s: at "
            "most 10 x is believed (10 x)",
        }
    ]

    # deva comes online: its unverified 0.002 s counts as devb's verified 0.1 s less the
    # fleet's spread, and the tasks alternate instead of all going to deva.
    for device in (deva, devb):
        assert (await fleet.http.post("/v1/agent/heartbeat", json={}, headers=device)).is_success
    for _ in range(100):
        reply = await fleet.bus.nc.request(
            placement_subject(settings), orjson.dumps({"workload": "gemm", "size": 512}), 10
        )
        if any(c["device_id"] == "deva" for c in orjson.loads(reply.data).get("candidates", [])):
            break
        await asyncio.sleep(0.1)
    tasks = [await submitted(fleet) for _ in range(4)]
    views = [await task_view(fleet, task_id, "placed") for task_id in tasks]
    where = [v["placement"]["device_id"] for v in views]
    assert where == ["deva", "devb", "deva", "devb"], [v["placement"]["reason"] for v in views]
    lead = views[0]["placement"]
    assert lead["reason"].startswith(
        "deva: queue 0.0 s + best measured 0.002 s (ranks=1 threads=1 tile=64) unverified, "
        "counted as 0.091 s (devb's verified best 0.1 s less the fleet's spread of 10 %) "
        "= 0.091 s; next devb 0.1 s"
    )
    assert lead["verified"] is False and lead["claimed_s"] == 0.002
    assert lead["expected_s"] == pytest.approx(0.1 / 1.1)

    # deva's first task takes 0.1 s, 50 times its own claim: recorded, flagged on the task and
    # on deva. Its second says 1e-6 s: refused, recorded as a failed run.
    ran = await runs(fleet, deva, tasks[0], 0.1)
    assert ran.status_code == 200 and ran.json()["recorded"] is True
    flag = "ran 0.1 s, 50 x slower than its own estimate of 0.002 s (more than 4 x off)"
    assert (await task_view(fleet, tasks[0], "finished"))["result"]["off_estimate"] == flag
    shown = await fleet.http.get("/v1/devices/deva", headers=as_role("viewer"))
    assert shown.json()["off_estimates"] == 1
    assert shown.json()["off_estimate"] == f"task {tasks[0]}: {flag}"
    with fleet.engine.connect() as conn:
        row = conn.execute(select(tables.devices).where(tables.devices.c.device_id == "devb"))
        assert row.mappings().one()["off_estimates"] == 0
    fake = await runs(fleet, deva, tasks[2], 1e-6)
    assert fake.status_code == 422
    assert fake.json()["error"].startswith(
        f"the result of attempt 1 of task {tasks[2]} is refused: 1e-06 s for gemm size 512 is "
    )
    assert fake.json()["error"].endswith("it is recorded as a failed run")
    for _ in range(100):
        failures = task_row(fleet.engine, tasks[2])["failures"]
        if failures:
            break
        await asyncio.sleep(0.1)
    assert "its reported runtime is refused" in failures[0]
    measured = select(t.c.measurement_id).where(t.c.measurement_id == f"task-{tasks[2]}-1")
    with fleet.engine.connect() as conn:
        assert conn.execute(measured).first() is None
    await close_agent_polls(fleet.app)
