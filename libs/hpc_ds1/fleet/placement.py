"""Placement, the pure part: what placement knows of each device (folded from the log, plus
liveness), and the rule that sends a task where it is expected to finish first.

For a task and each eligible device (registered, not left, online, not draining, not a device
the task already failed on): expected finish = queue (remaining time of its running task +
expected runtimes of what was placed on it and has not started) + its best runtime for the
task's (workload, size): measured when it has measured that size (ok runs, check not failed)
at that run's configuration, else its own model's System 1 prediction ("predicted"). The
earliest wins; a device whose familiarity guard rejects the job is chosen only when no device
accepts it. No eligible device: the task waits, and `Waiting.reason` says for what.

Both numbers are the device's own claims. An estimate is *verified* once the device has run the
job (workload, size) for the fleet (a task.finished of it from that device; the coordinator's
own device is trusted): a verified device's claim counts no faster than its last such run less
the fleet's spread (FLEET_SPREAD), and an unverified one no faster than the verified best of the
devices that could take the task, less that spread. The reason says when a claim was counted
higher; the task's expected_s is what was counted (its queue adds up), claimed_s the claim.

No I/O here and no model call: predictions are computed by the service (in a thread) into
`DeviceView.predicted` beforehand, so `place` is a loop of dict lookups. The service and any
replay fold the same events with `FleetState.apply`, so they agree."""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..events import (
    DeviceDraining,
    DeviceLeft,
    DeviceRegistered,
    DeviceStatusChanged,
    Event,
    MeasurementRecorded,
    ModelPublished,
    PlacementCandidate,
    TaskFailed,
    TaskFinished,
    TaskPlaced,
    TaskRequeued,
    TaskRunFailed,
    TaskStarted,
    TaskSubmitted,
    TaskWaiting,
)
from .plausible import FLEET_FACTOR

Basis = Literal["measured", "predicted", "none"]
# rejected, finish, device id, queue, estimate, runtime counted, verified, why counted higher
Scored = tuple[bool, float, str, float, "Estimate", float, bool, str]
MAX_CANDIDATES = 16  # of a TaskPlaced event: the best ones (a fleet of 10,000 would not fit)
# The run-to-run spread allowed between devices: an unverified estimate may beat the verified
# best by this much, and a verified device's claim its own last run of the job.
FLEET_SPREAD = 0.1
PREDICTION_CACHE = 4096  # (workload, size) predictions kept per device and model
NAMED = 4  # devices named in a waiting reason, per cause
DRIFT_S = 0.05  # a heartbeat's count of a running task's start may move this much unindexed


# --- what placement knows of a device ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Estimate:
    """A device's best runtime for one (workload, size), and the configuration it runs at."""

    runtime_s: float
    config: Mapping[str, Any]
    basis: Literal["measured", "predicted"]
    accepted: bool = True  # False: the device's familiarity guard rejects the job
    reasons: tuple[str, ...] = ()  # the guard's reasons, when it rejects
    source: str = ""  # the measurement id or the model version it comes from


@dataclass(slots=True)
class Running:
    """A task its device has started: expected runtime and when it started (unix time)."""

    expected_s: float
    started_at: float
    # started_at as placement's index of finishes last took it (FleetState.running_since): it
    # counts the task from DRIFT_S before this, and is told when the device's own count moves
    # half that earlier, or a second later
    indexed_at: float = math.nan

    def __post_init__(self) -> None:
        if math.isnan(self.indexed_at):
            self.indexed_at = self.started_at


@dataclass(slots=True)
class DeviceView:
    device_id: str
    hostname: str = ""
    fingerprint: dict[str, Any] = field(default_factory=dict)
    local: bool = False
    registered: bool = False
    online: bool = False
    draining: bool = False
    left: bool = False
    best: dict[tuple[str, int], Estimate] = field(default_factory=dict)  # measured
    model_version: str | None = None
    model_artifact: str | None = None
    predicted: dict[tuple[str, int], Estimate] = field(default_factory=dict)  # of model_version
    running: dict[str, Running] = field(default_factory=dict)
    queued: dict[str, float] = field(default_factory=dict)  # placed, not started: expected_s
    queued_s: float = 0.0  # sum(queued.values()), kept in step
    # (workload, size) -> the runtime of its last task.finished of that job: seen run for the
    # fleet, its estimate of the job is verified
    ran: dict[tuple[str, int], float] = field(default_factory=dict)

    def queue_s(self, now: float) -> float:
        """Expected wait behind this device's work: what its running task has left (never
        below 0) and the expected runtimes of what is placed on it and not started."""
        total = self.queued_s
        for load in self.running.values():
            left = load.expected_s - (now - load.started_at)
            if left > 0:
                total += left
        return total

    def estimate(self, workload: str, size: int) -> Estimate | None:
        key = (workload, size)
        return self.best.get(key) or self.predicted.get(key)

    def add_queued(self, task_id: str, expected_s: float) -> None:
        self.queued[task_id] = expected_s
        self.queued_s = sum(self.queued.values())

    def drop(self, task_id: str) -> None:
        """The task is no longer waiting or running here."""
        self.running.pop(task_id, None)
        if self.queued.pop(task_id, None) is not None:
            self.queued_s = sum(self.queued.values())

    def set_prediction(self, workload: str, size: int, estimate: Estimate) -> None:
        if len(self.predicted) >= PREDICTION_CACHE:
            self.predicted.clear()
        self.predicted[(workload, size)] = estimate


@dataclass(frozen=True, slots=True)
class TaskSpec:
    task_id: str
    workload: str
    size: int


@dataclass(slots=True)
class TaskView:
    """One task as placement follows it."""

    task_id: str
    workload: str
    size: int
    submitted_by: str = ""
    # submitted|waiting|placed|running|run_failed|requeued|finished|failed
    status: str = "submitted"
    attempt: int = 0  # the last placed attempt
    device_id: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    expected_s: float | None = None
    failed_on: set[str] = field(default_factory=set)
    waiting_for: str | None = None
    version: int = 0  # stream sequence of its last event folded
    order: int = 0  # sequence of its submission: tasks are placed in this order

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(self.task_id, self.workload, self.size)

    @property
    def needs_placement(self) -> bool:
        return self.status in ("submitted", "requeued", "waiting")


# --- the rule ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    task_id: str
    device_id: str
    config: dict[str, Any]
    expected_s: float
    queue_s: float
    finish_s: float
    basis: Basis
    reason: str
    runner_up: str | None
    guard_rejected: bool
    candidates: list[PlacementCandidate]
    verified: bool | None = None  # None: no estimate (basis none)
    claimed_s: float | None = None  # the device's own estimate, when expected_s counts it higher

    def event(self, attempt: int) -> TaskPlaced:
        return TaskPlaced(
            task_id=self.task_id,
            attempt=attempt,
            device_id=self.device_id,
            config=self.config,
            expected_s=self.expected_s,
            queue_s=self.queue_s,
            basis=self.basis,
            reason=self.reason,
            runner_up=self.runner_up,
            guard_rejected=self.guard_rejected,
            candidates=self.candidates,
            verified=self.verified,
            claimed_s=self.claimed_s,
        )


@dataclass(frozen=True)
class Waiting:
    task_id: str
    reason: str
    kind: Literal["no_device", "all_left", "offline", "draining", "failed", "mixed"]

    def event(self) -> TaskWaiting:
        return TaskWaiting(task_id=self.task_id, reason=self.reason)


def seconds(value: float) -> str:
    """A duration for a reason: one decimal from 1 s up, two significant digits below."""
    if value >= 1.0 or value == 0.0:
        return f"{value:.1f} s"
    return f"{value:.2g} s"


def config_label(config: Mapping[str, Any]) -> str:
    parts = [f"{key}={config[key]}" for key in ("ranks", "threads", "tile") if key in config]
    if config.get("gpu"):
        parts.append("gpu")
    parts += [
        f"{k}={v}"
        for k, v in config.items()
        if k not in ("ranks", "threads", "tile", "gpu") and not (k == "block" and not v)
    ]
    return " ".join(parts) or "its default configuration"


def _names(ids: list[str]) -> str:
    shown = ", ".join(sorted(ids)[:NAMED])
    return shown + (f" and {len(ids) - NAMED} more" if len(ids) > NAMED else "")


def _waiting(
    task: TaskSpec,
    total: int,
    left: list[str],
    failed: list[str],
    offline: list[str],
    draining: list[str],
) -> Waiting:
    tid = task.task_id
    if total == 0:
        return Waiting(
            tid, "no device has joined the fleet yet; it waits for one to join", "no_device"
        )
    if len(left) == total:
        return Waiting(
            tid,
            f"every device has left the fleet ({_names(left)}); it waits for one to join",
            "all_left",
        )
    causes = [
        (k, v) for k, v in (("failed", failed), ("offline", offline), ("draining", draining)) if v
    ]
    if len(causes) == 1:
        kind, ids = causes[0]
        if kind == "offline":
            return Waiting(
                tid,
                f"no device is online ({_names(ids)} offline); it waits for one to come online",
                "offline",
            )
        if kind == "draining":
            return Waiting(
                tid,
                f"every online device is draining ({_names(ids)}); it waits for one to be "
                "undrained or for another device to join",
                "draining",
            )
        return Waiting(
            tid,
            f"it already failed on {_names(ids)}, the only devices that could take it; it "
            "waits for another device to come online or join",
            "failed",
        )
    words = {"failed": "already failed it", "offline": "offline", "draining": "draining"}
    parts = [f"{len(ids)} {words[kind]} ({_names(ids)})" for kind, ids in causes]
    return Waiting(
        tid,
        "no device can take it now: " + "; ".join(parts) + "; it waits for a device that can",
        "mixed",
    )


def default_config(device: DeviceView, workload: str) -> dict[str, Any]:
    """The device's default configuration for `workload` (one rank, every core), for a device
    with neither a measurement nor a model of the job."""
    from ..machine.hardware import Fingerprint
    from ..space import ConfigSpace

    try:
        space = ConfigSpace.for_device(Fingerprint.model_validate(device.fingerprint), workload)
        return space.default().model_dump()
    except Exception:  # a partial fingerprint or a workload unknown here
        return {"ranks": 1, "threads": 1, "tile": 1, "gpu": False}


class _Desc(str):
    """A device id that sorts backwards: the bounded heap keeps its largest (rank, id) first."""

    __slots__ = ()

    def __lt__(self, other: str) -> bool:
        return str.__gt__(self, other)

    def __gt__(self, other: str) -> bool:
        return str.__lt__(self, other)


def _own(
    device: DeviceView, est: Estimate, key: tuple[str, int], spread: float
) -> tuple[float, bool, str]:
    """(runtime counted, verified, why counted higher than claimed) of the device's own
    estimate: the coordinator's own device is trusted; another counts no faster than its last
    run of the job less the spread, and is unverified until it has run it."""
    claim = est.runtime_s
    if device.local:
        return claim, True, ""
    ran = device.ran.get(key)
    if ran is None:
        return claim, False, ""
    floor = ran / (1.0 + spread)
    if claim >= floor:
        return claim, True, ""
    return floor, True, f"its own last run of the job took {seconds(ran)}, less {_spread(spread)}"


def _spread(spread: float) -> str:
    return f"the fleet's spread of {spread * 100:.3g} %"


def _eligible(device: DeviceView, excluded: frozenset[str] | set[str]) -> bool:
    return (
        device.registered
        and not device.left
        and device.device_id not in excluded
        and device.online
        and not device.draining
    )


def _verified_best(
    devices: Iterable[DeviceView],
    key: tuple[str, int],
    excluded: frozenset[str] | set[str],
    spread: float,
) -> tuple[float, str] | None:
    """The fastest verified runtime counted among the devices that could take the task (their
    guard accepting it), with its device."""
    best: tuple[float, str] | None = None
    for device in devices:
        if not (device.local or device.ran) or not _eligible(device, excluded):
            continue
        est = device.best.get(key) or device.predicted.get(key)
        if est is None or not est.accepted:
            continue
        counted, sure, _ = _own(device, est, key, spread)
        if sure and (best is None or (counted, device.device_id) < best):
            best = (counted, device.device_id)
    return best


def _score(
    device: DeviceView,
    key: tuple[str, int],
    est: Estimate,
    queue: float,
    spread: float,
    floor: float,
    verified: tuple[float, str] | None,
) -> Scored:
    """One eligible device's entry for a task: (rejected, finish, id, queue, estimate, runtime
    counted, verified, why counted higher), its claim counted no faster than `floor` (the
    verified best less the spread) while unverified."""
    counted, sure, why = _own(device, est, key, spread)
    if not sure and counted < floor:
        assert verified is not None
        counted = floor
        why = f"{verified[1]}'s verified best {seconds(verified[0])} less {_spread(spread)}"
    return (not est.accepted, queue + counted, device.device_id, queue, est, counted, sure, why)


def place(
    task: TaskSpec,
    devices: Iterable[DeviceView],
    now: float,
    excluded: frozenset[str] | set[str] = frozenset(),
    spread: float = FLEET_SPREAD,
) -> Placement | Waiting:
    """The device expected to finish `task` first, with why; or what the task waits for.
    `excluded`: devices the task already failed on; `spread`: how far an unverified estimate
    may beat the verified best.

    One pass over every device (and one more for the verified best): the reference rule. The
    placement service asks `hpc_ds1.fleet.finishes.FinishIndex`, which keeps the devices in
    order of expected finish and makes exactly these choices without passing over them all."""
    key = (task.workload, task.size)
    if not isinstance(devices, Collection):
        devices = list(devices)
    verified = _verified_best(devices, key, excluded, spread)
    floor = verified[0] / (1.0 + spread) if verified is not None else 0.0
    total = 0
    left: list[str] = []
    failed: list[str] = []
    offline: list[str] = []
    draining: list[str] = []
    # A max-heap of the best MAX_CANDIDATES by (rejected, finish, device id): its first entry
    # is the worst kept, and a device that does not beat it costs no allocation.
    heap: list[tuple[int, float, _Desc, Scored]] = []
    edge_rejected, edge_finish = True, math.inf  # the worst kept, once the heap is full
    best: Scored | None = None
    faster: Scored | None = None  # the earliest of the guard-rejected
    unknown: list[tuple[float, str, DeviceView]] = []  # eligible, but no estimate at all
    for device in devices:
        if not device.registered:
            continue
        total += 1
        did = device.device_id
        if device.left:
            left.append(did)
        elif did in excluded:
            failed.append(did)
        elif not device.online:
            offline.append(did)
        elif device.draining:
            draining.append(did)
        else:
            queue = device.queue_s(now)
            est = device.best.get(key) or device.predicted.get(key)
            if est is None:
                unknown.append((queue, did, device))
                continue
            entry = _score(device, key, est, queue, spread, floor, verified)
            rejected, finish = entry[0], entry[1]
            if rejected and (faster is None or (finish, did) < faster[1:3]):
                faster = entry
            full = len(heap) >= MAX_CANDIDATES
            if full and (
                rejected > edge_rejected or (rejected == edge_rejected and finish > edge_finish)
            ):
                continue  # neither a candidate nor the best
            if best is None or entry[:3] < best[:3]:
                best = entry
            item = (-rejected, -finish, _Desc(did), entry)
            if not full:
                heapq.heappush(heap, item)
            elif entry[:3] < heap[0][3][:3]:
                heapq.heapreplace(heap, item)
            else:
                continue
            edge_rejected, edge_finish = heap[0][3][0], heap[0][3][1]
    if best is None and not unknown:
        return _waiting(task, total, left, failed, offline, draining)
    if best is None:
        return _place_unknown(task, unknown)
    top = sorted((item[3] for item in heap), key=lambda e: e[:3])
    return compose(task, top, faster, unknown[0][1] if unknown else None)


def compose(
    task: TaskSpec, top: list[Scored], faster: Scored | None, unknown: str | None
) -> Placement:
    """The placement of `task` on the first of `top` (the best MAX_CANDIDATES entries by
    (rejected, finish, id), at least one), with its reason and candidates; `faster`: the
    earliest guard-rejected entry, `unknown`: the first eligible device with no estimate."""
    best = top[0]
    rejected, finish, did, queue, est, counted, sure, why = best
    second = top[1] if len(top) > 1 else None
    head = (
        f"{did}: queue {seconds(queue)} + "
        + ("best measured" if est.basis == "measured" else "predicted")
        + f" {seconds(est.runtime_s)} ({config_label(est.config)}"
        + ("" if est.basis == "measured" else f", its model {est.source}")
        + ")"
        + (f"{'' if sure else ' unverified'}, counted as {seconds(counted)} ({why})" if why else "")
        + f" = {seconds(finish)}"
    )
    notes: list[str] = []
    if rejected:
        guard = "; ".join(est.reasons) or "outside what its model knows"
        notes.append(
            f"every device's familiarity guard rejects {task.workload} size {task.size}, so the "
            f"earliest of them ({did}: {guard})"
        )
    else:
        if faster is not None and faster[1] < finish:
            guard = "; ".join(faster[4].reasons) or "outside what its model knows"
            notes.append(
                f"{faster[2]} would finish at {seconds(faster[1])} but its familiarity guard "
                f"rejects the job ({guard})"
            )
    if second is not None:
        tail = f"next {second[2]} {seconds(second[1])}"
        if second[0] and not rejected:
            tail += " (its guard rejects the job)"
        elif second[7]:
            claimed = f"{second[4].basis} {seconds(second[4].runtime_s)}"
            tail += f" ({'' if second[6] else 'unverified, '}{claimed}, counted higher)"
        elif second[4].basis != est.basis:
            tail += f" ({second[4].basis})"
    elif unknown is not None:
        tail = f"next {unknown} (no measurement or model of the job)"
    else:
        tail = "no other device can take it"
    reason = "; ".join([head, *notes, tail])
    candidates = [
        PlacementCandidate(
            device_id=s[2],
            finish_s=s[1],
            queue_s=s[3],
            runtime_s=s[4].runtime_s,
            basis=s[4].basis,
            config=dict(s[4].config),
            accepted=not s[0],
            note="; ".join(s[4].reasons),
            verified=s[6],
            counted_s=s[5] if s[7] else None,
        )
        for s in top
    ]
    return Placement(
        task_id=task.task_id,
        device_id=did,
        config=dict(est.config),
        expected_s=counted,
        queue_s=queue,
        finish_s=finish,
        basis=est.basis,
        reason=reason,
        runner_up=None if second is None else second[2],
        guard_rejected=rejected,
        candidates=candidates,
        verified=sure,
        claimed_s=est.runtime_s if why else None,
    )


def _place_unknown(task: TaskSpec, unknown: list[tuple[float, str, DeviceView]]) -> Placement:
    """No online device has measured or modelled the job: the shortest queue, at its default
    configuration, marked basis "none"."""
    top = heapq.nsmallest(MAX_CANDIDATES, unknown, key=lambda u: (u[0], u[1]))
    queue, did, device = top[0]
    config = default_config(device, task.workload)
    runner = top[1][1] if len(top) > 1 else None
    reason = (
        f"{did}: queue {seconds(queue)}, the shortest; no online device has measured "
        f"{task.workload} size {task.size} or has a model of it, so it runs at its default "
        f"configuration ({config_label(config)})"
        + (f"; next {runner} (queue {seconds(top[1][0])})" if runner else "")
    )
    candidates = [
        PlacementCandidate(
            device_id=u[1],
            finish_s=None,
            queue_s=u[0],
            basis="none",
            accepted=True,
            note="no measurement or model of the job",
        )
        for u in top
    ]
    return Placement(
        task_id=task.task_id,
        device_id=did,
        config=config,
        expected_s=0.0,
        queue_s=queue,
        finish_s=queue,
        basis="none",
        reason=reason,
        runner_up=runner,
        guard_rejected=False,
        candidates=candidates,
    )


# --- the fold ----------------------------------------------------------------------------


def measured_ok(e: MeasurementRecorded) -> bool:
    return (
        e.status == "ok" and e.runtime_s is not None and e.runtime_s > 0 and e.check_ok is not False
    )


@dataclass
class Change:
    """What one folded event means for placement."""

    fleet: bool = False  # a device may now take a waiting task
    task: str | None = None  # this task needs placing (submitted or requeued)


@dataclass
class FleetState:
    devices: dict[str, DeviceView] = field(default_factory=dict)
    tasks: dict[str, TaskView] = field(default_factory=dict)  # not finished or failed yet
    ended: set[str] = field(default_factory=set)  # finished or failed: only their ids are kept
    # One set per watcher (hpc_ds1.fleet.finishes.FinishIndex): the devices changed since it
    # last looked. Change a DeviceView through this class (apply, set_liveness,
    # set_prediction, running_since) or call touch, or a watcher's order goes stale.
    watchers: list[set[str]] = field(default_factory=list)

    def touch(self, device_id: str) -> None:
        """The device changed: its queue, status, estimates or runs."""
        for changed in self.watchers:
            changed.add(device_id)

    def device(self, device_id: str) -> DeviceView:
        found = self.devices.get(device_id)
        if found is None:
            found = self.devices[device_id] = DeviceView(device_id)
        return found

    def waiting(self) -> list[TaskView]:
        return [t for t in self.tasks.values() if t.status == "waiting"]

    def to_place(self) -> list[TaskView]:
        """Tasks without a device now, in the order they were submitted."""
        return sorted((t for t in self.tasks.values() if t.needs_placement), key=lambda t: t.order)

    def placed_not_started(self) -> list[TaskView]:
        return [t for t in self.tasks.values() if t.status == "placed"]

    # The aggregates whose events `apply` folds: placement's consumer follows only these
    # (decisions, sessions, tokens... are most of a busy log and change nothing here).
    FOLDED_AGGREGATES = ("device", "measurement", "model", "task")

    def apply(self, seq: int, event: Event, at: float) -> Change:
        """Fold one event (stream sequence `seq`, envelope time `at` in unix seconds). A task
        event at or before the task's last folded sequence is skipped, so an event placement
        folded when it published it is not folded twice when it comes back."""
        if not self.watchers:
            return self._apply(seq, event, at)
        device_id = getattr(event, "device_id", None)
        task = self.tasks.get(getattr(event, "task_id", None) or "")
        before = task.device_id if task is not None else None
        change = self._apply(seq, event, at)
        for did in (device_id, before, task.device_id if task is not None else None):
            if did is not None:
                self.touch(did)
        return change

    def _apply(self, seq: int, event: Event, at: float) -> Change:
        if isinstance(event, MeasurementRecorded):
            return self._measurement(event)
        if isinstance(event, DeviceRegistered):
            d = self.device(event.device_id)
            d.hostname, d.fingerprint, d.local = (
                event.hostname,
                dict(event.fingerprint),
                event.local,
            )
            d.registered, d.left = True, False
            return Change(fleet=True)
        if isinstance(event, DeviceLeft):
            self.device(event.device_id).left = True
            return Change()
        if isinstance(event, DeviceDraining):
            self.device(event.device_id).draining = event.draining
            return Change(fleet=not event.draining)
        if isinstance(event, DeviceStatusChanged):
            d = self.device(event.device_id)
            was, d.online = d.online, event.status == "online"
            return Change(fleet=d.online and not was)
        if isinstance(event, ModelPublished):
            d = self.device(event.device_id)
            if d.model_version != event.model_version:
                d.model_version, d.model_artifact = event.model_version, event.artifact
                d.predicted.clear()
            return Change(fleet=True)
        if isinstance(event, TaskSubmitted):
            if event.task_id in self.tasks or event.task_id in self.ended:
                return Change()
            self.tasks[event.task_id] = TaskView(
                event.task_id,
                event.workload,
                event.size,
                event.submitted_by,
                version=seq,
                order=seq,
            )
            return Change(task=event.task_id)
        task_id = getattr(event, "task_id", None)
        if task_id is None:
            return Change()
        task = self.tasks.get(task_id)
        if task is None or seq <= task.version:
            return Change()
        task.version = seq
        change = self._task(task, event, at)
        if task.status in ("finished", "failed"):
            del self.tasks[task_id]  # nothing more to place or count: keep only its id
            self.ended.add(task_id)
        return change

    def saw(self, task_id: str, seq: int) -> None:
        """An event of the task this fold does not take (a newer type, unreadable data) still
        moves its version on."""
        task = self.tasks.get(task_id)
        if task is not None and seq > task.version:
            task.version = seq

    def _measurement(self, e: MeasurementRecorded) -> Change:
        if not measured_ok(e) or e.runtime_s is None:
            return Change()
        d = self.device(e.device_id)
        key = (e.workload, e.size)
        found = d.best.get(key)
        if found is not None and found.runtime_s <= e.runtime_s:
            return Change()
        d.best[key] = Estimate(e.runtime_s, dict(e.config), "measured", source=e.measurement_id)
        return Change(fleet=found is None)

    def _believable(self, device_id: str, key: tuple[str, int], e: TaskFinished) -> bool:
        """Whether a finished run may verify its device's estimate of the job: no other device's
        verified runtime of it (its last task run, or the coordinator's own measurement) is more
        than FLEET_FACTOR times slower."""
        for other in self.devices.values():
            if other.device_id == device_id:
                continue
            known = other.ran.get(key)
            if known is None and other.local and key in other.best:
                known = other.best[key].runtime_s
            if known is not None and e.runtime_s * FLEET_FACTOR < known:
                return False
        return True

    def _unassign(self, task: TaskView) -> None:
        if task.device_id is not None and task.device_id in self.devices:
            self.devices[task.device_id].drop(task.task_id)

    def _task(self, task: TaskView, e: Event, at: float) -> Change:
        if isinstance(e, TaskPlaced):
            self._unassign(task)
            task.status, task.attempt, task.device_id = "placed", e.attempt, e.device_id
            task.config, task.expected_s, task.waiting_for = dict(e.config), e.expected_s, None
            self.device(e.device_id).add_queued(task.task_id, e.expected_s)
        elif isinstance(e, TaskWaiting):
            if task.status in ("submitted", "requeued", "waiting"):
                task.status, task.waiting_for = "waiting", e.reason
        elif isinstance(e, TaskStarted):
            if e.attempt == task.attempt and task.status == "placed":
                d = self.device(e.device_id)
                d.drop(task.task_id)
                d.running[task.task_id] = Running(task.expected_s or 0.0, at)
                task.status = "running"
        elif isinstance(e, TaskFinished):
            if e.attempt == task.attempt:
                self._unassign(task)
                task.status = "finished"
                key = (task.workload, task.size)
                # Seen run for the fleet: verified, unless it claims to have beaten every other
                # device's verified runtime of the job by more than the plausibility check's
                # unscaled factor. A device's reports are its own, and one that claimed vast
                # hardware at its join would otherwise verify its own 1e-6 s (the probe's liar).
                if e.device_id == task.device_id and self._believable(e.device_id, key, e):
                    self.device(e.device_id).ran[key] = e.runtime_s
        elif isinstance(e, TaskRunFailed):
            task.failed_on.add(e.device_id)
            if e.attempt == task.attempt and task.status in ("placed", "running"):
                self._unassign(task)
                task.status = "run_failed"  # the coordinator requeues or fails it
        elif isinstance(e, TaskRequeued):
            if e.attempt == task.attempt and task.status not in ("finished", "failed"):
                self._unassign(task)
                task.status, task.device_id = "requeued", None
                return Change(task=task.task_id)
        elif isinstance(e, TaskFailed):
            self._unassign(task)
            task.status, task.device_id = "failed", None
        return Change()

    def set_liveness(self, online: Mapping[str, bool]) -> list[str]:
        """Liveness from heartbeats (device id -> heard within offline_after_s) for every known
        device (missing: offline); the devices that came online."""
        came: list[str] = []
        for did, d in self.devices.items():
            now_online = bool(online.get(did, False))
            if now_online and not d.online:
                came.append(did)
            if now_online != d.online:
                d.online = now_online
                self.touch(did)
        return came

    def set_prediction(self, device_id: str, workload: str, size: int, estimate: Estimate) -> None:
        """The device's own model's estimate of the job (DeviceView.set_prediction)."""
        self.device(device_id).set_prediction(workload, size, estimate)
        self.touch(device_id)

    def running_since(self, device_id: str, task_id: str, started_at: float) -> None:
        """When the device's running task started, by the device's own count (a heartbeat)."""
        load = self.device(device_id).running.get(task_id)
        if load is None:
            return
        load.started_at = started_at
        if not load.indexed_at - DRIFT_S / 2 <= started_at <= load.indexed_at + 1.0:
            load.indexed_at = started_at
            self.touch(device_id)
