"""The fleet's faults, repeated: `kill -9` of the agent running a task mid-run, and its network
link taken down mid-run, each N times on the real fleet of tests/fleet_e2e (a coordinator, three
devices in their own network namespaces with a real setup, one pinned to one CPU).
Run as root: `make bench-fleet-faults` (or `python benchmarks/bench_fleet_faults.py [--repeat N]
[--only kill|link]`).

Per fault it holds a task mid-run on the device placement chose (its ranks stopped the moment
they start), injects the fault, and measures the time until the task is finished on another
device. It prints, per kind: faults injected, tasks finished elsewhere, requeued with a reason
naming the offline device, recorded once (one task.finished, its result unchanged after the
device is back), jobs left running, and the fault-to-finish time p50/max. The killed agent is
restarted (same identity) and the cut link restored before the next repetition. Exits 1 if any
fault was not survived."""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from tests.fleet_e2e.conftest import (
    LARGE,
    WORKLOAD,
    Fleet,
    netns_unavailable,
    running_fleet,
    wait_for,
)

KINDS = ("kill", "link")


@dataclass
class Tally:
    kind: str
    faults: int = 0
    elsewhere: int = 0
    reason_named: int = 0
    recorded_once: int = 0
    jobs_left: int = 0
    seconds: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        complete = self.faults > 0 and self.elsewhere == self.reason_named == self.faults
        return complete and self.recorded_once == self.faults and self.jobs_left == 0

    def row(self) -> str:
        p50 = statistics.median(self.seconds) if self.seconds else float("nan")
        top = max(self.seconds) if self.seconds else float("nan")
        return (
            f"{self.kind:<6} {self.faults:>6} {self.elsewhere:>9} {self.reason_named:>8} "
            f"{self.recorded_once:>13} {self.jobs_left:>9} {p50:>8.1f} {top:>8.1f}"
        )


HEADER = (
    f"{'fault':<6} {'faults':>6} {'elsewhere':>9} {'reason':>8} {'recorded once':>13} "
    f"{'jobs left':>9} {'p50 s':>8} {'max s':>8}"
)


def one_fault(fleet: Fleet, kind: str, tally: Tally) -> None:
    fleet.wait_online(fleet.remote_ids())
    task = fleet.api.submit(WORKLOAD, LARGE)
    task_id = task["task_id"]
    victim, held = fleet.hold_running(task_id)
    tally.faults += 1
    if kind == "kill":
        assert victim.agent is not None
        victim.agent.kill9()
    else:
        victim.netns.cut()
        for proc in held:
            with contextlib.suppress(psutil.Error):
                proc.resume()  # the job runs to its end; its result cannot get out
    injected = time.monotonic()
    try:
        done = fleet.api.wait_task(
            task_id, lambda t: t["status"] in ("finished", "failed"), 120, "finished elsewhere"
        )
        tally.seconds.append(time.monotonic() - injected)
    finally:
        if kind == "link":
            victim.netns.restore()
    result = done.get("result") or {}
    if done["status"] == "finished" and result.get("device_id") not in (None, victim.device_id):
        tally.elsewhere += 1
    else:
        tally.problems.append(f"{kind}: task {task_id} ended {done['status']} on {result}")
    if fleet.requeued_because_offline(task_id, victim.device_id):
        tally.reason_named += 1
    else:
        tally.problems.append(f"{kind}: no requeue reason naming {victim.device_id} offline")
    if kind == "kill":
        tally.jobs_left += sum(
            1 for p in held if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        )
        fleet.start_agent(victim)
    fleet.wait_online({victim.device_id})
    wait_for(
        lambda: fleet.api.devices()[victim.device_id]["working_on"] is None,
        60,
        f"{victim.name} idle again",
    )
    time.sleep(1.0)  # a late result of the victim, if any, has been answered
    finished = fleet.events_of("task.finished", task_id)
    if len(finished) == 1 and fleet.api.task(task_id)["result"] == done["result"]:
        tally.recorded_once += 1
    else:
        tally.problems.append(f"{kind}: task {task_id} finished {len(finished)} times")


def main(args: argparse.Namespace) -> int:
    why = netns_unavailable()
    if why:
        print(f"bench_fleet_faults needs network namespaces: {why}", file=sys.stderr)
        return 2
    kinds = args.only or list(KINDS)
    print(f"fleet faults: {', '.join(kinds)}; {args.repeat} each", flush=True)
    tallies = [Tally(kind) for kind in kinds]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fleet-faults-") as tmp:
        with running_fleet(Path(tmp)) as fleet:
            ready = time.monotonic() - started
            print(f"fleet ready in {ready:.0f} s", flush=True)
            print(HEADER, flush=True)
            for tally in tallies:
                for _ in range(args.repeat):
                    try:
                        one_fault(fleet, tally.kind, tally)
                    except (AssertionError, RuntimeError, TimeoutError) as error:
                        tally.problems.append(f"{tally.kind}: {error}"[:500])
                print(tally.row(), flush=True)
    for tally in tallies:
        for problem in tally.problems:
            print(f"  {problem}")
    print(f"total {time.monotonic() - started:.0f} s")
    return 0 if all(t.ok for t in tallies) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="faults of each kind (10)")
    parser.add_argument(
        "--only", action="append", choices=KINDS, help="only this kind of fault (repeatable)"
    )
    arguments = parser.parse_args(argv)
    if arguments.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {arguments.repeat}")
    return arguments


if __name__ == "__main__":
    sys.exit(main(parse_args()))
