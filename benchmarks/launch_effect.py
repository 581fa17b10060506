"""How much of a configuration's run-to-run spread comes from the launch (issue 13): gemm at one
size, ranks=1 threads=2 and ranks=2 threads=1 (tile 128), 12 launches each, alternating, 5 timed
repeats per launch. Prints each launch's median and the coefficient of variation between launch
medians against the mean one within a launch. Setup and evaluate time one run per configuration
per launch (a round), so a launch effect is what their repeats must average out.

    .venv/bin/python benchmarks/launch_effect.py [SIZE] [--launches N]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from hpc_ds1.runner import Job, run_many
from hpc_ds1.space import Config


@dataclass(frozen=True)
class LaunchEffect:
    config: str
    launch_medians_s: list[float]
    between_cv: float  # coefficient of variation of the launch medians
    within_cv: float  # mean over launches of the repeats' CV inside the launch


def measure(size: int, launches: int) -> list[LaunchEffect]:
    """Per configuration: each launch's median (s), the CV between them, the mean CV within."""
    a, b = Config(ranks=1, threads=2, tile=128), Config(ranks=2, threads=1, tile=128)
    medians: dict[Config, list[float]] = {a: [], b: []}
    within: dict[Config, list[float]] = {a: [], b: []}
    for i in range(launches):
        order = (a, b) if i % 2 else (b, a)
        jobs = [Job(workload="gemm", size=size, config=c, repeats=5) for c in order]
        for result in run_many(jobs, timeout_s=120):
            times = list(result.runtimes_s)
            median = statistics.median(times)
            medians[result.config].append(median)
            within[result.config].append(statistics.pstdev(times) / median)
    return [
        LaunchEffect(
            config=c.label(),
            launch_medians_s=got,
            between_cv=statistics.stdev(got) / statistics.fmean(got) if len(got) > 1 else 0.0,
            within_cv=statistics.fmean(within[c]),
        )
        for c, got in medians.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("size", nargs="?", type=int, default=1280)
    parser.add_argument("--launches", type=int, default=12)
    args = parser.parse_args()
    print(f"gemm {args.size}, {args.launches} launches per configuration, 5 timed repeats each")
    for row in measure(args.size, args.launches):
        ms = [round(t * 1000, 1) for t in row.launch_medians_s]
        print(f"{row.config}: launch medians ms {ms}")
        print(f"  between-launch CV {row.between_cv:.3f}, within-launch CV {row.within_cv:.3f}")


if __name__ == "__main__":
    main()
