"""The decision tests' fixture: projector, agent and decision on a device with a model."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import Engine

from hpc_ds1.events import MeasurementRecorded, ModelPublished, envelope
from hpc_ds1.model import TrainedModel
from hpc_ds1.models_store import save_local
from hpc_ds1.settings import Settings
from hpc_ds1.stack import Stack, open_stack

from .decide import MONTECARLO


@pytest.fixture
async def decider(
    settings: Settings, engine: Engine, trained: TrainedModel
) -> AsyncIterator[tuple[Stack, str]]:
    """Projector, agent and decision on a device with a model (trained on real tiny runs) and
    one montecarlo measurement: 0.01 s at size 10^6."""
    async with open_stack(settings, ("projector", "agent", "decision"), "test-decision") as stack:
        device_id = await stack.local_device()
        data = trained.to_onnx()
        await asyncio.to_thread(save_local, settings.models_dir, trained.version, device_id, data)
        prefix = settings.subject_prefix
        events = [
            ModelPublished(
                model_version=trained.version,
                device_id=device_id,
                artifact=f"{device_id}/{trained.version}.onnx",
                sha256=hashlib.sha256(data).hexdigest(),
                trained_on=1,
            ),
            MeasurementRecorded(
                measurement_id="m-basis",
                device_id=device_id,
                workload="montecarlo",
                size=1_000_000,
                config=MONTECARLO,
                status="ok",
                runtime_s=0.01,
                repeats=3,
            ),
        ]
        for event in events:
            await stack.bus.publish(envelope(event, actor="test", source="test", prefix=prefix))
        await stack.caught_up()
        yield stack, device_id
