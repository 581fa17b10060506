"""A publisher that keeps going through faults: every event is retried, with the same envelope id
(the `Nats-Msg-Id`), until the server acknowledges it; the acknowledged ids are what the
scenarios later look for in the stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import Envelope, MeasurementRecorded, envelope


def measurement(prefix: str, i: int, tag: str = "f") -> Envelope:
    return envelope(
        MeasurementRecorded(
            measurement_id=f"{tag}{i}",
            device_id="faults",
            workload="gemm",
            size=1024,
            config={"ranks": 1, "threads": 2, "tile": 64},
            status="ok",
            runtime_s=0.1,
            throughput=20.0,
            throughput_unit="GFLOP/s",
        ),
        actor="faults",
        source="faults",
        prefix=prefix,
    )


@dataclass
class Published:
    acked: list[str] = field(default_factory=list)
    retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    unacked: list[str] = field(default_factory=list)  # gave up on these (deadline)


async def publish_through_faults(
    bus: EventBus,
    events: list[Envelope],
    window: int = 8,
    within_s: float = 120.0,
    on_ack: Callable[[str], None] | None = None,
) -> Published:
    """Publish `events` with `window` in flight; each one retried until acknowledged or until
    `within_s` has passed (then it is reported as unacked, never as acked)."""
    out = Published()
    queue: asyncio.Queue[Envelope] = asyncio.Queue()
    for env in events:
        queue.put_nowait(env)
    deadline = time.monotonic() + within_s

    async def worker() -> None:
        while True:
            try:
                env = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            while True:
                try:
                    await bus.publish(env)
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    name = type(error).__name__
                    out.errors[name] = out.errors.get(name, 0) + 1
                    if time.monotonic() > deadline:
                        out.unacked.append(env.id)
                        break
                    out.retries += 1
                    await asyncio.sleep(0.1)
                    continue
                out.acked.append(env.id)
                if on_ack is not None:
                    on_ack(env.id)
                break

    await asyncio.gather(*(worker() for _ in range(window)))
    return out
