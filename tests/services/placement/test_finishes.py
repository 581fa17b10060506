"""Placement over the maintained index of expected finishes (hpc_ds1.fleet.finishes) makes
exactly the reference's choices: randomized fleets and task streams, folded as the service
folds them, are placed by both after every change, and each answer is the same, device,
reason and candidates, ties, guard rejections, the verified-estimate rule, exclusions,
offline, draining and left devices, running tasks past their end and a clock that steps back
included."""

from __future__ import annotations

import random
from typing import Any

import pytest

from hpc_ds1.events import (
    DeviceDraining,
    DeviceLeft,
    DeviceRegistered,
    DeviceStatusChanged,
    Event,
    MeasurementRecorded,
    ModelPublished,
    TaskFinished,
    TaskRequeued,
    TaskRunFailed,
    TaskStarted,
    TaskSubmitted,
)
from hpc_ds1.fleet.finishes import FinishIndex
from hpc_ds1.fleet.placement import (
    MAX_CANDIDATES,
    Estimate,
    FleetState,
    Placement,
    TaskSpec,
    Waiting,
    place,
)
from tests.services.placement.devices import FP

JOBS = [("nbody", 64), ("nbody", 128), ("gemm", 64), ("stencil", 32)]
CONFIG = {"ranks": 1, "threads": 2, "tile": 64, "gpu": False}


class Fleet:
    """A fleet folded from events, placed by the index and by the reference."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.state = FleetState()
        self.index = FinishIndex(self.state)
        self.seq = 0
        self.now = 1.7e9 if rng.random() < 0.5 else 100.0
        self.tasks = 0
        self.compared = 0
        self.scanned = 0  # placements with at least MAX_CANDIDATES candidates

    def apply(self, event: Event) -> None:
        self.seq += 1
        self.state.apply(self.seq, event, self.now)

    def runtime(self) -> float:
        rng = self.rng
        return rng.choice((0.5, 1.0, 1.0, 2.0, rng.uniform(0.05, 5.0), 1e-6))

    def estimate(self, did: str, workload: str, size: int) -> None:
        rng = self.rng
        if rng.random() < 0.5:
            self.apply(
                MeasurementRecorded(
                    measurement_id=f"m{self.seq}",
                    device_id=did,
                    workload=workload,
                    size=size,
                    config=CONFIG,
                    status="ok",
                    runtime_s=self.runtime(),
                    check_ok=True,
                )
            )
        else:
            guard = ("outside what its model knows",) if rng.random() < 0.2 else ()
            est = Estimate(self.runtime(), CONFIG, "predicted", not guard, guard, f"{did}:v1")
            self.state.set_prediction(did, workload, size, est)

    def join(self, did: str) -> None:
        rng = self.rng
        self.apply(
            DeviceRegistered(device_id=did, hostname=did, fingerprint=FP, local=rng.random() < 0.05)
        )
        self.apply(DeviceStatusChanged(device_id=did, status="online"))
        for workload, size in JOBS:
            if rng.random() < 0.9:
                self.estimate(did, workload, size)

    def check(self, spec: TaskSpec, excluded: frozenset[str] | set[str]) -> Placement | Waiting:
        ours = self.index.place(spec, self.now, excluded)
        reference = place(spec, self.state.devices.values(), self.now, excluded)
        assert ours == reference, (spec, sorted(excluded))
        self.compared += 1
        if isinstance(ours, Placement) and len(ours.candidates) == MAX_CANDIDATES:
            self.scanned += 1
        return ours

    def place_task(self, task_id: str) -> None:
        task = self.state.tasks[task_id]
        result = self.check(task.spec, task.failed_on)
        if isinstance(result, Placement):
            self.apply(result.event(task.attempt + 1))

    def step(self) -> None:
        rng, state = self.rng, self.state
        devices = sorted(state.devices)
        did = rng.choice(devices)
        live = sorted(state.tasks)
        roll = rng.random()
        if roll < 0.35:
            self.tasks += 1
            workload, size = rng.choice([*JOBS, ("montecarlo", 8)] if rng.random() < 0.05 else JOBS)
            task_id = f"t{self.tasks}"
            self.apply(
                TaskSubmitted(task_id=task_id, workload=workload, size=size, submitted_by="u")
            )
            self.place_task(task_id)
        elif roll < 0.45 and live:
            task = state.tasks[rng.choice(live)]
            if task.status == "placed" and task.device_id is not None:
                self.apply(
                    TaskStarted(
                        task_id=task.task_id, attempt=task.attempt, device_id=task.device_id
                    )
                )
        elif roll < 0.55 and live:
            task = state.tasks[rng.choice(live)]
            if task.status in ("placed", "running") and task.device_id is not None:
                self.apply(
                    TaskFinished(
                        task_id=task.task_id,
                        attempt=task.attempt,
                        device_id=task.device_id,
                        config=CONFIG,
                        runtime_s=rng.choice((0.5, 1.0, 2.0, rng.uniform(0.1, 4.0))),
                    )
                )
        elif roll < 0.62 and live:
            task = state.tasks[rng.choice(live)]
            if task.status in ("placed", "running") and task.device_id is not None:
                failed = TaskRunFailed(
                    task_id=task.task_id,
                    attempt=task.attempt,
                    device_id=task.device_id,
                    error="boom",
                )
                self.apply(failed)
                self.apply(
                    TaskRequeued(
                        task_id=task.task_id,
                        attempt=task.attempt,
                        device_id=task.device_id,
                        reason="failed",
                    )
                )
                self.place_task(task.task_id)
        elif roll < 0.68:
            status = "online" if rng.random() < 0.6 else "offline"
            self.apply(DeviceStatusChanged(device_id=did, status=status))
        elif roll < 0.71:
            self.apply(DeviceDraining(device_id=did, draining=rng.random() < 0.5, by="x"))
        elif roll < 0.73:
            self.apply(DeviceLeft(device_id=did, reason="gone"))
        elif roll < 0.75:
            self.join(f"d{len(devices):03d}" if rng.random() < 0.5 else did)
        elif roll < 0.78:
            self.state.set_liveness({d: rng.random() < 0.9 for d in devices})
        elif roll < 0.82:
            running = [(d, t) for d in devices for t in state.devices[d].running]
            if running:
                d, t = rng.choice(running)
                start = state.devices[d].running[t].started_at  # a heartbeat's jitter, or more
                moved = rng.uniform(-0.03, 0.03) if rng.random() < 0.5 else rng.uniform(-3, 1.5)
                self.state.running_since(d, t, start + moved)
        elif roll < 0.85:
            version = f"{did}:v{self.seq}"
            self.apply(
                ModelPublished(
                    model_version=version,
                    device_id=did,
                    artifact=f"{did}/{self.seq}.onnx",
                    sha256="0" * 64,
                    trained_on=3,
                )
            )
            for workload, size in JOBS:
                if rng.random() < 0.5:
                    self.estimate(did, workload, size)
        elif roll < 0.9:
            workload, size = rng.choice(JOBS)
            self.estimate(did, workload, size)
        elif roll < 0.95:
            workload, size = rng.choice(JOBS)  # an estimate request: nothing excluded
            excluded = {rng.choice(devices)} if rng.random() < 0.3 else set()
            self.check(TaskSpec("estimate", workload, size), excluded)
        # time goes on: in steps, past running tasks' ends, and now and then back
        self.now += rng.choice((0.0, 0.0, 0.01, 0.3, 1.0, 4.0, -0.5))


@pytest.mark.parametrize("seed", range(12))
def test_the_index_places_every_task_where_the_reference_does(seed: int) -> None:
    rng = random.Random(seed)
    fleet = Fleet(rng)
    for i in range((3, 20, 40, 90, 220, 60)[seed % 6]):
        fleet.join(f"d{i:03d}")
        if rng.random() < 0.05:
            fleet.apply(DeviceStatusChanged(device_id=f"d{i:03d}", status="offline"))
    for _ in range(400):
        fleet.step()
    assert fleet.compared > 100


def test_ties_at_the_verified_floor_go_by_device_id() -> None:
    """Hundreds of idle devices claiming less than the verified best: every one counts as the
    floor, and the 16 candidates are the lowest ids, as the reference has them."""
    fleet = Fleet(random.Random(0))
    for i in range(300):
        did = f"d{i:03d}"
        fleet.apply(DeviceRegistered(device_id=did, hostname=did, fingerprint=FP))
        fleet.apply(DeviceStatusChanged(device_id=did, status="online"))
        est = Estimate(0.01, CONFIG, "predicted", True, (), f"{did}:v1")
        fleet.state.set_prediction(did, "nbody", 64, est)
    fleet.apply(DeviceRegistered(device_id="ref", hostname="ref", fingerprint=FP, local=True))
    fleet.apply(DeviceStatusChanged(device_id="ref", status="online"))
    fleet.state.set_prediction("ref", "nbody", 64, Estimate(1.0, CONFIG, "measured", True, (), "m"))
    for i in range(60):
        fleet.apply(TaskSubmitted(task_id=f"t{i}", workload="nbody", size=64, submitted_by="u"))
        fleet.place_task(f"t{i}")
        fleet.now += 0.01
    assert fleet.scanned == 60
    first: Any = fleet.check(TaskSpec("estimate", "nbody", 64), set())
    assert first.device_id == "d060" and first.finish_s == pytest.approx(1.0 / 1.1)
