"""Events for the projector's tests: any event wrapped as a test's envelope, and the i-th of a
run of measurements. Shared by the projector tests."""

from __future__ import annotations

from typing import Any

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import Envelope, MeasurementRecorded, envelope


def wrap(bus: EventBus, event: Any, actor: str = "test") -> Envelope:
    return envelope(event, actor=actor, source="test", prefix=bus.prefix)


def measurement(bus: EventBus, i: int) -> Envelope:
    return wrap(
        bus,
        MeasurementRecorded(
            measurement_id=f"m{i}",
            device_id="dev-1",
            workload="gemm",
            size=256 + i,
            config={"ranks": 1, "threads": 2, "tile": 64},
            status="ok",
            runtime_s=0.01 * (i + 1),
            throughput=10.0,
            throughput_unit="GFLOP/s",
        ),
    )
