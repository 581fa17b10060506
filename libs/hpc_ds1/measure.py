"""A real run's result as the event that records it, and its publication (retried); and what
the event loop does while a run is in flight (`while_in_flight`): the progress bar's label
and the run.heartbeat events of a run that takes longer than the heartbeat interval."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import Envelope, MeasurementRecorded, RunHeartbeat, envelope, new_id
from hpc_ds1.log import get_logger
from hpc_ds1.runner import RunResult
from hpc_ds1.runner.inflight import InFlight, Running
from hpc_ds1.space import Config

log = get_logger("measure")
# Beyond the bus's own resending of an unanswered append (bus.PUBLISH_RETRY_S): any failure.
PUBLISH_RETRY_DELAYS_S = (1.0, 4.0)
TICK_S = 1.0  # how often the progress bar's label says how long the run in flight has run
T = TypeVar("T")


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


async def while_in_flight(
    running: Awaitable[T],
    inflight: InFlight,
    *,
    heartbeat_s: float,
    beat: Callable[[Running, int], Awaitable[None]] | None = None,
    show: Callable[[Running], None] | None = None,
    tick_s: float = TICK_S,
) -> T:
    """Await `running` (a measurement thread: asyncio.to_thread), and meanwhile, every tick,
    `show` what `inflight` says runs now (the progress bar), and `beat(running, n)` the n-th
    time a run has been in flight for n x `heartbeat_s` (its heartbeats; a run shorter than
    the interval has none). A heartbeat that cannot be published is logged, never in the
    run's way. Cancelling this leaves the thread running: the caller stops it (its cancel
    event), as before."""
    task = asyncio.ensure_future(running)
    tick = min(tick_s, heartbeat_s)
    beats: dict[int, int] = {}  # a run's number -> heartbeats sent for it
    while True:
        try:
            done, _ = await asyncio.wait({task}, timeout=tick)
        except asyncio.CancelledError:
            task.cancel()  # as a cancelled `await asyncio.to_thread(...)` would be
            raise
        if done:
            return task.result()
        now = inflight.now()
        if now is None:
            continue
        if show is not None:
            show(now)
        sent = beats.get(now.number, 0)
        if beat is not None and now.elapsed_s >= (sent + 1) * heartbeat_s:
            beats = {now.number: sent + 1}  # earlier runs are over: forget them
            try:
                await beat(now, sent + 1)
            except Exception as error:
                log.warning("heartbeat_not_published", error=repr(error))


Beat = Callable[[Running, int], Awaitable[None]]


def heartbeats(
    bus: EventBus,
    prefix: str,
    *,
    run_id: str,
    device_id: str,
    purpose: str,
    actor: str,
    source: str,
    timeout_s: Callable[[str], float | None],
    progress: Callable[[], tuple[int, int]] = lambda: (0, 0),
    session_id: str | None = None,
    task_id: str | None = None,
) -> Beat:
    """The `beat` of while_in_flight that publishes run.heartbeat events: `run_id` (a subject
    token: a campaign's, a session's) names them, `timeout_s(workload)` says when the run in
    flight is killed, `progress()` is (runs done, runs planned) of a campaign."""

    async def beat(now: Running, n: int) -> None:
        job = now.job
        done, total = progress()
        event = RunHeartbeat(
            run_id=run_id,
            device_id=device_id,
            purpose=purpose,
            workload=job.workload,
            size=job.size,
            config=job.config.model_dump(mode="json"),
            elapsed_s=round(now.elapsed_s, 3),
            timeout_s=timeout_s(job.workload),
            beat=n,
            done=done,
            total=total,
            session_id=session_id,
            task_id=task_id,
        )
        await bus.publish(envelope(event, actor=actor, source=source, prefix=prefix))

    return beat
