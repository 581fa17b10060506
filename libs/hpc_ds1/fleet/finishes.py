"""Placement over a maintained index of expected finishes: the same choices as
`hpc_ds1.fleet.placement.place` (the reference, one pass over every device), without passing
over every device for each task.

For each job (workload, size) asked about, the eligible devices with an estimate of it
(registered, not left, online, not draining) are kept in sorted lists, by what their expected
finish will be:

- the verified ones by their runtime counted (the verified best is the first of them that the
  task did not fail on, and the floor of the unverified claims follows from it);
- the unverified ones by their claim (to move them across that floor when it changes);
- every one in a *stream*, by (guard rejects, clamped to the floor, running tasks m), whose key
  gives a lower bound of the device's expected finish at any time: with nothing running
  (m = 0), the finish itself, queue + runtime counted (queue alone for a claim counted as the
  floor: the floor is added when asked); with m tasks running, queue + runtime + their m ends
  (unix time), so that the finish is at least key - m * now, less a margin for rounding.

A task's placement merges the streams, smallest bound first, scoring each device exactly as the
reference does (`placement._score`), and stops once the next bound is past the 16th candidate
kept (ties by device id, as the reference breaks them). The guard-rejected streams are read
only as far as the candidates or the earliest rejected finish need them. A device's entries are
made again when it changes (`FleetState.touch`: its queue, status, estimates, runs), and when a
running task's expected end passes (a heap of those ends), lazily: each job catches up on the
devices changed since it was last asked about. Fewer than two candidates (a task that waits,
devices with no estimate, a fleet of one) falls back to the reference, which says why.

Exactly the reference's choices, reasons and candidates: tests/services/placement/
test_finishes.py replays randomized fleets and task streams through both."""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict
from dataclasses import dataclass, field

from .placement import (
    DRIFT_S,
    FLEET_SPREAD,
    MAX_CANDIDATES,
    DeviceView,
    FleetState,
    Placement,
    Scored,
    TaskSpec,
    Waiting,
    _score,
    compose,
    place,
)

JOBS_KEPT = 32  # jobs indexed at once (about 300 bytes a device each); the least recent goes
ROUNDING = 1e-12  # relative margin of a bound with running tasks, far above float rounding
MOVED_REBUILD = 64  # devices crossing a changed floor past which the streams are made again

Stream = tuple[bool, bool, int]  # (guard rejects, counted as the floor, running tasks)


@dataclass(slots=True)
class _Entry:
    """Where one device stands in one job's index."""

    stream: Stream
    key: float  # in its stream
    base: float  # its queued work (+ the ends of its running tasks)
    mag: float  # magnitude of what base adds up, for the rounding margin
    counted: float  # its own runtime counted: the claim when unverified
    sure: bool  # verified
    accepted: bool


def _key(base: float, counted: float | None, m: int, mag: float) -> float:
    """A stream key: base + counted (None: counted as the floor, added when asked); with
    running tasks, lowered by the rounding margin of everything it adds up."""
    value = base if counted is None else base + counted
    if m == 0 or not math.isfinite(value):
        return value
    return value - ROUNDING * (mag + (0.0 if counted is None else abs(counted)))


@dataclass
class _Job:
    """One job's index: its streams, verified and unverified lists."""

    key: tuple[str, int]
    spread: float
    entries: dict[str, _Entry] = field(default_factory=dict)
    streams: dict[Stream, list[tuple[float, str]]] = field(default_factory=dict)
    verified: list[tuple[float, str]] = field(default_factory=list)  # (counted, id), accepted
    unverified: list[tuple[float, str]] = field(default_factory=list)  # (claim, id)
    floor: float | None = None  # unverified claims below it are in the floor streams
    dirty: set[str] = field(default_factory=set)

    # --- entries -------------------------------------------------------------------------

    def entry(self, device: DeviceView, now: float) -> _Entry | None:
        if not (device.registered and not device.left and device.online and not device.draining):
            return None
        est = device.best.get(self.key) or device.predicted.get(self.key)
        if est is None:
            return None
        counted = est.runtime_s  # what placement._own counts, inlined: this runs per change
        sure = device.local
        if not sure:
            ran = device.ran.get(self.key)
            if ran is not None:
                sure, least = True, ran / (1.0 + self.spread)
                if counted < least:
                    counted = least
        base = device.queued_s
        if not device.running:
            stream = (
                not est.accepted,
                not sure and self.floor is not None and counted < self.floor,
                0,
            )
            key = base if stream[1] else base + counted
            return _Entry(stream, key, base, 0.0, counted, sure, est.accepted)
        mag, m = abs(base), 0
        for load in device.running.values():
            # counted from DRIFT_S before its start as last indexed: a heartbeat moves it less
            start = load.indexed_at - DRIFT_S
            if load.expected_s - (now - start) > 0:
                base += start + load.expected_s
                mag += abs(start) + abs(load.expected_s)
                m += 1
        clamped = not sure and self.floor is not None and counted < self.floor
        stream = (not est.accepted, clamped, m)
        key = _key(base, None if clamped else counted, m, mag)
        return _Entry(stream, key, base, mag, counted, sure, est.accepted)

    def add(self, did: str, e: _Entry) -> None:
        self.entries[did] = e
        insort(self.streams.setdefault(e.stream, []), (e.key, did))
        if e.sure:
            if e.accepted:
                insort(self.verified, (e.counted, did))
        else:
            insort(self.unverified, (e.counted, did))

    def remove(self, did: str) -> None:
        e = self.entries.pop(did, None)
        if e is None:
            return
        _discard(self.streams[e.stream], (e.key, did))
        if e.sure:
            if e.accepted:
                _discard(self.verified, (e.counted, did))
        else:
            _discard(self.unverified, (e.counted, did))

    def build(self, devices: dict[str, DeviceView], now: float, floor: float | None) -> None:
        self.floor = floor
        self.entries.clear()
        for did, device in devices.items():
            e = self.entry(device, now)
            if e is not None:
                self.entries[did] = e
        self._sort()
        self.dirty.clear()

    def _sort(self) -> None:
        streams: dict[Stream, list[tuple[float, str]]] = {}
        verified, unverified = [], []
        for did, e in self.entries.items():
            streams.setdefault(e.stream, []).append((e.key, did))
            if e.sure:
                if e.accepted:
                    verified.append((e.counted, did))
            else:
                unverified.append((e.counted, did))
        for items in streams.values():
            items.sort()
        verified.sort()
        unverified.sort()
        self.streams, self.verified, self.unverified = streams, verified, unverified

    def refresh(self, devices: dict[str, DeviceView], now: float) -> None:
        for did in self.dirty:
            self.remove(did)
            device = devices.get(did)
            e = None if device is None else self.entry(device, now)
            if e is not None:
                self.add(did, e)
        self.dirty.clear()

    def repartition(self, floor: float | None) -> None:
        """Unverified claims below `floor` counted as the floor: move those that cross."""
        old, self.floor = self.floor, floor
        if old == floor:
            return
        lo = min(-math.inf if old is None else old, -math.inf if floor is None else floor)
        hi = max(-math.inf if old is None else old, -math.inf if floor is None else floor)
        start = bisect_left(self.unverified, lo, key=_first)
        stop = bisect_left(self.unverified, hi, key=_first)
        moved = [did for _, did in self.unverified[start:stop]]
        if len(moved) > MOVED_REBUILD:
            for did in moved:
                self._restream(self.entries[did], floor)
            self._sort()
            return
        for did in moved:
            e = self.entries[did]
            _discard(self.streams[e.stream], (e.key, did))
            self._restream(e, floor)
            insort(self.streams.setdefault(e.stream, []), (e.key, did))

    @staticmethod
    def _restream(e: _Entry, floor: float | None) -> None:
        clamped = floor is not None and e.counted < floor
        rejected, _, m = e.stream
        e.stream = (rejected, clamped, m)
        e.key = _key(e.base, None if clamped else e.counted, m, e.mag)

    # --- asking --------------------------------------------------------------------------

    def verified_best(self, excluded: frozenset[str] | set[str]) -> tuple[float, str] | None:
        for counted, did in self.verified:
            if did not in excluded:
                return counted, did
        return None

    def scan(
        self,
        rejected: bool,
        k: int,
        limit: tuple[float, str] | None,
        ctx: _Ask,
    ) -> list[Scored]:
        """The k earliest (finish, id) entries among the devices whose guard rejects the job
        (`rejected`) or accepts it, each before `limit` when given, scored as the reference."""
        floor = ctx.floor
        heads: list[tuple[float, str, int, int]] = []  # (bound, id, stream, position)
        streams: list[tuple[list[tuple[float, str]], bool, int]] = []
        for (rej, clamped, m), items in self.streams.items():
            if rej != rejected or not items:
                continue
            streams.append((items, clamped, m))
            si = len(streams) - 1
            heads.append((ctx.bound(items[0][0], clamped, m), items[0][1], si, 0))
        heapq.heapify(heads)
        found: list[Scored] = []
        devices = ctx.devices
        while heads:
            bound, did, si, pos = heapq.heappop(heads)
            edge = found[k - 1][1:3] if len(found) >= k else limit
            items, clamped, m = streams[si]
            if edge is not None:
                if bound > edge[0]:
                    break  # every device left in every stream finishes later
                if bound == edge[0] and m == 0 and did > edge[1]:
                    # the rest of this key sorts after the edge: on to the next key
                    pos = bisect_right(items, items[pos][0], key=_first)
                    if pos < len(items):
                        key, nxt = items[pos]
                        heapq.heappush(heads, (ctx.bound(key, clamped, m), nxt, si, pos))
                    continue
            if pos + 1 < len(items):
                key, nxt = items[pos + 1]
                heapq.heappush(heads, (ctx.bound(key, clamped, m), nxt, si, pos + 1))
            if did in ctx.excluded:
                continue
            device = devices[did]
            est = device.best.get(self.key) or device.predicted.get(self.key)
            assert est is not None
            scored = _score(
                device, self.key, est, device.queue_s(ctx.now), self.spread, floor, ctx.verified
            )
            if edge is None or scored[1:3] < edge:
                insort(found, scored, key=_finish_id)
                del found[k:]
        return found


@dataclass(frozen=True, slots=True)
class _Ask:
    """One task's question: when, and what it needs of the index."""

    now: float
    floor: float
    verified: tuple[float, str] | None
    excluded: frozenset[str] | set[str]
    devices: dict[str, DeviceView]

    def bound(self, key: float, clamped: bool, m: int) -> float:
        """The least expected finish of a device at `key` in a stream (clamped, m)."""
        value = key + self.floor if clamped else key
        if m == 0 or not math.isfinite(value):
            return value  # m == 0: the finish itself (a queue that grows is folded anew)
        margin = ROUNDING * (1.0 + 2 * m * abs(self.now) + (abs(self.floor) if clamped else 0))
        return value - m * self.now - margin


def _first(item: tuple[float, str]) -> float:
    return item[0]


def _finish_id(entry: Scored) -> tuple[float, str]:
    return entry[1], entry[2]


def _discard(items: list[tuple[float, str]], item: tuple[float, str]) -> None:
    at = bisect_left(items, item)
    if at < len(items) and items[at] == item:
        del items[at]
    else:  # a NaN key would break the order: look for it
        items.remove(item)


class FinishIndex:
    """The placement rule over a FleetState it watches (one index per state): `place` gives
    what `hpc_ds1.fleet.placement.place(task, state.devices.values(), ...)` gives."""

    def __init__(self, state: FleetState, spread: float = FLEET_SPREAD) -> None:
        self.state = state
        self.spread = spread
        self.changed: set[str] = set()
        state.watchers.append(self.changed)
        self.jobs: OrderedDict[tuple[str, int], _Job] = OrderedDict()
        self.ends: list[tuple[float, str]] = []  # (expected end of a running task, device)
        self._seeded = False

    def _catch_up(self, now: float) -> None:
        """Every job learns which devices changed, and which running tasks are past their
        expected end (their device's bound moves from key - now to key)."""
        devices = self.state.devices
        if not self._seeded:
            self._seeded = True
            self.changed.update(did for did, d in devices.items() if d.running)
        if self.changed:
            for did in self.changed:
                device = devices.get(did)
                if device is None:
                    continue
                for load in device.running.values():
                    end = load.indexed_at + load.expected_s
                    if now < end < math.inf:
                        heapq.heappush(self.ends, (end, did))
            for job in self.jobs.values():
                job.dirty |= self.changed
            self.changed.clear()
        while self.ends and self.ends[0][0] <= now:
            _, did = heapq.heappop(self.ends)
            for job in self.jobs.values():
                job.dirty.add(did)

    def _job(self, key: tuple[str, int], now: float, excluded: frozenset[str] | set[str]) -> _Job:
        job = self.jobs.get(key)
        if job is not None:
            self.jobs.move_to_end(key)
            job.refresh(self.state.devices, now)
            return job
        job = _Job(key, self.spread)
        job.build(self.state.devices, now, None)
        verified = job.verified_best(excluded)
        if verified is not None:  # the streams at the floor that this task will ask for
            job.repartition(verified[0] / (1.0 + self.spread))
        self.jobs[key] = job
        if len(self.jobs) > JOBS_KEPT:
            self.jobs.popitem(last=False)
        return job

    def place(
        self, task: TaskSpec, now: float, excluded: frozenset[str] | set[str] = frozenset()
    ) -> Placement | Waiting:
        """The device expected to finish `task` first, with why; or what the task waits for.
        `excluded`: devices the task already failed on."""
        self._catch_up(now)
        key = (task.workload, task.size)
        job = self._job(key, now, excluded)
        verified = job.verified_best(excluded)
        floor = verified[0] / (1.0 + self.spread) if verified is not None else 0.0
        job.repartition(floor if verified is not None else None)
        ask = _Ask(now, floor, verified, excluded, self.state.devices)
        top = job.scan(False, MAX_CANDIDATES, None, ask)
        faster: Scored | None = None
        if len(top) < MAX_CANDIDATES:
            rejected = job.scan(True, MAX_CANDIDATES - len(top), None, ask)
            faster = rejected[0] if rejected and top else None
            top += rejected
        else:
            earlier = job.scan(True, 1, (top[0][1], ""), ask)
            faster = earlier[0] if earlier else None
        if len(top) < 2:  # it waits, or no estimate anywhere, or one device: the reference
            devices = self.state.devices.values()
            return place(task, devices, now, excluded, self.spread)
        return compose(task, top, faster, None)
