"""Runs requested jobs for real on this device and records each one.

Requests are accepted concurrently (each in its own task) and run one at a time, in the order
they came, from a bounded queue; the device lock still keeps other processes of the same home off
the device. Every request gets an answer: the result, or `{"ok": false, "error": ...}` (bad
input, a run past the wall-time cap, a full queue, a stop, a measurement that could not be
recorded, or anything unexpected). On stop the running job's processes are killed at once; so
are those of a run whose session is cancelled (`handle_cancel`, issue 44: its whole process
group), and a cancelled session's runs still queued never start."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
from pydantic import ValidationError

from hpc_ds1.events import envelope, new_id
from hpc_ds1.log import get_logger
from hpc_ds1.machine.devicelock import Cancelled, device_lock
from hpc_ds1.measure import (
    PUBLISH_RETRY_DELAYS_S,
    heartbeats,
    measurement_event,
    publish_retrying,
    while_in_flight,
)
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.requests import CancelRunRequest, RunRequest
from hpc_ds1.runner import InvalidJob, RunResult, run, run_timeout, validate
from hpc_ds1.runner.estimate import check_cap, from_measurements, load_measured
from hpc_ds1.runner.inflight import InFlight
from hpc_ds1.space import Config, ConfigSpace

log = get_logger("agent")
T = TypeVar("T")

QUEUE_LIMIT = 32  # runs waiting for the device; more are refused (503) until it drains
STOP_GRACE_S = 15.0  # how long a stop waits for the killed job and the replies to go out
STOPPING = "the agent is stopping; the job did not run to the end (its processes were killed)"
CANCELS_KEPT = 256  # cancelled sessions remembered, for their runs still on their way here


@dataclass(frozen=True)
class Checked:
    request: RunRequest
    config: Config
    space: ConfigSpace


@dataclass
class Queued:
    """A request in the device's queue (in arrival order): its check, then its answer; or, with
    `call`, a piece of work of the agent's own (a fleet task) whose outcome is the answer."""

    checked: asyncio.Future[Checked | None]  # None: refused, and answered already
    reply: asyncio.Future[Any]
    call: Callable[[], Awaitable[Any]] | None = None


def sweep_leftovers(home: Path) -> None:
    """Take the device lock for a moment if it is free: whoever takes it kills the processes of
    a job left on record there (its runner and guard died); if it is busy, the holder runs."""
    with contextlib.suppress(TimeoutError), device_lock(home, timeout=0):
        pass


def _error(status: int, message: str, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "status": status, "error": message, **extra}


def _cancelled(request: RunRequest, by: str, ran: bool) -> str:
    what = "its run was killed (the whole process group)" if ran else "its run did not start"
    return f"session {request.session_id} was cancelled by {by}: {what}"


class JobRunner:
    def __init__(self, ctx: ServiceContext, device_id: str) -> None:
        self.ctx = ctx
        self.device_id = device_id
        self.queue: asyncio.Queue[Queued] = asyncio.Queue(QUEUE_LIMIT)
        self.cancel = threading.Event()  # set on stop: kills the running job
        self.running: RunRequest | None = None
        self._run_cancel: threading.Event | None = None  # set: kills the running job alone
        self.cancelled: OrderedDict[str, str] = OrderedDict()  # session id -> who cancelled
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._worker: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._worker = asyncio.create_task(self._work(), name="agent-jobs")

    def queued(self) -> int:
        return self.queue.qsize()

    async def in_turn(self, call: Callable[[], Awaitable[T]]) -> T:
        """Await `call()` when its turn in the device's queue comes (after the runs asked
        before it, and before those asked after): how a fleet task shares the device with the
        requested runs. Raises Cancelled when the agent stops before or while it runs."""
        if self.cancel.is_set():
            raise Cancelled(STOPPING)
        loop = asyncio.get_running_loop()
        item = Queued(loop.create_future(), loop.create_future(), call)
        await self.queue.put(item)  # waits (rather than refusing) while the queue is full
        found: T = await item.reply
        return found

    # --- requests -----------------------------------------------------------------------
    async def handle(self, msg: Any) -> None:
        """The subscription's callback: takes the request's place in the queue (so runs go in
        the order requests came) and answers in a task of its own, so it returns at once."""
        loop = asyncio.get_running_loop()
        item = Queued(loop.create_future(), loop.create_future())
        if self.cancel.is_set():
            item.reply.set_result(_error(503, STOPPING))
        else:
            try:
                self.queue.put_nowait(item)
            except asyncio.QueueFull:
                busy = f"the device's queue is full ({QUEUE_LIMIT} runs waiting); try later"
                item.reply.set_result(_error(503, busy))
        task = asyncio.create_task(self._answer(msg, item))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Any, item: Queued) -> None:
        try:
            body = await self.accept(msg.data, item)
        except asyncio.CancelledError:
            body = _error(503, STOPPING)
        except Exception as error:  # whatever happens, the caller gets an answer
            log.error("run_request_failed", error=repr(error))
            body = _error(500, f"{type(error).__name__}: {error}")
        try:
            await msg.respond(orjson.dumps(body, default=str))
        except Exception as error:
            log.error("reply_failed", error=repr(error))

    async def accept(self, data: bytes, item: Queued) -> dict[str, Any]:
        """Check the queued request (at once, not at its turn), then wait for its result."""
        if item.reply.done():
            return item.reply.result()
        checked: Checked | None = None
        try:
            request = RunRequest.model_validate_json(data)
            config = Config.model_validate(request.config)
            space = await asyncio.to_thread(self._check, request, config)
            checked = Checked(request, config, space)
        except (ValidationError, InvalidJob, ValueError, LookupError) as error:
            return _error(422, str(error))
        finally:
            if not item.checked.done():
                item.checked.set_result(checked)  # the queue moves on either way
        return await item.reply

    def _check(self, request: RunRequest, config: Config) -> ConfigSpace:
        """InvalidJob before queueing: what the runner refuses, and a run past the cap."""
        space = ConfigSpace.for_device(workload=request.workload)
        if request.purpose == "decide":
            # A decision starts from the user's own configuration, which may oversubscribe.
            space = space.runnable()
        wl, size = validate(request.workload, request.size, config, space)
        try:
            measured = load_measured(self.ctx.engine, self.device_id, wl.name)
        except Exception as error:  # no estimate then: the run's timeout still caps it
            log.warning("no_runtime_estimate", error=repr(error))
            measured = []
        estimate = from_measurements(wl, size, config, measured, request.repeats)
        check_cap(estimate, self.ctx.settings.max_run_s, wl.name, size)
        return space

    # --- the device's queue ---------------------------------------------------------------
    async def _work(self) -> None:
        while True:
            item = await self.queue.get()
            if item.call is not None:
                await self._call(item, item.call)
                continue
            checked = await item.checked
            if checked is None or item.reply.done():
                continue
            by = self._cancelled_by(checked.request)
            if by is not None:
                item.reply.set_result(_error(409, _cancelled(checked.request, by, ran=False)))
                continue
            self.running = checked.request
            self._idle.clear()
            try:
                body = await self.execute(checked.request, checked.config, checked.space)
            except Cancelled:
                by = self._cancelled_by(checked.request)
                body = (
                    _error(503, STOPPING)
                    if by is None
                    else _error(409, _cancelled(checked.request, by, ran=True))
                )
            except (InvalidJob, ValueError, LookupError) as error:
                body = _error(422, str(error))
            except Exception as error:
                log.error("job_failed", error=repr(error))
                body = _error(500, f"{type(error).__name__}: {error}")
            finally:
                self.running = None
                self._idle.set()
            if not item.reply.done():
                item.reply.set_result(body)

    async def _call(self, item: Queued, call: Callable[[], Awaitable[Any]]) -> None:
        self._idle.clear()
        try:
            outcome = await call()
        except asyncio.CancelledError:
            item.reply.cancel()
            raise
        except Exception as error:
            if not item.reply.done():
                item.reply.set_exception(error)
        else:
            if not item.reply.done():
                item.reply.set_result(outcome)
        finally:
            self._idle.set()

    async def execute(
        self, request: RunRequest, config: Config, space: ConfigSpace
    ) -> dict[str, Any]:
        home = self.ctx.settings.home
        cap = self.ctx.settings.max_run_s

        # a workload file's own `timeout` (issue 44), never past the cap
        timeout_s = run_timeout(request.workload, None, cap=cap, default=cap)
        inflight = InFlight()  # a run longer than HPC_DS1_RUN_HEARTBEAT_S says so in the log
        # This run's own cancel: set by a stop (self.cancel too) or by its session's cancel.
        cancel = threading.Event()
        self._run_cancel = cancel
        if self.cancel.is_set():
            cancel.set()

        def measure() -> RunResult:
            with device_lock(home, cancel=cancel):
                return run(
                    request.workload,
                    request.size,
                    config,
                    repeats=request.repeats,
                    space=space,
                    timeout_s=timeout_s,
                    cancel=cancel,
                    on_start=inflight.start,
                )

        beat = heartbeats(
            self.ctx.bus,
            self.ctx.settings.subject_prefix,
            run_id=request.session_id or f"{request.purpose}-{new_id()[:16]}",
            device_id=self.device_id,
            purpose=request.purpose,
            actor=request.actor,
            source="agent",
            timeout_s=lambda _: timeout_s,
            session_id=request.session_id,
        )
        try:
            result = await while_in_flight(
                asyncio.to_thread(measure),
                inflight,
                heartbeat_s=self.ctx.settings.run_heartbeat_s,
                beat=beat,
            )
        finally:
            self._run_cancel = None
        event = measurement_event(result, self.device_id, request.purpose)
        env = envelope(
            event, actor=request.actor, source="agent", prefix=self.ctx.settings.subject_prefix
        )
        log.info(
            "job_run",
            workload=request.workload,
            size=request.size,
            config=config.label(),
            status=result.status.value,
            runtime_s=result.runtime_s,
        )
        outcome = result.model_dump(mode="json")
        try:
            await publish_retrying(self.ctx.bus, env, PUBLISH_RETRY_DELAYS_S)
        except Exception as error:
            log.error("measurement_not_recorded", event_id=env.id, error=repr(error))
            return _error(
                503,
                f"the job ran (status {result.status.value}) but its measurement "
                f"{event.measurement_id} could not be recorded after "
                f"{len(PUBLISH_RETRY_DELAYS_S) + 1} attempts: {error!r}",
                result=outcome,
                measurement_id=None,
            )
        return {"ok": True, "result": outcome, "measurement_id": event.measurement_id}

    # --- cancel ---------------------------------------------------------------------------
    async def handle_cancel(self, msg: Any) -> None:
        """The cancel subscription's callback (agent_cancel_subject): a session was cancelled
        (cancel.requested, sent on by the coordinator). Its run in flight is killed, its whole
        process group; its runs still queued, or still on their way, are answered 409 and never
        start. The answer says whether a run was killed. Only this device's own runs: the
        agent acts on nothing else."""
        try:
            ask = CancelRunRequest.model_validate_json(msg.data)
        except ValidationError as error:
            body: dict[str, Any] = _error(422, str(error))
        else:
            body = {"ok": True, "killed": self.cancel_session(ask.session_id, ask.by)}
        try:
            await msg.respond(orjson.dumps(body, default=str))
        except Exception as error:
            log.warning("cancel_reply_failed", error=repr(error))

    def cancel_session(self, session_id: str, by: str) -> bool:
        """Remember the session as cancelled by `by`; kill its running job. Whether one ran."""
        self.cancelled[session_id] = by
        self.cancelled.move_to_end(session_id)
        while len(self.cancelled) > CANCELS_KEPT:
            self.cancelled.popitem(last=False)
        running, cancel = self.running, self._run_cancel
        killed = running is not None and running.session_id == session_id and cancel is not None
        if killed:
            assert cancel is not None
            cancel.set()  # the runner kills the launch's whole process group
        log.info("session_run_cancelled", session_id=session_id, by=by, killed=killed)
        return killed

    def _cancelled_by(self, request: RunRequest) -> str | None:
        return None if request.session_id is None else self.cancelled.get(request.session_id)

    # --- stop -----------------------------------------------------------------------------
    async def stop(self) -> None:
        """Kill the running job, answer every waiting request, and return within seconds."""
        self.cancel.set()
        if self._run_cancel is not None:
            self._run_cancel.set()
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if item.reply.done():
                continue
            if item.call is not None:
                item.reply.set_exception(Cancelled(STOPPING))
            else:
                item.reply.set_result(_error(503, STOPPING))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_GRACE_S
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), STOP_GRACE_S)
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=max(deadline - loop.time(), 1.0))
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
