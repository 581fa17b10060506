"""Fleet simulation: expected-finish placement against round-robin, least-loaded and random.

    .venv/bin/python benchmarks/bench_fleet_sim.py [--tasks 1000] [--devices 8] [--loads 0.5,0.9]
        [--landscape FILE]   # measured once and saved there; read back when it exists

Runtimes come from a landscape measured for real with hpc_ds1.runner at the start (the repo
stores no measurements): 4 workloads x 3 sizes, each at every configuration of this machine's
space with ranks x threads <= 2 and the workload's default tile, 3 timed repeats after a
warm-up. It is measured twice: unpinned (every CPU of this machine) and pinned to one CPU
(sched_setaffinity on CPU 0 before the runner starts, which its mpiexec and ranks inherit, as
`taskset -c 0` would), one workload at a time so both kinds see about the same machine load
(on a shared machine its load shows in the figures: see the load average printed). Those are
the two device kinds of the fleet, half each: a device's best
runtime for a job is the median of its best configuration there, and each run of a task takes
one of that configuration's measured repeats (drawn once per task and kind, so every policy
sees the same runs). Simulated devices do not slow each other down (separate machines).

Each device runs one task at a time, in the order it got them. Tasks (jobs drawn uniformly)
arrive as a Poisson process at 50 % and 90 % of the fleet's capacity (sum over devices of
1 / its mean runtime over the jobs). Policies: expected-finish (hpc_ds1.fleet.placement.place
on a FleetState fed the same task events the service folds), round-robin, least-loaded (fewest
tasks queued or running; ties to the lowest index), random. Lower bounds: makespan >=
max(max over tasks of arrival + its fastest run, sum of fastest runs / devices); mean completion
(finish - arrival) >= mean of the fastest runs. Targets: expected-finish makespan <= 1.10 x its
bound; mean completion >= 20 % lower than least-loaded."""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_ds1.events import TaskFinished, TaskStarted, TaskSubmitted
from hpc_ds1.fleet.placement import Estimate, FleetState, Placement, place

JOBS: dict[str, tuple[int, ...]] = {
    "gemm": (256, 512, 768),
    "montecarlo": (500_000, 2_000_000, 8_000_000),
    "nbody": (1024, 2048, 4096),
    "stencil": (64, 96, 128),
}
KINDS = ("unpinned", "pinned")
POLICIES = ("expected-finish", "round-robin", "least-loaded", "random")
MAKESPAN_TARGET = 1.10
COMPLETION_TARGET = 0.20  # at least this much lower mean completion than least-loaded

Job = tuple[str, int]


@dataclass(frozen=True)
class Cost:
    """One job on one device kind: its best configuration's median and measured repeats."""

    runtime_s: float
    config: dict[str, Any]
    samples: tuple[float, ...]


Landscape = dict[str, dict[Job, Cost]]  # kind -> job -> cost


# --- the landscape, measured for real ---------------------------------------------------


def measure(jobs: dict[str, tuple[int, ...]], repeats: int = 3) -> tuple[Landscape, float]:
    """Every job at each small configuration, unpinned and pinned to one CPU; the best
    configuration per job and kind. Returns the landscape and the seconds it took."""
    from hpc_ds1.runner import Job as RunJob
    from hpc_ds1.runner import run_many
    from hpc_ds1.space import ConfigSpace
    from hpc_ds1.workloads import get_workload

    start = time.monotonic()
    every = os.sched_getaffinity(0)
    landscape: Landscape = {kind: {} for kind in KINDS}
    # One workload at a time, unpinned then pinned, so both kinds of a job are measured under
    # about the same load of this machine.
    for name, sizes in jobs.items():
        workload = get_workload(name)
        space = ConfigSpace.for_device(workload=workload)
        configs = [
            c
            for c in space.configs()
            if c.ranks * c.threads <= 2 and c.tile == workload.default_tile and not c.gpu
        ]
        runs = [
            RunJob(workload=name, size=s, config=c, repeats=repeats) for s in sizes for c in configs
        ]
        for kind in KINDS:
            os.sched_setaffinity(0, every if kind == "unpinned" else {min(every)})
            try:
                results = run_many(runs, timeout_s=300)
            finally:
                os.sched_setaffinity(0, every)
            best = landscape[kind]
            for r in results:
                if not r.ok or r.runtime_s is None or r.check_ok is False:
                    continue
                key = (r.workload, r.size)
                if key not in best or r.runtime_s < best[key].runtime_s:
                    samples = tuple(r.runtimes_s) or (r.runtime_s,)
                    best[key] = Cost(r.runtime_s, r.config.model_dump(), samples)
    common = set.intersection(*(set(costs) for costs in landscape.values()))
    landscape = {
        k: {j: c for j, c in costs.items() if j in common} for k, costs in landscape.items()
    }
    return landscape, time.monotonic() - start


def save(landscape: Landscape, path: Path, seconds: float) -> None:
    body = {
        "measured_s": seconds,
        "kinds": {
            kind: [
                {"workload": w, "size": s, "runtime_s": c.runtime_s, "config": c.config,
                 "samples": list(c.samples)}
                for (w, s), c in sorted(costs.items())
            ]
            for kind, costs in landscape.items()
        },
    }  # fmt: skip
    path.write_text(json.dumps(body, indent=1))


def load(path: Path) -> tuple[Landscape, float]:
    body = json.loads(path.read_text())
    landscape = {
        kind: {
            (row["workload"], row["size"]): Cost(
                row["runtime_s"], row["config"], tuple(row["samples"])
            )
            for row in rows
        }
        for kind, rows in body["kinds"].items()
    }
    return landscape, float(body.get("measured_s", 0.0))


# --- the simulation -----------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    task_id: str
    job: Job
    arrival: float
    runs: dict[str, float]  # device kind -> how long this task's run takes there


@dataclass
class Device:
    index: int
    device_id: str
    kind: str
    queue: list[Task] = field(default_factory=list)  # waiting, in order
    running: Task | None = None

    @property
    def load(self) -> int:
        return len(self.queue) + (self.running is not None)


@dataclass(frozen=True)
class Outcome:
    policy: str
    makespan_s: float
    mean_completion_s: float
    placed_on: dict[str, int]  # device kind -> tasks


def make_tasks(
    landscape: Landscape, n: int, load: float, kinds: Sequence[str], seed: int
) -> tuple[list[Task], float]:
    """n tasks, Poisson arrivals at `load` x the fleet's capacity; and the arrival rate."""
    rng = random.Random(seed)
    jobs = sorted(landscape[kinds[0]])
    capacity = sum(1.0 / statistics.mean(landscape[k][j].runtime_s for j in jobs) for k in kinds)
    rate = load * capacity
    tasks, now = [], 0.0
    for i in range(n):
        now += rng.expovariate(rate)
        job = rng.choice(jobs)
        runs = {k: rng.choice(landscape[k][job].samples) for k in set(kinds)}
        tasks.append(Task(f"t{i}", job, now, runs))
    return tasks, rate


Chooser = Callable[[Task, list[Device], float], int]


class ExpectedFinish:
    """hpc_ds1.fleet.placement over the same state the service folds from task events."""

    def __init__(self, landscape: Landscape, devices: list[Device]) -> None:
        self.state = FleetState()
        self.seq = 0
        self.index = {d.device_id: d.index for d in devices}
        for d in devices:
            view = self.state.device(d.device_id)
            view.registered = view.online = True
            view.best = {
                job: Estimate(c.runtime_s, c.config, "measured")
                for job, c in landscape[d.kind].items()
            }

    def _apply(self, event: Any, now: float) -> None:
        self.seq += 1
        self.state.apply(self.seq, event, now)

    def choose(self, task: Task, devices: list[Device], now: float) -> int:
        w, s = task.job
        self._apply(TaskSubmitted(task_id=task.task_id, workload=w, size=s, submitted_by="s"), now)
        result = place(self.state.tasks[task.task_id].spec, self.state.devices.values(), now)
        assert isinstance(result, Placement), result
        self._apply(result.event(1), now)
        return self.index[result.device_id]

    def started(self, task: Task, device: Device, now: float) -> None:
        self._apply(TaskStarted(task_id=task.task_id, attempt=1, device_id=device.device_id), now)

    def finished(self, task: Task, device: Device, now: float) -> None:
        event = TaskFinished(
            task_id=task.task_id, attempt=1, device_id=device.device_id, config={},
            runtime_s=task.runs[device.kind],
        )  # fmt: skip
        self._apply(event, now)


def simulate(
    policy: str, tasks: list[Task], kinds: Sequence[str], landscape: Landscape, seed: int
) -> Outcome:
    devices = [Device(i, f"dev-{i:03d}-{kind}", kind) for i, kind in enumerate(kinds)]
    rng = random.Random(seed + 1)
    smart = ExpectedFinish(landscape, devices) if policy == "expected-finish" else None
    turn = 0

    def choose(task: Task, now: float) -> int:
        nonlocal turn
        if smart is not None:
            return smart.choose(task, devices, now)
        if policy == "round-robin":
            turn += 1
            return (turn - 1) % len(devices)
        if policy == "least-loaded":
            return min(devices, key=lambda d: (d.load, d.index)).index
        if policy == "random":
            return rng.randrange(len(devices))
        raise ValueError(f"unknown policy {policy!r}; the policies are {POLICIES}")

    events: list[tuple[float, int, int, int]] = []  # (time, order, kind 0 finish/1 arrival, i)
    order = 0
    for i, task in enumerate(tasks):
        heapq.heappush(events, (task.arrival, order, 1, i))
        order += 1
    finish: dict[str, float] = {}
    placed_on = dict.fromkeys(kinds, 0)

    def start_next(device: Device, now: float) -> None:
        nonlocal order
        if device.running is not None or not device.queue:
            return
        task = device.queue.pop(0)
        device.running = task
        if smart is not None:
            smart.started(task, device, now)
        heapq.heappush(events, (now + task.runs[device.kind], order, 0, device.index))
        order += 1

    while events:
        now, _, what, i = heapq.heappop(events)
        if what == 1:
            task = tasks[i]
            device = devices[choose(task, now)]
            placed_on[device.kind] += 1
            device.queue.append(task)
            start_next(device, now)
        else:
            device = devices[i]
            done = device.running
            assert done is not None
            finish[done.task_id] = now
            if smart is not None:
                smart.finished(done, device, now)
            device.running = None
            start_next(device, now)
    assert len(finish) == len(tasks)
    return Outcome(
        policy=policy,
        makespan_s=max(finish.values()),
        mean_completion_s=statistics.mean(finish[t.task_id] - t.arrival for t in tasks),
        placed_on=placed_on,
    )


def lower_bounds(tasks: list[Task], n_devices: int) -> tuple[float, float]:
    """(makespan bound, mean completion bound) from each task's fastest run."""
    fastest = [min(t.runs.values()) for t in tasks]
    makespan = max(
        max(t.arrival + f for t, f in zip(tasks, fastest, strict=True)), sum(fastest) / n_devices
    )
    return makespan, statistics.mean(fastest)


@dataclass(frozen=True)
class LoadResult:
    load: float
    rate: float
    outcomes: dict[str, Outcome]
    makespan_bound: float
    completion_bound: float

    @property
    def makespan_ratio(self) -> float:
        return self.outcomes["expected-finish"].makespan_s / self.makespan_bound

    @property
    def completion_gain(self) -> float:
        """How much lower expected-finish's mean completion is than least-loaded's (0.2: 20 %)."""
        ours = self.outcomes["expected-finish"].mean_completion_s
        return 1.0 - ours / self.outcomes["least-loaded"].mean_completion_s


def run_load(
    landscape: Landscape, kinds: Sequence[str], n_tasks: int, load: float, seed: int
) -> LoadResult:
    tasks, rate = make_tasks(landscape, n_tasks, load, kinds, seed)
    outcomes = {p: simulate(p, tasks, kinds, landscape, seed) for p in POLICIES}
    makespan, completion = lower_bounds(tasks, len(kinds))
    return LoadResult(load, rate, outcomes, makespan, completion)


def fleet_kinds(n_devices: int) -> list[str]:
    return [KINDS[i % len(KINDS)] for i in range(n_devices)]


def describe_landscape(landscape: Landscape) -> str:
    lines = [f"{'job':>22} " + " ".join(f"{k + ' best s':>16}" for k in KINDS) + "  ratio"]
    for job in sorted(landscape[KINDS[0]]):
        costs = [landscape[k][job] for k in KINDS]
        ratio = costs[1].runtime_s / costs[0].runtime_s
        cells = " ".join(
            f"{c.runtime_s:>9.4f} r{c.config['ranks']}t{c.config['threads']:<3}" for c in costs
        )
        lines.append(f"{job[0] + ' ' + str(job[1]):>22} {cells}  {ratio:5.2f}")
    return "\n".join(lines)


def report(results: list[LoadResult], n_tasks: int, kinds: Sequence[str]) -> str:
    counts = {k: kinds.count(k) for k in KINDS}
    lines = [
        f"fleet: {counts['unpinned']} unpinned + {counts['pinned']} pinned devices, {n_tasks} tasks"
    ]
    for r in results:
        lines.append(
            f"\nload {r.load:.0%} (Poisson, {r.rate:.2f} tasks/s): "
            f"lower bounds makespan {r.makespan_bound:.2f} s, mean completion "
            f"{r.completion_bound:.4f} s"
        )
        lines.append(
            f"{'policy':>16} {'makespan s':>11} {'x bound':>8} {'mean compl. s':>14} "
            f"{'x bound':>8} {'vs least-loaded':>16}  tasks unpinned/pinned"
        )
        ll = r.outcomes["least-loaded"].mean_completion_s
        for p in POLICIES:
            o = r.outcomes[p]
            lines.append(
                f"{p:>16} {o.makespan_s:>11.2f} {o.makespan_s / r.makespan_bound:>8.3f} "
                f"{o.mean_completion_s:>14.4f} {o.mean_completion_s / r.completion_bound:>8.2f} "
                f"{(o.mean_completion_s / ll - 1):>+16.1%}  "
                f"{o.placed_on.get('unpinned', 0)}/{o.placed_on.get('pinned', 0)}"
            )
        best_gain = 1.0 - r.completion_bound / ll
        m_ok = r.makespan_ratio <= MAKESPAN_TARGET
        c_ok = r.completion_gain >= COMPLETION_TARGET
        lines.append(
            f"targets: makespan {r.makespan_ratio:.3f} x bound (<= {MAKESPAN_TARGET:.2f}): "
            f"{'met' if m_ok else 'NOT met'}; mean completion {r.completion_gain:.1%} lower "
            f"than least-loaded (>= {COMPLETION_TARGET:.0%}): {'met' if c_ok else 'NOT met'} "
            f"(the lower bound itself is {best_gain:.1%} lower)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--loads", default="0.5,0.9")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--landscape", type=Path, default=None)
    args = parser.parse_args()
    if args.landscape is not None and args.landscape.exists():
        landscape, took = load(args.landscape)
        print(f"landscape: read from {args.landscape} (measured in {took:.0f} s)")
    else:
        print("landscape: measuring for real on this machine (unpinned, then pinned to 1 CPU)...")
        landscape, took = measure(JOBS)
        avg = os.getloadavg()
        print(
            f"landscape: measured in {took:.0f} s on {os.cpu_count()} CPUs "
            f"(load average after: {avg[0]:.1f} / {avg[1]:.1f} / {avg[2]:.1f})"
        )
        if args.landscape is not None:
            save(landscape, args.landscape, took)
    print(describe_landscape(landscape))
    kinds = fleet_kinds(args.devices)
    loads = [float(x) for x in args.loads.split(",")]
    results = [run_load(landscape, kinds, args.tasks, load, args.seed) for load in loads]
    print(report(results, args.tasks, kinds))


if __name__ == "__main__":
    main()
