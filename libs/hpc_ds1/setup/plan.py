"""Which runs a setup makes: pure functions of the profile, the workloads and the space."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import Workload


@dataclass(frozen=True)
class Profile:
    name: str
    size_indices: tuple[int, ...] | None  # which of a workload's measured sizes; None: all
    repeats: int

    def sizes(self, workload: Workload) -> tuple[int, ...]:
        if self.size_indices is None:
            return workload.sizes
        return tuple(
            sorted({workload.sizes[i] for i in self.size_indices if i < len(workload.sizes)})
        )


PROFILES = {
    # Every configuration of the space at every measured size: each state's best move is known.
    # Two timed repeats in interleaved rounds (a warm-up before each), as `evaluate` measures
    # what sessions observe.
    "full": Profile("full", None, repeats=2),
    # Three sizes spread over the range (the guard allows only what was measured).
    "quick": Profile("quick", (0, 2, 4), repeats=2),
}


@dataclass(frozen=True)
class PlannedJob:
    workload: str
    size: int
    config: Config
    repeats: int


def plan_jobs(
    workloads: Sequence[Workload],
    space_for: dict[str, ConfigSpace],
    profile: Profile,
    sizes: Sequence[int] | None = None,
    repeats: int | None = None,
) -> list[list[PlannedJob]]:
    """Chunks of jobs, one chunk per (workload, size): every configuration of the space.
    `sizes` overrides the profile's sizes for every workload (tiny sizes in tests). Each job
    takes `repeats` timed runs (`setup --repeats`); None: the workload's own (a workload
    file's `repeats`: 1 for a run of minutes), else the profile's."""
    chunks = []
    for workload in workloads:
        space = space_for[workload.name]
        times = repeats or workload.repeats or profile.repeats
        for size in sizes or profile.sizes(workload):
            chunks.append([PlannedJob(workload.name, size, c, times) for c in space.configs()])
    return chunks
