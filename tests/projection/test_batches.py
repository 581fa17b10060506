"""The rows the store writes do not depend on how the log is cut into batches: a log of task,
device and token events (repeated, stale and out of order, one of them a value Postgres refuses)
applied event by event, in batches of a few, and whole gives the same rows and sets aside the
same event."""

from __future__ import annotations

import random
from typing import Any

from sqlalchemy import Engine

from hpc_ds1.events import (
    DeviceDraining,
    DeviceRegistered,
    DeviceStatusChanged,
    Event,
    TaskFailed,
    TaskFinished,
    TaskPlaced,
    TaskRequeued,
    TaskRunFailed,
    TaskStarted,
    TaskSubmitted,
    TaskWaiting,
    TokenCreated,
    TokenRevoked,
    TokenUsed,
    envelope,
)
from hpc_ds1.projection.fold import Folded, find_gaps, fold
from hpc_ds1.projection.store import apply, read_checkpoint, record_gaps, truncate_read_models

from ..services.projector.projection import snapshot

DEVICES = ("d1", "d2", "ghost")


def _story(seed: int, n: int) -> list[Event]:
    rng = random.Random(seed)
    out: list[Event] = [DeviceRegistered(device_id=d, hostname=d) for d in DEVICES[:2]]
    for _ in range(n):
        task, attempt, device = (
            rng.choice(("t1", "t2", "t3")),
            rng.randint(1, 3),
            rng.choice(DEVICES),
        )
        out.append(
            rng.choice(
                [
                    TaskSubmitted(task_id=task, workload="gemm", size=256, submitted_by="a"),
                    TaskPlaced(
                        task_id=task,
                        attempt=attempt,
                        device_id=device,
                        config={"ranks": attempt},
                        expected_s=1.0,
                        queue_s=0.0,
                        basis="measured",
                        reason="first",
                    ),
                    TaskWaiting(task_id=task, reason="none online"),
                    TaskStarted(task_id=task, attempt=attempt, device_id=device),
                    TaskFinished(
                        task_id=task,
                        attempt=attempt,
                        device_id=device,
                        config={},
                        runtime_s=rng.choice((1.0, 90.0)),
                        expected_s=1.0,
                    ),
                    TaskRunFailed(task_id=task, attempt=attempt, device_id=device, error="exit 1"),
                    TaskRequeued(task_id=task, attempt=attempt, device_id=device, reason="lost"),
                    TaskFailed(task_id=task, reasons=rng.choice(([], ["x", "y"]))),
                    DeviceStatusChanged(device_id=device, status="offline", reason="quiet"),
                    DeviceDraining(device_id=device, draining=True, by="a"),
                    TokenCreated(token_id="k1", holder="a", role="join", sha256="0" * 64),
                    TokenUsed(token_id="k1", device_id=device),
                    TokenRevoked(token_id="k1"),
                ]
            )
        )
    # Postgres refuses the second (an attempt past the column's 32 bits); the placement after
    # it must be judged against the row without it, in any batch.
    poison, then = (
        TaskPlaced(
            task_id="t4",
            attempt=attempt,
            device_id="d1",
            config={},
            expected_s=1.0,
            queue_s=0.0,
            basis="measured",
            reason="",
        )
        for attempt in (2**40, 1)
    )
    submitted = TaskSubmitted(task_id="t4", workload="gemm", size=256, submitted_by="a")
    out[len(out) // 2 : len(out) // 2] = [submitted, poison, then]
    return out


def _project(engine: Engine, log: list[tuple[int, str, bytes]], size: int) -> tuple[Any, list[int]]:
    aside: list[int] = []
    with engine.begin() as conn:
        read_checkpoint(conn, lock=True)
        truncate_read_models(conn)
    for start in range(0, len(log), size):
        folded: list[Folded] = [fold(*m) for m in log[start : start + size]]
        with engine.begin() as conn:
            checkpoint = read_checkpoint(conn, lock=True)
            record_gaps(conn, find_gaps(checkpoint, [f.seq for f in folded]))
            result = apply(conn, folded, checkpoint)
            aside += [a.seq for a in result.set_aside]
    return snapshot(engine), aside


def test_the_rows_do_not_depend_on_the_batches(engine: Engine) -> None:
    for seed in (1, 2):
        envs = [envelope(e, actor="a", source="test", prefix="p") for e in _story(seed, 120)]
        log = [(n, env.subject, env.to_json()) for n, env in enumerate(envs, 1)]
        poison = next(n for n, env in enumerate(envs, 1) if env.data.get("attempt") == 2**40)
        one, aside = _project(engine, log, 1)
        assert aside == [poison]
        assert one["tasks"] and one["tokens"]
        t4 = next(row for row in one["tasks"] if row[0] == "t4")
        assert t4[4:6] == ("placed", 1)  # status, attempt: the poison left no trace
        for size in (7, len(log)):
            assert _project(engine, log, size) == (one, aside), size
