"""The placement service: folds the fleet from the log (devices, measurements, models, tasks)
and liveness from the heartbeat bucket, and places every submitted or requeued task on the
device expected to finish it first (hpc_ds1.fleet.placement), then puts it on that device's
queue.

On start it replays the log, then follows it from there. Every event it appends to a task uses
the task's last sequence as the expected version, and a deterministic envelope id
(`placed-<task>-<attempt>`), so two placements of one attempt cannot both land; what it appends
it folds at once (a task event folded twice is skipped by sequence), so a burst of tasks sees
each other's queue. Tasks placed but not started are put on their queue again at start (the
queue de-duplicates them). A waiting task is tried again when the fleet changes."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

import orjson
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from hpc_ds1.eventlog.bus import ConcurrencyConflict, until_answered
from hpc_ds1.events import (
    Envelope,
    Event,
    MalformedEvent,
    TaskFailed,
    decode,
    envelope,
    typed,
)
from hpc_ds1.fleet import liveness
from hpc_ds1.fleet.finishes import FinishIndex
from hpc_ds1.fleet.placement import (
    DeviceView,
    Estimate,
    FleetState,
    Placement,
    TaskSpec,
    TaskView,
    Waiting,
)
from hpc_ds1.fleet.work import WorkItem, enqueue, ensure_work_stream
from hpc_ds1.log import get_logger
from hpc_ds1.models_store import models_bucket
from hpc_ds1.process.runtime import ServiceContext

log = get_logger("placement")

DURABLE = "placement"
LIVENESS_POLL_S = 1.0
RETRY_CONFLICT_S = 0.2
MODELS_KEPT = 32  # loaded models kept (each an onnxruntime session); predictions are cached apart
FOLLOW_FAILURES = 5  # fetches failing in a row before the consumer is made again


class PlacementService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.bus = ctx.bus
        self.state = FleetState()
        self.index = FinishIndex(self.state)  # placement without a pass over every device
        self.wake = asyncio.Event()
        self.pending: set[str] = set()
        self.retry_waiting = False
        self.unqueued: dict[str, WorkItem] = {}  # placed, not yet on the device's queue
        self.placed = 0
        self.followed = 0  # the last stream sequence the follower took
        self.kv: Any = None
        self._models: dict[str, Any] = {}  # model version -> Model
        self._model_errors: dict[str, str] = {}  # model version -> why it cannot be used
        self._predict_failed: set[tuple[str, str, int]] = set()

    # --- the fold ---------------------------------------------------------------------------

    def fold(self, seq: int, env: Envelope, event: Event) -> None:
        change = self.state.apply(seq, event, env.time.timestamp())
        if change.task is not None:
            self.pending.add(change.task)
            self.wake.set()
        if change.fleet:
            self.retry_waiting = True
            self.wake.set()

    def take(self, seq: int, subject: str, data: bytes) -> None:
        """Fold one stored event. One this version does not know, or cannot read, still moves
        its task's version on (placement appends after it, not in front of it); raises
        MalformedEvent for the caller to set it aside."""
        try:
            env = decode(data, subject)
            event = typed(env)
        except MalformedEvent:
            self._saw(subject, seq)
            raise
        if event is None:
            self._saw(subject, seq)
        else:
            self.fold(seq, env, event)

    def _saw(self, subject: str, seq: int) -> None:
        parts = subject.split(".")
        if len(parts) == 4 and parts[1] == "task":
            self.state.saw(parts[2], seq)

    async def catch_up(self, task_id: str) -> None:
        """Fold the task's events after the last one folded (the follower may be behind)."""
        task = self.state.tasks.get(task_id)
        if task is None:
            return
        subject = self.bus.aggregate_subjects("task", task_id)
        async for chunk in self.bus.replay(task.version + 1, subject):
            for raw in chunk:
                with contextlib.suppress(MalformedEvent):
                    self.take(raw.seq, raw.subject, raw.data)

    async def replay(self) -> int:
        """Fold the whole log as it is now; the last sequence folded."""
        last = await self.bus.last_sequence()
        folded = 0
        followed = [f"{self.bus.prefix}.{a}.>" for a in FleetState.FOLDED_AGGREGATES]
        async for chunk in self.bus.replay(1, followed, stop_at=last):
            for raw in chunk:
                try:
                    self.take(raw.seq, raw.subject, raw.data)
                except MalformedEvent as error:  # kept in the log, never in placement's way
                    log.warning("event_skipped", seq=raw.seq, error=str(error)[:300])
                    continue
                folded += 1
        log.info(
            "replayed",
            last_seq=last,
            events=folded,
            devices=len(self.state.devices),
            tasks=len(self.state.tasks),
        )
        return last

    async def _subscribe(self, start_seq: int) -> Any:
        js, stream = self.bus.js, self.bus.stream
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(stream, DURABLE)  # from before: its position is not ours
        prefix = self.bus.prefix
        config = ConsumerConfig(
            filter_subjects=[f"{prefix}.{a}.>" for a in FleetState.FOLDED_AGGREGATES],
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start_seq,
            ack_policy=AckPolicy.EXPLICIT,
            max_deliver=self.settings.max_deliver,
            ack_wait=30.0,
        )
        # Asked again while a cluster elects a leader (an identical consumer is a success).
        return await until_answered(
            lambda: js.pull_subscribe(f"{prefix}.>", durable=DURABLE, stream=stream, config=config),
            stream,
        )

    async def follow(self, start_seq: int) -> None:
        """Fold every event from `start_seq` on, as it is appended, until stop. An event that
        cannot be decoded goes to the dead-letter stream, like bus.consume does. A consumer
        that keeps failing (removed, or lost with its server) is made again from the event
        after the last one folded."""
        self.followed = start_seq - 1
        sub = await self._subscribe(start_seq)
        failures = 0
        try:
            while not self.ctx.stop.is_set():
                try:
                    msgs = await sub.fetch(256, timeout=0.5)
                except (NatsTimeout, TimeoutError):
                    failures = 0
                    continue
                except Exception as error:
                    failures += 1
                    log.warning("fetch_failed", error=repr(error)[:300], in_a_row=failures)
                    await asyncio.sleep(0.5)
                    if failures >= FOLLOW_FAILURES:
                        with contextlib.suppress(Exception):
                            await sub.unsubscribe()
                        try:
                            sub = await self._subscribe(self.followed + 1)
                            failures = 0
                            log.info("follower_made_again", from_seq=self.followed + 1)
                        except Exception as again:
                            log.warning("follower_not_made", error=repr(again)[:300])
                    continue
                failures = 0
                for msg in msgs:
                    await self._take(msg)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _take(self, msg: Any) -> None:
        seq = msg.metadata.sequence.stream
        self.followed = max(self.followed, seq)
        try:
            self.take(seq, msg.subject, msg.data)
        except Exception as error:  # malformed, or a fold that cannot take it
            await self.bus.dead_letter(msg, DURABLE, f"malformed: {error}")
            await msg.term()
            return
        await msg.ack()

    # --- liveness ---------------------------------------------------------------------------

    async def read_liveness(self) -> None:
        if self.kv is None:
            self.kv = await liveness.liveness_bucket(self.bus.js, self.settings)
        beats = await liveness.all_beats(self.kv, also=self.state.devices)
        now = time.time()
        online = {d: liveness.is_online(b, self.settings, now) for d, b in beats.items()}
        came = self.state.set_liveness(online)
        for device_id, beat in beats.items():
            device = self.state.devices.get(device_id)
            if device is None or beat.running is None or beat.running_for_s is None:
                continue
            # the device's own count of how long it has run
            self.state.running_since(device_id, beat.running, beat.time - beat.running_for_s)
        if came:
            log.info("devices_online", devices=sorted(came))
            self.retry_waiting = True
            self.wake.set()

    async def watch_liveness(self) -> None:
        while not self.ctx.stop.is_set():
            try:
                await self.read_liveness()
            except Exception as error:  # the last known liveness stays
                log.warning("liveness_read_failed", error=repr(error)[:300])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ctx.stop.wait(), LIVENESS_POLL_S)

    # --- predictions ------------------------------------------------------------------------

    async def _model(self, device: DeviceView) -> Any:
        """The device's current model (loaded once per version), or None."""
        from hpc_ds1.model import Model

        version = device.model_version
        if version is None or version in self._model_errors:
            return None
        if version in self._models:
            return self._models[version]
        try:
            store = await models_bucket(self.bus.js, self.settings, create=False)
            if store is None:
                raise LookupError("there is no model bucket")
            found = await store.get(device.model_artifact or "")
            data = found.data or b""
            if len(data) > self.settings.max_model_bytes:
                raise ValueError(f"{len(data)} bytes, over {self.settings.max_model_bytes}")
            model = await asyncio.to_thread(
                Model.from_untrusted, data, self.settings.max_model_bytes
            )
        except Exception as error:
            self._model_errors[version] = repr(error)[:300]
            log.warning(
                "model_unusable", device_id=device.device_id, version=version, error=repr(error)
            )
            return None
        if len(self._models) >= MODELS_KEPT:
            self._models.pop(next(iter(self._models)))
        self._models[version] = model
        return model

    async def ensure_predictions(self, task: TaskView) -> None:
        """System 1 predictions for every device that may take `task` and has not measured its
        size, from the device's own model with its own fingerprint (in a thread, cached per
        model version and (workload, size) in DeviceView.predicted)."""
        key = (task.workload, task.size)
        need = [
            d
            for d in self.state.devices.values()
            if d.registered
            and not d.left
            and d.online
            and not d.draining
            and d.model_version is not None
            and key not in d.best
            and key not in d.predicted
            and (d.model_version, *key) not in self._predict_failed
        ]
        work = []
        for device in need:
            model = await self._model(device)
            if model is not None:
                work.append((device, device.model_version, model))
        if not work:
            return
        found = await asyncio.to_thread(_predict_all, work, task.workload, task.size)
        for (device, version, _), estimate in zip(work, found, strict=True):
            if device.model_version != version:
                continue  # a newer model came meanwhile
            if isinstance(estimate, Estimate):
                self.state.set_prediction(device.device_id, task.workload, task.size, estimate)
            else:
                self._predict_failed.add((str(version), *key))
                log.warning(
                    "prediction_failed", device_id=device.device_id, version=version, error=estimate
                )

    # --- placing ----------------------------------------------------------------------------

    async def _append(self, event: Event, event_id: str, task: TaskView) -> int | None:
        """Append a task's event after the task's last folded one, and fold it; None when the
        task moved on meanwhile (it is tried again shortly)."""
        env = envelope(
            event,
            actor="placement",
            source="placement",
            prefix=self.settings.subject_prefix,
            correlation_id=task.task_id,
        ).model_copy(update={"id": event_id})
        try:
            seq = await self.bus.publish(env, expected_version=task.version)
        except ConcurrencyConflict:
            log.info("task_moved_on", task_id=task.task_id)
            try:
                await self.catch_up(task.task_id)
            except Exception as error:  # the follower brings them anyway
                log.warning("catch_up_failed", task_id=task.task_id, error=repr(error)[:300])
            loop = asyncio.get_running_loop()
            loop.call_later(RETRY_CONFLICT_S, self._retry, task.task_id)
            return None
        self.fold(seq, env, event)
        return seq

    def _retry(self, task_id: str) -> None:
        self.pending.add(task_id)
        self.wake.set()

    def unplaceable(self, task: TaskView) -> str | None:
        """Why no device can ever run the task's workload: unknown here and never measured."""
        from hpc_ds1.workloads import list_workloads

        known = list_workloads()
        if task.workload in known:
            return None
        if any(w == task.workload for d in self.state.devices.values() for w, _ in d.best):
            return None
        return (
            f"unknown workload {task.workload!r}: no device has measured it and the coordinator "
            f"does not know it; the workloads are: {', '.join(sorted(known))}"
        )

    async def place_one(self, task_id: str) -> Placement | Waiting | None:
        task = self.state.tasks.get(task_id)
        if task is None or not task.needs_placement:
            return None
        why = self.unplaceable(task)
        if why is not None:
            await self._append(
                TaskFailed(task_id=task_id, reasons=[why]), f"unplaceable-{task_id}", task
            )
            return None
        await self.ensure_predictions(task)
        task = self.state.tasks.get(task_id)
        if task is None or not task.needs_placement:
            return None
        result = self.index.place(task.spec, time.time(), task.failed_on)
        if isinstance(result, Waiting):
            if task.status == "waiting" and task.waiting_for == result.reason:
                return result  # said already
            event_id = f"waiting-{task_id}-{task.version}"
            if await self._append(result.event(), event_id, task) is not None:
                log.info("task_waiting", task_id=task_id, reason=result.reason)
            return result
        attempt = task.attempt + 1
        if await self._append(result.event(attempt), f"placed-{task_id}-{attempt}", task) is None:
            return None
        self.placed += 1
        log.info(
            "task_placed", task_id=task_id, attempt=attempt, device_id=result.device_id,
            basis=result.basis, reason=result.reason,
        )  # fmt: skip
        await self.send(self.work_item(task))
        return result

    def work_item(self, task: TaskView) -> WorkItem:
        assert task.device_id is not None
        return WorkItem(
            task_id=task.task_id,
            attempt=task.attempt,
            device_id=task.device_id,
            workload=task.workload,
            size=task.size,
            config=task.config,
            expected_s=task.expected_s or None,
        )

    async def send(self, item: WorkItem) -> None:
        """Put the attempt on its device's queue; kept to send again when that fails."""
        try:
            await enqueue(self.bus.js, self.settings, item)
        except Exception as error:
            log.warning("enqueue_failed", task_id=item.task_id, error=repr(error)[:300])
            self.unqueued[item.task_id] = item
            return
        self.unqueued.pop(item.task_id, None)

    async def resend_unqueued(self) -> None:
        for task_id, item in list(self.unqueued.items()):
            task = self.state.tasks.get(task_id)
            if task is None or task.status != "placed" or task.attempt != item.attempt:
                self.unqueued.pop(task_id, None)  # it moved on
                continue
            await self.send(item)

    async def requeue_placed(self) -> int:
        """At start: every task placed and not started goes on its queue again (an item that
        is still there is de-duplicated by its attempt's message id)."""
        placed = self.state.placed_not_started()
        for task in placed:
            await self.send(self.work_item(task))
        return len(placed)

    async def placer(self) -> None:
        """Places pending tasks one at a time, in the order they were submitted."""
        while not self.ctx.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), LIVENESS_POLL_S)
            self.wake.clear()
            if self.retry_waiting:
                self.retry_waiting = False
                self.pending.update(t.task_id for t in self.state.waiting())
            if self.unqueued:
                await self.resend_unqueued()
            while self.pending and not self.ctx.stop.is_set():
                order = {
                    t: self.state.tasks[t].order for t in self.pending if t in self.state.tasks
                }
                self.pending.intersection_update(order)
                if not self.pending:
                    break
                task_id = min(self.pending, key=order.__getitem__)
                self.pending.discard(task_id)
                try:
                    await self.place_one(task_id)
                except Exception as error:  # never lose the service over one task
                    log.error("placement_failed", task_id=task_id, error=repr(error)[:500])

    # --- estimate requests ------------------------------------------------------------------

    async def handle_estimate(self, msg: Any) -> None:
        """Every device's expected finish of {workload, size} now, without placing anything."""
        try:
            body = orjson.loads(msg.data)
            workload, size = str(body["workload"]), int(body["size"])
            if size <= 0:
                raise ValueError(f"size must be a positive integer, not {size}")
            spec = TaskView("estimate", workload, size)
            await self.ensure_predictions(spec)
            result = self.index.place(TaskSpec("estimate", workload, size), time.time())
            if isinstance(result, Waiting):
                reply: dict[str, Any] = {"ok": True, "waiting_for": result.reason}
            else:
                event = result.event(1)
                reply = {"ok": True, **event.model_dump(mode="json", exclude={"task_id"})}
        except (KeyError, ValueError, TypeError, orjson.JSONDecodeError) as error:
            reply = {"ok": False, "status": 422, "error": f"give workload and size: {error}"}
        except Exception as error:
            log.error("estimate_failed", error=repr(error)[:300])
            reply = {"ok": False, "status": 500, "error": f"{type(error).__name__}: {error}"}
        with contextlib.suppress(Exception):
            await msg.respond(orjson.dumps(reply))


def _predict_all(work: list[tuple[DeviceView, Any, Any]], workload: str, size: int) -> list[Any]:
    """Each device's System 1 recommendation from its own model: an Estimate, or why not."""
    return [
        predict(model, str(version), workload, size, device.fingerprint)
        for device, version, model in work
    ]


def predict(
    model: Any, version: str, workload: str, size: int, fingerprint: dict[str, Any]
) -> Estimate | str:
    """The model's System 1 configuration and predicted runtime for the job on the device of
    `fingerprint`. The guard's reasons (size range, distance from the training data, other
    hardware) reject it; a low confidence alone does not (thresholds 0 leave only the guard)."""
    from hpc_ds1.machine.hardware import Fingerprint
    from hpc_ds1.model import Thresholds

    try:
        fp: Any = Fingerprint.model_validate(fingerprint)
    except Exception:
        fp = None  # the model's own machine
    try:
        rec = model.recommend(
            workload, size, thresholds=Thresholds(auto=0.0, escalate=0.0), fingerprint=fp
        )
    except Exception as error:
        return repr(error)[:300]
    if not math.isfinite(rec.predicted_runtime_s) or rec.predicted_runtime_s < 0:
        return f"the model predicted {rec.predicted_runtime_s} s"
    return Estimate(
        runtime_s=float(rec.predicted_runtime_s),
        config=rec.config.model_dump(),
        basis="predicted",
        accepted=not rec.reasons,
        reasons=tuple(rec.reasons),
        source=version,
    )


async def prepare(service: PlacementService) -> int:
    """Streams, the log folded, liveness read once, placed tasks queued again; the last
    sequence folded."""
    await ensure_work_stream(service.bus.js, service.settings)
    last = await service.replay()
    try:
        await service.read_liveness()
    except Exception as error:
        log.warning("liveness_read_failed", error=repr(error)[:300])
    again = await service.requeue_placed()
    if again:
        log.info("placed_tasks_queued_again", count=again)
    service.pending.update(t.task_id for t in service.state.to_place())
    service.wake.set()
    return last
