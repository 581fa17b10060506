"""A real run's result as the event that records it, and its publication (retried)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence

from hpc_ds1.bus import EventBus
from hpc_ds1.events import Envelope, MeasurementRecorded, new_id
from hpc_ds1.log import get_logger
from hpc_ds1.runner import RunResult
from hpc_ds1.space import Config

log = get_logger("measure")
# Beyond the bus's own resending of an unanswered append (bus.PUBLISH_RETRY_S): any failure.
PUBLISH_RETRY_DELAYS_S = (1.0, 4.0)


def config_key(config: Config) -> str:
    """A short, subject-safe name of a configuration, e.g. r2-t1-k128-cpu (r2-t1-k128-b64-cpu
    with a block; r2-t1-k1-cpu-o<digest> with knobs of the workload's own)."""
    block = f"-b{config.block}" if config.block else ""
    device = "gpu" if config.gpu else "cpu"
    # a workload's own knobs as a digest: their values may hold '.', a subject's separator
    own = f"-o{_digest(config)}" if config.knobs else ""
    return f"r{config.ranks}-t{config.threads}-k{config.tile}{block}-{device}{own}"


def _digest(config: Config) -> str:
    text = ",".join(f"{name}={value!r}" for name, value in config.knobs)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def measurement_event(
    result: RunResult,
    device_id: str,
    purpose: str,
    measurement_id: str | None = None,
    held_out: bool = False,
) -> MeasurementRecorded:
    return MeasurementRecorded(
        measurement_id=measurement_id or new_id(),
        device_id=device_id,
        workload=result.workload,
        size=result.size,
        config=result.config.model_dump(),
        status=result.status.value,
        runtime_s=result.runtime_s,
        throughput=result.throughput,
        throughput_unit=result.throughput_unit,
        repeats=max(1, result.repeats),
        spread=result.spread,
        check_ok=result.check_ok,
        check_error=result.check_error,
        held_out=held_out,
        purpose=purpose,
    )


async def publish_retrying(
    bus: EventBus,
    env: Envelope,
    delays_s: Sequence[float] = PUBLISH_RETRY_DELAYS_S,
    on_retry: Callable[[int, Exception], Awaitable[None]] | None = None,
) -> int:
    """Publish `env`, again after each delay while it fails (the same envelope, so the same
    event id: the stream's deduplication stores it once); its sequence, or the last error.
    `on_retry(attempt, error)` is awaited before each new attempt."""
    for attempt in range(len(delays_s) + 1):
        try:
            return await bus.publish(env)
        except Exception as error:
            if attempt == len(delays_s):
                raise
            log.warning("publish_retry", event_id=env.id, attempt=attempt + 1, error=repr(error))
            if on_retry is not None:
                await on_retry(attempt + 1, error)
            await asyncio.sleep(delays_s[attempt])
    raise AssertionError("unreachable")
