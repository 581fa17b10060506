"""A session's warm start from the projection (issue 42, item 5): what the fleet measured of the
same workload on other devices, at the nearest measured size, becomes the session's start and
first moves; a device that measured the job starts cold unless asked; a `warm_from` name that
is neither a device nor a measured workload is refused, saying what is accepted. Real
measurement events folded into Postgres."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import MeasurementRecorded
from hpc_ds1.requests import StartSessionRequest
from hpc_ds1.settings import Settings
from hpc_ds1.setup.warm import WarmError, nearest_size, session_warm
from hpc_ds1.space import Config, ConfigSpace
from services.coordinator.coordinator import CommandError, Coordinator
from tests.support.gateway import fold

SPACE = ConfigSpace.for_cpus(2, (32, 64, 128))
FAST = {"ranks": 2, "threads": 1, "tile": 32}


def run(i: int, device: str, workload: str, size: int, config: dict[str, Any], s: float) -> Any:
    return MeasurementRecorded(
        measurement_id=f"m{i}",
        device_id=device,
        workload=workload,
        size=size,
        config=config,
        status="ok",
        runtime_s=s,
    )


def landscape(device: str, workload: str, size: int, first: int, scale: float) -> list[Any]:
    """Every configuration of SPACE, FAST fastest, the others slower the farther they are."""
    runs = []
    for i, c in enumerate(SPACE.configs()):
        dumped = c.model_dump()
        far = sum(dumped[k] != v for k, v in FAST.items())
        runs.append(run(first + i, device, workload, size, dumped, scale * (1.0 + far)))
    return runs


@pytest.fixture
async def fleet(settings: Settings, bus: EventBus, engine: Engine) -> Engine:
    """Device `old` measured gemm at 1000 and 4000; `other` at 4000; `new` nothing of gemm but
    one run of stencil (a workload, not a device); `recorded` measured `conv-a100`."""
    await fold(
        settings,
        bus,
        engine,
        *landscape("old", "gemm", 1000, 0, 1.0),
        *landscape("old", "gemm", 4000, 100, 8.0),
        *landscape("other", "gemm", 4000, 200, 9.0),
        run(300, "new", "stencil", 1024, {"ranks": 1, "threads": 1, "tile": 64}, 1.0),
        *landscape("recorded", "conv-a100", 1, 400, 0.5),
    )
    return engine


async def test_a_new_device_starts_at_the_top_of_its_siblings_nearest_size(
    fleet: Engine,
) -> None:
    warm = session_warm(fleet, "new", "gemm", 1024, SPACE, "auto")
    assert warm is not None and warm.reason == "unmeasured"
    assert [(w.device_id, w.workload, w.size) for w in warm.siblings] == [("old", "gemm", 1000)]
    assert warm.siblings[0].runs == len(SPACE.configs())
    assert Config.model_validate(warm.plan[0]) == Config.model_validate(FAST)
    assert len(warm.plan) == 4 and all(SPACE.problem(Config.model_validate(c)) is None
                                       for c in warm.plan)  # fmt: skip
    at_4000 = session_warm(fleet, "new", "gemm", 3000, SPACE, "auto")
    assert at_4000 is not None
    assert {(w.device_id, w.size) for w in at_4000.siblings} == {("old", 4000), ("other", 4000)}


async def test_a_device_that_measured_the_job_starts_cold_unless_asked(fleet: Engine) -> None:
    assert session_warm(fleet, "old", "gemm", 1000, SPACE, "auto") is None
    assert session_warm(fleet, "old", "gemm", 1000, SPACE, "off") is None
    asked = session_warm(fleet, "old", "gemm", 1000, SPACE, "always")
    assert asked is not None and asked.reason == "asked"
    assert {w.device_id for w in asked.siblings} == {"other"}  # its own runs are not a sibling's
    assert session_warm(fleet, "new", "nbody", 64, SPACE, "auto") is None  # nobody measured it


async def test_warm_from_names_devices_and_workloads(fleet: Engine) -> None:
    only_other = session_warm(fleet, "new", "gemm", 4000, SPACE, "auto", ["other"])
    assert only_other is not None
    assert [w.device_id for w in only_other.siblings] == ["other"]
    recorded = session_warm(fleet, "new", "conv-a6000", 1, SPACE, "auto", ["conv-a100"])
    assert recorded is not None
    assert [(w.device_id, w.workload) for w in recorded.siblings] == [("recorded", "conv-a100")]


async def test_an_unknown_warm_from_name_is_a_clear_error(fleet: Engine) -> None:
    with pytest.raises(WarmError) as unknown:
        session_warm(fleet, "new", "gemm", 1024, SPACE, "auto", ["old", "no-such-gpu"])
    message = str(unknown.value)
    assert "'no-such-gpu'" in message and "neither a device of this fleet" in message
    assert "a device id (new, old, other, recorded)" in message
    assert "a measured workload (conv-a100, gemm, stencil)" in message
    with pytest.raises(WarmError, match="nothing to start from"):
        session_warm(fleet, "new", "nbody", 64, SPACE, "auto", ["old"])  # old has no nbody


async def test_the_coordinator_refuses_an_unknown_warm_from_with_422(fleet: Engine) -> None:
    coordinator = Coordinator(SimpleNamespace(engine=fleet))  # type: ignore[arg-type]

    async def space_for(device_id: str | None, workload: str) -> tuple[str, ConfigSpace]:
        return "new", SPACE

    coordinator.space_for = space_for  # type: ignore[method-assign]
    request = StartSessionRequest(workload="gemm", size=1024, warm_from=["no-such-gpu"])
    assert request.warm == "auto"  # warm_from implies it
    with pytest.raises(CommandError) as refused:
        await coordinator.start(request, "tester")
    assert refused.value.status == 422 and "no-such-gpu" in str(refused.value)


def test_the_nearest_size_is_on_a_log_scale() -> None:
    assert nearest_size(1024, [1000, 4000]) == 1000
    assert nearest_size(3000, [1000, 4000]) == 4000
    assert nearest_size(2000, [1000, 4000]) == 4000  # a tie: the larger
    assert nearest_size(5, []) is None
