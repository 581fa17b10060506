"""The devices API on real NATS (heartbeats in the liveness KV bucket) and Postgres with a real
projector: statuses (online, busy, offline, draining, left), measured kernels, the latest model,
what a device works on; drain and revoke (admin); `hpc-ds1 devices` against a served gateway."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from sqlalchemy import Engine, select

from hpc_ds1.cli import main
from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import (
    DeviceRegistered,
    MeasurementRecorded,
    ModelPublished,
    TaskPlaced,
    TaskStarted,
    TaskSubmitted,
    envelope,
)
from hpc_ds1.fleet.liveness import Heartbeat, beat, liveness_bucket
from hpc_ds1.services.gateway import _listen, create_app
from hpc_ds1.settings import Settings
from tests.support.commands import hpc
from tests.support.gateway import ROLE_TOKENS

from ..fleet_fixtures import (
    FINGERPRINT,
    Fleet,
    as_role,
    bearer,
    fleet,
    keep_logging,
    projector,
)

__all__ = ["fleet", "keep_logging", "projector"]


async def publish(bus: EventBus, *events: Any, actor: str = "tester") -> None:
    for event in events:
        await bus.publish(envelope(event, actor=actor, source="test", prefix=bus.prefix))


async def projected(engine: Engine, query: Any, want: Any = True) -> None:
    """Wait until `query` returns a row (the projector has folded what it needs)."""
    for _ in range(400):
        with engine.connect() as conn:
            row = conn.execute(query).first()
        if (row is not None) == want:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not projected: {query}")


async def joined(fleet: Fleet, name: str) -> dict[str, Any]:
    reply = await fleet.join(name=name)
    assert reply.status_code == 201, reply.text
    answer: dict[str, Any] = reply.json()
    return answer


def measurement(i: int, device: str, size: int, **extra: Any) -> MeasurementRecorded:
    values: dict[str, Any] = {
        "measurement_id": f"m{i}",
        "device_id": device,
        "workload": "gemm",
        "size": size,
        "config": {"ranks": 1, "threads": 2},
        "status": "ok",
        "runtime_s": 0.5,
        "check_ok": True,
    }
    return MeasurementRecorded(**{**values, **extra})


def by_id(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["device_id"]: d for d in listing["devices"]}


async def test_devices_show_status_hardware_kernels_model_and_work(
    settings: Settings, fleet: Fleet
) -> None:
    for name in ("dev-on", "dev-off", "dev-busy", "dev-stale", "dev-task"):
        await joined(fleet, name)
    kv = await liveness_bucket(fleet.bus.js, settings)
    now = time.time()
    await beat(kv, Heartbeat(device_id="dev-on", time=now, queued=0))
    await beat(kv, Heartbeat(device_id="dev-busy", time=now, running="t-hb", running_for_s=3))
    await beat(kv, Heartbeat(device_id="dev-stale", time=now - 100))
    await beat(kv, Heartbeat(device_id="dev-task", time=now))

    # dev-on: measurements (one failed, one whose check failed) and two models, the later wins.
    await publish(
        fleet.bus,
        measurement(1, "dev-on", 64),
        measurement(2, "dev-on", 64),
        measurement(3, "dev-on", 128, status="failed", runtime_s=None, check_ok=None),
        measurement(4, "dev-on", 256, check_ok=False),
        measurement(5, "dev-on", 128, check_ok=None),
        measurement(6, "dev-on", 32, workload="stencil"),
        measurement(7, "dev-off", 64),
        ModelPublished(
            model_version="dev-on:v1", device_id="dev-on", artifact="a", sha256="0", trained_on=3
        ),
        ModelPublished(
            model_version="dev-on:v2", device_id="dev-on", artifact="b", sha256="1", trained_on=6
        ),
        # dev-task runs a task of the projection; another is placed on it, not started.
        TaskSubmitted(task_id="t-run", workload="nbody", size=4096, submitted_by="engineer"),
        TaskSubmitted(task_id="t-hb", workload="montecarlo", size=1000, submitted_by="engineer"),
        TaskSubmitted(task_id="t-next", workload="gemm", size=64, submitted_by="engineer"),
        *(
            TaskPlaced(
                task_id=task,
                attempt=1,
                device_id="dev-task",
                config={"ranks": 1, "threads": 1},
                expected_s=1.0,
                queue_s=0.0,
                basis="measured",
                reason="test",
            )
            for task in ("t-run", "t-next")
        ),
        TaskStarted(task_id="t-run", attempt=1, device_id="dev-task"),
    )
    t = tables.tasks
    await projected(fleet.engine, select(t).where(t.c.task_id == "t-run", t.c.status == "running"))
    await projected(fleet.engine, select(t).where(t.c.task_id == "t-next", t.c.status == "placed"))
    await projected(fleet.engine, select(tables.models).where(tables.models.c.trained_on == 6))

    reply = await fleet.http.get("/v1/devices", headers=as_role("viewer"))
    assert reply.status_code == 200, reply.text
    devices = by_id(reply.json())
    assert set(devices) == {"dev-on", "dev-off", "dev-busy", "dev-stale", "dev-task"}
    status = {d: v["status"] for d, v in devices.items()}
    assert status == {
        "dev-on": "online",
        "dev-off": "offline",
        "dev-busy": "busy",
        "dev-stale": "offline",
        "dev-task": "busy",
    }
    assert devices["dev-off"]["status_reason"] == "never heard from"
    assert devices["dev-off"]["last_heartbeat_s"] is None
    # Its heartbeat was written 100 s in the past; reading it took some (loaded) time since.
    silent = devices["dev-stale"]["last_heartbeat_s"]
    assert 100 <= silent <= 100 + (time.time() - now) + 0.1  # served rounded to 0.1 s
    assert devices["dev-stale"]["status_reason"] == f"no heartbeat for {silent:.0f} s"

    on = devices["dev-on"]
    assert on["local"] is False and on["hostname"] == "node-7.lab"
    assert on["hardware"] == {
        "cpu_model": "Test CPU 9000",
        "cores": 4,
        "logical_cpus": 8,
        "memory_gib": 16.0,
        "gpus": ["Sim GPU"],
    }
    assert on["fingerprint"]["simd"] == FINGERPRINT["simd"]
    assert on["measured"] == [
        {"workload": "gemm", "sizes": [64, 128, 256], "runs": 5, "correct_runs": 3},
        {"workload": "stencil", "sizes": [32], "runs": 1, "correct_runs": 1},
    ]
    assert on["model"]["model_version"] == "dev-on:v2" and on["model"]["trained_on"] == 6
    assert on["working_on"] is None and on["queued"] == 0
    assert devices["dev-off"]["measured"][0]["runs"] == 1 and devices["dev-off"]["model"] is None
    assert devices["dev-busy"]["working_on"] == {
        "task_id": "t-hb",
        "workload": "montecarlo",
        "size": 1000,
    }
    task = devices["dev-task"]
    assert task["working_on"] == {"task_id": "t-run", "workload": "nbody", "size": 4096}
    assert task["queued"] == 1

    one = await fleet.http.get("/v1/devices/dev-on", headers=as_role("viewer"))
    assert one.status_code == 200
    assert {**one.json(), "last_heartbeat_s": 0} == {**on, "last_heartbeat_s": 0}
    assert (await fleet.http.get("/v1/devices/nope", headers=as_role("viewer"))).status_code == 404
    assert (await fleet.http.get("/v1/devices/a.b", headers=as_role("viewer"))).status_code == 422
    assert (await fleet.http.get("/v1/devices")).status_code == 401


async def test_drain_and_revoke(settings: Settings, fleet: Fleet) -> None:
    a = await joined(fleet, "dev-a")
    b = await joined(fleet, "dev-b")
    await publish(
        fleet.bus,
        DeviceRegistered(device_id="coord", hostname="coord", fingerprint=FINGERPRINT, local=True),
    )
    d = tables.devices
    await projected(fleet.engine, select(d).where(d.c.device_id == "coord"))
    kv = await liveness_bucket(fleet.bus.js, settings)
    for device in ("dev-a", "dev-b", "coord"):
        await beat(kv, Heartbeat(device_id=device, time=time.time()))

    # Only an admin drains or revokes.
    for role in ("viewer", "engineer"):
        drain = await fleet.http.post(
            "/v1/devices/dev-a/drain", json={"draining": True}, headers=as_role(role)
        )
        assert drain.status_code == 403
        revoke = await fleet.http.post("/v1/devices/dev-a/revoke", headers=as_role(role))
        assert revoke.status_code == 403
    admin = as_role("admin")
    bad = await fleet.http.post("/v1/devices/dev-a/drain", json={"draining": "yes"}, headers=admin)
    assert bad.status_code == 422
    missing = await fleet.http.post(
        "/v1/devices/nope/drain", json={"draining": True}, headers=admin
    )
    assert missing.status_code == 404

    drained = await fleet.http.post(
        "/v1/devices/dev-a/drain", json={"draining": True}, headers=admin
    )
    assert drained.status_code == 200, drained.text
    assert drained.json()["status"] == "draining" and drained.json()["draining"] is True
    history = [env for _, env in await fleet.bus.history("device", "dev-a")]
    assert history[-1].type == "device.draining" and history[-1].data["by"] == "admin"
    resumed = await fleet.http.post(
        "/v1/devices/dev-a/drain", json={"draining": False}, headers=admin
    )
    assert resumed.json()["status"] == "online"

    # Revoked: every credential of the device is refused, it has left, and says so.
    assert (await fleet.http.get("/v1/whoami", headers=bearer(b["token"]))).status_code == 200
    revoked = await fleet.http.post("/v1/devices/dev-b/revoke", headers=admin)
    assert revoked.status_code == 200, revoked.text
    assert revoked.json() == {
        "device_id": "dev-b",
        "status": "left",
        "revoked_tokens": [b["token_id"]],
    }
    assert (await fleet.http.get("/v1/whoami", headers=bearer(b["token"]))).status_code == 401
    assert (await fleet.http.get("/v1/whoami", headers=bearer(a["token"]))).status_code == 200
    events = [env for _, env in await fleet.bus.history("device", "dev-b")]
    assert events[-1].type == "device.left" and events[-1].data["reason"] == "revoked by admin"
    tokens = [env for _, env in await fleet.bus.history("token", b["token_id"])]
    assert [e.type for e in tokens] == ["token.created", "token.revoked"]
    listing = by_id((await fleet.http.get("/v1/devices", headers=admin)).json())
    assert listing["dev-b"]["status"] == "left"
    assert listing["coord"]["local"] is True and listing["coord"]["status"] == "online"
    again = await fleet.http.post("/v1/devices/dev-b/revoke", headers=admin)
    assert again.status_code == 200 and again.json()["revoked_tokens"] == []
    assert len(await fleet.bus.history("device", "dev-b")) == len(events)
    left_drain = await fleet.http.post(
        "/v1/devices/dev-b/drain", json={"draining": True}, headers=admin
    )
    assert left_drain.status_code == 409
    # The coordinator's own device is drained, not revoked; a left name is not joined again.
    own = await fleet.http.post("/v1/devices/coord/revoke", headers=admin)
    assert own.status_code == 409 and "drain it instead" in own.json()["error"]
    assert (await fleet.join(name="dev-b")).status_code == 409


@pytest.fixture
async def served(fleet: Fleet) -> AsyncIterator[str]:
    """The gateway on a real loopback port (the CLI is another process)."""
    app = create_app(fleet.settings, fleet.bus, fleet.engine)
    listener = _listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    task = asyncio.create_task(server.serve(sockets=[listener]))
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.02)
    assert server.started
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    server.should_exit = True
    with contextlib.suppress(Exception):
        await asyncio.wait_for(task, 10)
    listener.close()


@contextlib.asynccontextmanager
async def beating(kv: Any, device_id: str, every_s: float = 1.0) -> AsyncIterator[None]:
    """Heartbeats of `device_id` every `every_s` while the body runs, the first one before it."""
    await beat(kv, Heartbeat(device_id=device_id, time=time.time()))

    async def go_on() -> None:
        while True:
            await asyncio.sleep(every_s)
            await beat(kv, Heartbeat(device_id=device_id, time=time.time()))

    task = asyncio.create_task(go_on())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`hpc-ds1 ARGS` in this process (off the event loop: it calls the served gateway)."""
    code = await asyncio.to_thread(main, list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_devices_command(
    settings: Settings,
    fleet: Fleet,
    served: str,
    capsys: pytest.CaptureFixture[str],
    keep_logging: None,
) -> None:
    await joined(fleet, "dev-c")
    kv = await liveness_bucket(fleet.bus.js, settings)
    admin = ("--server", served, "--token", ROLE_TOKENS["admin"])

    # The installed command, once, as its own process, while the device beats as an agent
    # does: the command's start took 29 s once on a loaded CI machine, past offline_after_s.
    async with beating(kv, "dev-c"):
        listed = await hpc(settings, "devices", *admin)
        assert listed.returncode == 0, listed.stderr
        header, row = listed.stdout.splitlines()
        assert header.split()[:3] == ["DEVICE", "STATUS", "HOST"]
        assert row.split()[:3] == ["dev-c", "online", "node-7.lab"]
        assert "4 cores, 16 GiB, 1 GPU" in row

        code, out, err = await cli(capsys, "devices", "drain", "dev-c", *admin)
        assert code == 0 and "dev-c is draining" in out, err
        code, out, _ = await cli(capsys, "devices", "--json", *admin)
        assert code == 0 and [d["status"] for d in json.loads(out)] == ["draining"]
        code, out, _ = await cli(capsys, "devices", "drain", "dev-c", "--undo", *admin)
        assert code == 0 and "takes new tasks again (status online)" in out

        viewer = ("--server", served, "--token", ROLE_TOKENS["viewer"])
        code, _, err = await cli(capsys, "devices", "revoke", "dev-c", *viewer)
        assert code == 2 and "403" in err and "admin" in err
        code, _, err = await cli(capsys, "devices", "drain", "a.b", *admin)
        assert code == 2 and "not valid" in err
        code, out, _ = await cli(capsys, "devices", "revoke", "dev-c", *admin)
        assert code == 0 and "dev-c revoked" in out
        code, out, _ = await cli(capsys, "devices", *admin)
        assert code == 0 and out.splitlines()[1].split()[:2] == ["dev-c", "left"]
