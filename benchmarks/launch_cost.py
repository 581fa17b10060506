"""What one launch of the rank program costs beyond its kernels: for 1, 2 and 4 ranks, the
wall time of `mpiexec -n R python -m hpc_ds1.runner.rank` with one tiny gemm job (its kernel
runs in milliseconds) and its phases as its runner sees them (the "ready" line, the result
line, the exit), against the floor measured in the same run: `mpiexec -n R python` starting
mpi4py and exiting. Setup and evaluate make one launch per ranks value per round, so at small
sizes this, not the kernels, is what their time is made of.

    .venv/bin/python benchmarks/launch_cost.py [--launches N] [--ranks 1,2,4]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from hpc_ds1.runner import protocol
from hpc_ds1.runner.api import _launch_argv, _spec, job_env, mpiexec_path
from hpc_ds1.runner.result import Job
from hpc_ds1.space import Config
from hpc_ds1.workloads import get_workload

FLOOR = "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"


@dataclass(frozen=True)
class LaunchCost:
    ranks: int
    floor_s: float  # median wall time of mpiexec + python + mpi4py, nothing else
    ready_s: float  # median time to the "ready" line
    result_s: float  # median time to the job's result line
    total_s: float  # median time to the launcher's exit

    @property
    def ratio(self) -> float:
        return self.total_s / self.floor_s


def floor_launch(ranks: int) -> float:
    argv = [mpiexec_path(), "-n", str(ranks), sys.executable, "-c", FLOOR]
    started = time.perf_counter()
    subprocess.run(argv, env=job_env(1, ranks=ranks), check=True, capture_output=True)
    return time.perf_counter() - started


def rank_launch(ranks: int, size: int) -> tuple[float, float, float]:
    """Seconds to "ready", to the result and to the exit of one launch of one job."""
    wl = get_workload("gemm")
    job = Job(
        workload="gemm",
        size=size,
        config=Config(ranks=ranks, threads=1, tile=wl.default_tile),
        repeats=1,
    )
    argv = [*_launch_argv(ranks, [_spec(job, wl)]), "--launched-at", repr(time.time())]
    started = time.perf_counter()
    seen: dict[str, float] = {}
    with subprocess.Popen(
        argv, env=job_env(1, ranks=ranks), stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = protocol.parse(line)
            if event is not None:
                seen.setdefault(str(event.get("event")), time.perf_counter() - started)
    total = time.perf_counter() - started
    if proc.returncode != 0 or "result" not in seen:
        raise RuntimeError(f"the launch of {ranks} ranks failed (exit {proc.returncode})")
    return seen["ready"], seen["result"], total


def measure(ranks: list[int], launches: int, size: int = 64) -> list[LaunchCost]:
    """Each ranks value `launches` times, the floor and the rank program alternating."""
    out = []
    for r in ranks:
        floors, phases = [], []
        for i in range(launches):
            if i % 2:
                phases.append(rank_launch(r, size))
                floors.append(floor_launch(r))
            else:
                floors.append(floor_launch(r))
                phases.append(rank_launch(r, size))
        ready, result, total = (statistics.median(p[k] for p in phases) for k in range(3))
        out.append(LaunchCost(r, statistics.median(floors), ready, result, total))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=10)
    parser.add_argument("--ranks", default="1,2,4")
    args = parser.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    print(f"one gemm 64 job per launch, {args.launches} launches per ranks value (medians)")
    print("ranks  floor_s  ready_s  result_s  exit_s  launch/floor")
    for row in measure(ranks, args.launches):
        print(
            f"{row.ranks:5d}  {row.floor_s:7.3f}  {row.ready_s:7.3f}  {row.result_s:8.3f}  "
            f"{row.total_s:6.3f}  {row.ratio:12.2f}"
        )


if __name__ == "__main__":
    main()
