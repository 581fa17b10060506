"""Which held-out runs an evaluation makes: every configuration at each held-out size.

A workload's held-out sizes (`Workload.held_out`, seven between its training sizes) are all
development sizes now:

- the development profiles, indices 0, 2, 4 (`--quick`: 0, 2): what every development step may
  look at, as often as it likes;
- the reused set, indices 1, 3, 5 and 6 (REUSED_INDICES): until issue 43 the "final" set that
  only `evaluate --final` measured. It was measured and replayed about 17 times, with work aimed
  at what it missed after each, so it is held out no more: `--sizes` may name its sizes like any
  other (docs/evaluation.md says which figures came from it). Indices 5 and 6 joined it on 5 Dec
  2026.

The headline figures come from a frozen test set instead (evaluation/frozen.py): drawn and
written down by `evaluate --freeze` before anything of it is measured, measured once by
`evaluate --final` (`frozen_profile`, the set's sizes passed as `sizes`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpc_ds1.setup.plan import PlannedJob
from hpc_ds1.space import ConfigSpace
from hpc_ds1.workloads import Workload

REUSED_INDICES = (1, 3, 5, 6)
FINAL_INDICES = REUSED_INDICES  # its name before issue 43 (benchmarks/ still exclude it)
TRUTH_REPEATS = 5


@dataclass(frozen=True)
class EvalProfile:
    name: str
    held_out_indices: tuple[int, ...] | None  # which of a workload's held-out sizes; None: all
    repeats: int  # the observed pass: as setup measures, interleaved rounds
    truth_repeats: int = TRUTH_REPEATS  # the truth pass (evaluation/truth.py)

    def sizes(self, workload: Workload) -> tuple[int, ...]:
        sizes = workload.held_out
        indices = (
            tuple(i for i in range(len(sizes)) if i not in REUSED_INDICES)
            if self.held_out_indices is None
            else self.held_out_indices
        )
        return tuple(sorted({sizes[i] for i in indices if i < len(sizes)}))


def reused_sizes(workload: Workload) -> tuple[int, ...]:
    """The reused set of `workload`: the "final" held-out sizes before issue 43."""
    return tuple(workload.held_out[i] for i in REUSED_INDICES if i < len(workload.held_out))


final_sizes = reused_sizes  # its name before issue 43


def frozen_profile(repeats: int, truth_repeats: int) -> EvalProfile:
    """`evaluate --final`: a frozen set's repeats; its sizes come from the set (`sizes`)."""
    return EvalProfile("final", (), repeats=repeats, truth_repeats=truth_repeats)


EVAL_PROFILES = {
    # The development set (every held-out size but the reused set's). Two timed repeats in
    # interleaved rounds, as setup measures: what a session observes.
    "full": EvalProfile("full", None, repeats=2),
    # Two held-out sizes inside the quick setup's measured range (its sizes 0, 2 and 4).
    "quick": EvalProfile("quick", (0, 2), repeats=2),
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
