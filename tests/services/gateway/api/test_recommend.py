"""POST /v1/recommend on a real model (trained on this machine's real measurements by the
session fixtures of tests/support/measured.py), published as a model event and folded into
Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import DeviceRegistered, ModelPublished
from hpc_ds1.machine.hardware import Fingerprint
from hpc_ds1.model import Model, TrainedModel
from hpc_ds1.models_store import save_local
from hpc_ds1.services.gateway import create_app
from hpc_ds1.settings import Settings
from tests.support.gateway import as_role, fold
from tests.support.measured import TINY

from ..fleet_fixtures import FINGERPRINT


@pytest.fixture
async def client(
    settings: Settings, bus: EventBus, engine: Engine, role_tokens: None
) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(settings, bus, engine))
    async with httpx.AsyncClient(
        transport=transport, base_url="http://gw", headers=as_role("viewer")
    ) as http:
        yield http


async def publish_model(
    settings: Settings, bus: EventBus, engine: Engine, trained: TrainedModel, fp: Fingerprint
) -> Model:
    data = trained.to_onnx()
    model = Model.from_onnx(data)
    save_local(settings.models_dir, model.version, fp.device_id, data)
    device = DeviceRegistered(
        device_id=fp.device_id,
        hostname=fp.hostname,
        fingerprint=fp.model_dump(mode="json"),
        local=True,
    )
    published = ModelPublished(
        model_version=model.version,
        device_id=fp.device_id,
        artifact=f"{fp.device_id}/{model.version}.onnx",
        sha256="0" * 64,
        trained_on=10,
    )
    await fold(settings, bus, engine, device, published)
    return model


async def test_before_a_device_and_a_model_it_says_what_to_do(
    client: httpx.AsyncClient, settings: Settings, bus: EventBus, engine: Engine
) -> None:
    body = {"workload": "gemm", "size": 64}
    reply = await client.post("/v1/recommend", json=body)
    assert reply.status_code == 404
    assert "hpc-ds1 setup --quick" in reply.json()["error"]
    other = DeviceRegistered(
        device_id=FINGERPRINT["device_id"], hostname="far", fingerprint=FINGERPRINT, local=True
    )
    await fold(settings, bus, engine, other)
    reply = await client.post("/v1/recommend", json=body)
    assert reply.status_code == 409
    assert "no model for device" in reply.json()["error"]
    assert (
        await client.post("/v1/recommend", json=body, headers={"Authorization": ""})
    ).status_code == 401


async def test_the_recommendation_of_a_real_model(
    client: httpx.AsyncClient,
    settings: Settings,
    bus: EventBus,
    engine: Engine,
    trained: TrainedModel,
    fp: Fingerprint,
) -> None:
    model = await publish_model(settings, bus, engine, trained, fp)
    size = TINY["gemm"][1]
    reply = await client.post("/v1/recommend", json={"workload": "gemm", "size": size})
    assert reply.status_code == 200, reply.text
    rec = reply.json()
    expected = model.recommend("gemm", size, fingerprint=fp)
    # the HTTP body names every field, block 0 (the kernel's own) included
    assert rec["config"] == {"block": 0, **expected.config.model_dump()}
    assert rec["predicted_runtime_s"] == pytest.approx(expected.predicted_runtime_s)
    assert rec["confidence"] == pytest.approx(expected.confidence)
    assert rec["model_version"] == model.version and rec["device_id"] == fp.device_id
    assert rec["familiar"] and rec["guard_reasons"] == []
    assert rec["mode"] in ("auto", "confirm", "escalate")
    assert (rec["mode"] == "auto") == (rec["reasons"] == [])
    assert next(iter(rec["alternatives"])) == expected.config.label()

    # Far outside the measured sizes: the guard says so and the mode is escalate.
    far = (await client.post("/v1/recommend", json={"workload": "gemm", "size": 4096})).json()
    assert far["mode"] == "escalate" and not far["familiar"]
    assert any("outside the measured range" in r for r in far["guard_reasons"])


async def test_unknown_workloads_and_sizes_out_of_range_are_422(
    client: httpx.AsyncClient,
    settings: Settings,
    bus: EventBus,
    engine: Engine,
    trained: TrainedModel,
    fp: Fingerprint,
) -> None:
    await publish_model(settings, bus, engine, trained, fp)
    unknown = await client.post("/v1/recommend", json={"workload": "nosuch", "size": 10})
    assert unknown.status_code == 422
    assert "unknown workload 'nosuch'" in unknown.json()["error"]
    assert "gemm" in unknown.json()["error"]
    for size in (0, -3, 2**41):
        reply = await client.post("/v1/recommend", json={"workload": "gemm", "size": size})
        assert reply.status_code == 422, size
        assert reply.json()["detail"][0]["loc"][-1] == "size"
    too_small = await client.post("/v1/recommend", json={"workload": "stencil", "size": 2})
    assert too_small.status_code == 422
    assert "size 2 is out of range for stencil" in too_small.json()["error"]
    extra = await client.post("/v1/recommend", json={"workload": "gemm", "size": 64, "x": 1})
    assert extra.status_code == 422
