"""GET /v1/model and GET /v1/measurements/summary on real device, measurement and model events
published to NATS and folded into Postgres."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import DeviceRegistered, MeasurementRecorded, ModelPublished
from hpc_ds1.settings import Settings
from tests.support.gateway import fold

from ..fleet_fixtures import FINGERPRINT

METRICS: dict[str, Any] = {
    "counts": {"measurements": 5, "states": 4, "workloads": {"gemm": 2}},
    "move_model": {
        "chosen": "hist_gbdt",
        "held_out_size_accuracy": 0.91,
        "calibration": {"ece": 0.04},
    },
    "runtime_model": {"chosen": "extra_trees", "rmse_log10": 0.12},
    "guard": {"distance_threshold": 3.5},
    "held_out": None,
    "train_seconds": 12.5,
}


def measurement(i: int, workload: str, size: int, status: str = "ok", **extra: Any) -> Any:
    return MeasurementRecorded(
        measurement_id=f"m{i}",
        device_id="local-1",
        workload=workload,
        size=size,
        config={"ranks": 1, "threads": 1, "tile": 64},
        status=status,  # type: ignore[arg-type]
        runtime_s=0.5 if status == "ok" else None,
        **extra,
    )


def model(version: str) -> ModelPublished:
    return ModelPublished(
        model_version=version,
        device_id="local-1",
        artifact=f"local-1/{version}.onnx",
        sha256="0" * 64,
        metrics=METRICS,
        trained_on=4,
    )


@pytest.fixture
def client(viewer_client: httpx.AsyncClient) -> httpx.AsyncClient:
    return viewer_client


async def test_before_any_device_both_say_how_to_start(client: httpx.AsyncClient) -> None:
    for path in ("/v1/model", "/v1/measurements/summary"):
        reply = await client.get(path)
        assert reply.status_code == 404, path
        assert "hpc-ds1 setup --quick" in reply.json()["error"]
    unknown = await client.get("/v1/model", params={"device_id": "nope"})
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "unknown device nope"
    bad = await client.get("/v1/measurements/summary", params={"device_id": "a b"})
    assert bad.status_code == 422


async def test_a_token_is_needed(client: httpx.AsyncClient) -> None:
    for path in ("/v1/model", "/v1/measurements/summary"):
        reply = await client.get(path, headers={"Authorization": ""})
        assert reply.status_code == 401, path


async def test_the_model_and_what_was_measured(
    client: httpx.AsyncClient, settings: Settings, bus: EventBus, engine: Engine
) -> None:
    device = DeviceRegistered(
        device_id="local-1", hostname="node-7", fingerprint=FINGERPRINT, local=True
    )
    other = DeviceRegistered(device_id="other", hostname="far", fingerprint=FINGERPRINT)
    await fold(settings, bus, engine, device, other)

    # A device without a model: the name, the thresholds, and how to get one.
    body = (await client.get("/v1/model")).json()
    assert body["name"] == "hpc-ds1-latest"
    assert body["device_id"] == "local-1" and body["hostname"] == "node-7"
    assert body["thresholds"] == {
        "auto": settings.auto_threshold,
        "escalate": settings.escalate_threshold,
    }
    assert body["model"] is None and body["models_published"] == 0
    assert "hpc-ds1 setup --quick" in body["missing"]

    # Training data: gemm at two sizes (one wrong answer), a held-out size (registered: 896)
    # run for a decision, a held-out flagged run, and a kernel that never ran correctly.
    await fold(
        settings,
        bus,
        engine,
        measurement(1, "gemm", 768, purpose="setup"),
        measurement(2, "gemm", 1024, purpose="setup"),
        measurement(3, "gemm", 1024, "wrong_answer", purpose="setup"),
        measurement(4, "gemm", 896),
        measurement(5, "gemm", 3072, held_out=True, purpose="evaluate"),
        measurement(6, "stencil", 120, "failed", purpose="setup"),
        model("v1"),
    )
    body = (await client.get("/v1/model")).json()
    m = body["model"]
    assert m["version"] == "v1" and m["trained_on"] == 4 and body["models_published"] == 1
    assert m["workloads"] == {"gemm": 2}
    assert body["missing"] is None
    summary = {s["key"]: s["value"] for s in m["summary"]}
    assert summary["move_model"] == "hist_gbdt"
    assert summary["move_accuracy_cv"] == 0.91
    assert summary["runtime_rmse_log10"] == 0.12
    assert summary["train_seconds"] == 12.5
    assert "held_out_move_accuracy" not in summary  # the model has no held-out scores
    assert m["metrics"] == METRICS

    # Measured after the model: a setup under way, a new gemm size (not in the guard's range).
    await fold(
        settings,
        bus,
        engine,
        measurement(7, "gemm", 2048, purpose="setup"),
        measurement(8, "nbody", 2048, purpose="setup"),
        measurement(9, "nbody", 2048, "timed_out", purpose="setup"),
        measurement(10, "gemm", 768, purpose="tune"),
    )
    body = (await client.get("/v1/measurements/summary")).json()
    assert body["device_id"] == "local-1" and body["model_version"] == "v1"
    rows = {k["kernel"]: k for k in body["kernels"]}
    assert rows["gemm"] == {
        "kernel": "gemm",
        "sizes": [768, 1024, 2048],
        "held_out_sizes": [896, 3072],
        "runs": 7,
        "correct_runs": 6,
        "guard_range": [768, 1024],
    }
    assert rows["stencil"]["guard_range"] is None  # never ran correctly before the model
    assert rows["stencil"]["correct_runs"] == 0 and rows["stencil"]["runs"] == 1
    assert rows["nbody"]["guard_range"] is None  # measured after the model
    setup = body["setup"]
    assert setup["running"] is True
    assert setup["measured"] == 3 and setup["correct"] == 2
    assert setup["by_kernel"] == {"gemm": 1, "nbody": 2}
    assert setup["since_model"] == "v1"
    assert 0 < setup["planned"]["quick"] < setup["planned"]["full"]

    # Another device's summary is its own: nothing measured, no setup.
    far = (await client.get("/v1/measurements/summary", params={"device_id": "other"})).json()
    assert far == {"device_id": "other", "model_version": None, "kernels": [], "setup": None}
