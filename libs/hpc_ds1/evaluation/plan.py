"""Which held-out runs an evaluation makes: every configuration at each held-out size."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpc_ds1.setup.plan import PlannedJob
from hpc_ds1.space import ConfigSpace
from hpc_ds1.workloads import Workload


@dataclass(frozen=True)
class EvalProfile:
    name: str
    held_out_indices: tuple[int, ...] | None  # which of a workload's held-out sizes; None: all
    repeats: int

    def sizes(self, workload: Workload) -> tuple[int, ...]:
        sizes = workload.held_out
        if self.held_out_indices is None:
            return sizes
        return tuple(sorted({sizes[i] for i in self.held_out_indices if i < len(sizes)}))


EVAL_PROFILES = {
    # Three timed repeats: enough for a median and a spread per configuration.
    "full": EvalProfile("full", None, repeats=3),
    # Two held-out sizes inside the quick setup's measured range (its sizes 0, 2 and 4).
    "quick": EvalProfile("quick", (0, 2), repeats=3),
}


def plan_held_out(
    workloads: Sequence[Workload],
    space_for: dict[str, ConfigSpace],
    profile: EvalProfile,
    sizes: Mapping[str, Sequence[int]] | None = None,
) -> list[list[PlannedJob]]:
    """One chunk per (workload, held-out size); `sizes` (by workload) overrides the profile's."""
    return [
        [PlannedJob(w.name, size, c, profile.repeats) for c in space_for[w.name].configs()]
        for w in workloads
        for size in ((sizes or {}).get(w.name) or profile.sizes(w))
    ]


def parse_sizes(text: str, workloads: Sequence[str]) -> dict[str, list[int]]:
    """ "240,300" (every workload) or "gemm=240,montecarlo=300000" (per workload; a bare number
    after a named one belongs to it too: "gemm=240,288")."""
    out: dict[str, list[int]] = {}
    current: list[str] = list(workloads)
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, value = part.rpartition("=")
        if name:
            if name not in workloads:
                raise ValueError(
                    f"--sizes names {name!r}; the workloads evaluated are {list(workloads)}"
                )
            current = [name]
        try:
            size = int(value)
        except ValueError:
            raise ValueError(
                f"--sizes {text!r}: {part!r} is not a size; give whole numbers, optionally "
                "as workload=size"
            ) from None
        if size <= 0:
            raise ValueError(f"--sizes {text!r}: every size must be a positive integer")
        for w in current:
            out.setdefault(w, []).append(size)
    if not out:
        raise ValueError(f"--sizes {text!r}: no size given")
    return out
