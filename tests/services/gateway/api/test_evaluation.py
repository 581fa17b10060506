"""GET /v1/evaluation and its plots, on real evaluation.published events folded into the
projection."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.audit import AuditFile
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import EvaluationPublished, envelope
from hpc_ds1.services.projector import project
from hpc_ds1.settings import Settings


def tiny_png() -> bytes:
    """A real 1x1 grey PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    pixels = zlib.compress(b"\x00\x80")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def evaluation(i: int, model_version: str, **overrides: Any) -> EvaluationPublished:
    values: dict[str, Any] = {
        "evaluation_id": f"e{i}",
        "device_id": "dev-1",
        "model_version": model_version,
        "profile": "quick",
        "seed": i,
        "landscape_runs": 100 + i,
        "results": {"ranking": {"spearman": 0.5 + i / 10}},
        "plots": [f"regret_{i}.png"],
    }
    values.update(overrides)
    return EvaluationPublished(**values)


async def publish(settings: Settings, bus: EventBus, engine: Engine, *events: Any) -> None:
    await bus.publish_many([envelope(e, actor="t", source="t", prefix=bus.prefix) for e in events])
    project(
        engine, [e async for chunk in bus.replay() for e in chunk], AuditFile(settings.audit_path)
    )


@pytest.fixture
def client(viewer_client: httpx.AsyncClient) -> httpx.AsyncClient:
    return viewer_client


async def test_no_evaluation_yet_says_how_to_make_one(client: httpx.AsyncClient) -> None:
    reply = await client.get("/v1/evaluation")
    assert reply.status_code == 404
    assert "run `hpc-ds1 evaluate` (or `hpc-ds1 evaluate --quick`)" in reply.json()["error"]


async def test_the_latest_evaluation_and_the_filters(
    client: httpx.AsyncClient, settings: Settings, bus: EventBus, engine: Engine
) -> None:
    await publish(
        settings,
        bus,
        engine,
        evaluation(1, "m1", profile="full"),
        evaluation(2, "m2", device_id="dev-2"),
    )
    reply = await client.get("/v1/evaluation")
    assert reply.status_code == 200
    body = reply.json()
    assert body.pop("published_at")
    assert body == {
        "evaluation_id": "e2",
        "device_id": "dev-2",
        "model_version": "m2",
        "profile": "quick",
        "seed": 2,
        "landscape_runs": 102,
        "results": {"ranking": {"spearman": 0.7}},
        "plots": ["regret_2.png"],
    }
    older = (await client.get("/v1/evaluation", params={"model_version": "m1"})).json()
    assert (older["evaluation_id"], older["profile"]) == ("e1", "full")
    by_device = (await client.get("/v1/evaluation", params={"device_id": "dev-1"})).json()
    assert by_device["evaluation_id"] == "e1"
    missing = await client.get("/v1/evaluation", params={"model_version": "m9"})
    assert missing.status_code == 404


async def test_plots_are_served_by_plain_file_name(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    folder = settings.home / "evaluation"
    folder.mkdir(parents=True)
    png = tiny_png()
    (folder / "regret.png").write_bytes(png)
    (settings.home / "x.png").write_bytes(png)
    (folder / "notes.txt").write_text("not a plot")

    reply = await client.get("/v1/evaluation/plots/regret.png")
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "image/png" and reply.content == png

    assert (await client.get("/v1/evaluation/plots/absent.png")).status_code == 404
    assert (await client.get("/v1/evaluation/plots/notes.txt")).status_code == 422
    for name in ("../x.png", "..%2Fx.png", "%2E%2E%2Fx.png", "..png", ".hidden.png"):
        reply = await client.get(f"/v1/evaluation/plots/{name}")
        assert reply.status_code in (404, 422), name


async def test_the_yardstick_is_served_from_the_home_when_it_has_one(
    settings: Settings, client: httpx.AsyncClient
) -> None:
    missing = await client.get("/v1/evaluation/yardstick")
    assert missing.status_code == 404 and "benchmarks/yardstick.py" in missing.json()["error"]
    folder = settings.home / "evaluation"
    folder.mkdir(parents=True, exist_ok=True)
    figures = {"spaces": {"A100": {"figures": {"random": {"5": {"median": 0.5, "score": 0.0}}}}}}
    (folder / "yardstick.json").write_text(json.dumps(figures))
    found = await client.get("/v1/evaluation/yardstick")
    assert found.status_code == 200 and found.json() == figures
    (folder / "yardstick.json").write_text("[not an object")
    assert (await client.get("/v1/evaluation/yardstick")).status_code == 404
