"""GET /v1/measurements: the fleet's runs of a workload at a size, per (device, workload), for
a new device's warm setup; real measurement events folded into Postgres."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import MeasurementRecorded
from hpc_ds1.settings import Settings
from tests.support.gateway import fold


def run(i: int, device: str, workload: str, tile: int, runtime_s: float | None) -> Any:
    return MeasurementRecorded(
        measurement_id=f"m{i}",
        device_id=device,
        workload=workload,
        size=1024,
        config={"ranks": 1, "threads": 1, "tile": tile},
        status="ok" if runtime_s is not None else "failed",
        runtime_s=runtime_s,
    )


@pytest.fixture
def client(viewer_client: httpx.AsyncClient) -> httpx.AsyncClient:
    return viewer_client


async def test_the_siblings_runs_leave_the_asking_devices_own_out(
    client: httpx.AsyncClient, settings: Settings, bus: EventBus, engine: Engine
) -> None:
    await fold(
        settings,
        bus,
        engine,
        run(0, "new", "gemm", 64, 1.0),  # the asking device's own: left out
        run(1, "old", "gemm", 64, 2.0),
        run(2, "old", "gemm", 128, None),
        run(3, "new", "conv-a6000", 64, 3.0),  # a named workload: any device
        run(4, "old", "stencil", 64, 4.0),  # another workload: not asked for
    )
    reply = await client.get(
        "/v1/measurements",
        params={"workload": ["gemm", "conv-a6000"], "size": 1024, "device_id": "new"},
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    found = {(s["device_id"], s["workload"]): s["runs"] for s in body["siblings"]}
    assert body["size"] == 1024 and set(found) == {("old", "gemm"), ("new", "conv-a6000")}
    assert [(r["config"]["tile"], r["status"], r["runtime_s"]) for r in found["old", "gemm"]] == [
        (64, "ok", 2.0),
        (128, "failed", None),
    ]
    other_size = await client.get("/v1/measurements", params={"workload": "gemm", "size": 2})
    assert other_size.status_code == 200 and other_size.json()["siblings"] == []


async def test_bad_queries_say_what_is_accepted(client: httpx.AsyncClient) -> None:
    no_workload = await client.get("/v1/measurements", params={"size": 1})
    assert no_workload.status_code == 422
    bad_name = await client.get("/v1/measurements", params={"workload": "a b", "size": 1})
    assert bad_name.status_code == 422 and "letters, digits" in bad_name.json()["error"]
    for size in (0, 2**40 + 1, 2**70):  # none reaches Postgres's bigint column
        bad_size = await client.get("/v1/measurements", params={"workload": "gemm", "size": size})
        assert bad_size.status_code == 422, (size, bad_size.text)
    many = await client.get("/v1/measurements", params={"workload": ["w"] * 17, "size": 1})
    assert many.status_code == 422
    no_token = await client.get(
        "/v1/measurements", params={"workload": "gemm", "size": 1}, headers={"Authorization": ""}
    )
    assert no_token.status_code == 401
