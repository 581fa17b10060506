"""What a workload is: its kernels (through `prepare`), its check, its work per size, its sizes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from hpc_ds1.knobs import Knob, KnobSpace, Value

ThroughputUnit = Literal["GFLOP/s", "GB/s"]


@dataclass(frozen=True)
class Work:
    """Work of one run at one size: the whole problem, not one rank's share."""

    flops: float
    bytes_moved: float
    memory_bytes: int
    items: float  # samples, interactions, grid-point updates, multiply-adds


@dataclass(frozen=True)
class CheckResult:
    """Verdict of a correctness check against a reference computed on the same input."""

    ok: bool
    error: float
    detail: str = ""


@dataclass
class RankContext:
    """What a rank knows when it prepares a job: its communicator and its share of the machine."""

    comm: Any  # an mpi4py communicator, or workloads.comm.SelfComm for one process
    threads: int = 1
    gpu: bool = False

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    @property
    def nranks(self) -> int:
        return int(self.comm.Get_size())


class Prepared(Protocol):
    """A job ready to run on this rank: `run` is the timed region, `check` runs once after."""

    def run(self) -> None: ...

    def check(self) -> CheckResult: ...


PrepareFn = Callable[[RankContext, int, int], Prepared]


@dataclass(frozen=True)
class Workload:
    """A kind of job. `prepare(ctx, size, tile)` is called on every rank (collectively);
    `prepare(ctx, size, tile, block)` for a workload whose kernel has a second block (`blocks`
    other than (0,), where 0 means the kernel's fixed block, as before it was a knob);
    `prepare(ctx, size, tile, **knobs)` for one with `knobs` of its own (hpc_ds1.knobs:
    integer lists or ranges, ordered values, categories, booleans), under `constraints` over
    them, ranks and threads (Python expressions, Kernel Tuner's `restrictions`; the constants
    cpus, gpus and workers may be read)."""

    name: str
    description: str
    prepare: PrepareFn
    work: Callable[[int], Work]
    memory: Callable[[int, int], int]  # (size, ranks) -> bytes of all ranks together
    sizes: tuple[int, ...]  # measured sizes (training)
    held_out: tuple[int, ...]  # sizes in between, never used for training
    tiles: tuple[int, ...]
    default_tile: int
    throughput_unit: ThroughputUnit = "GFLOP/s"
    item_name: str = "items"
    min_size_base: int = 0
    min_size_per_rank: int = 1
    gpu_capable: bool = False
    module: str = field(default="")  # importable module that defines it (for rank programs)
    blocks: tuple[int, ...] = (0,)
    default_block: int = 0
    knobs: tuple[Knob, ...] = ()
    constraints: tuple[str, ...] = ()
    # False: the job has no ranks nor threads to tune (a recorded GPU kernel): both stay at 1
    ranks_and_threads: bool = True
    # What the workload declares of its own runs (a workload file's `timeout` and `repeats`):
    # the longest one run may take before it is killed, and the timed runs a measurement takes.
    # None: the caller's (runner.api.DEFAULT_TIMEOUT_S; setup's profile, a session's request).
    # A real application's run takes minutes where a kernel's takes milliseconds: one fixed
    # timeout and one repeat count cannot serve both.
    timeout_s: float | None = None
    repeats: int | None = None

    def __post_init__(self) -> None:
        if self.constraints and not self.knobs:
            raise ValueError(f"{self.name}: constraints need knobs of the workload's own")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"{self.name}: timeout_s must be > 0 seconds, not {self.timeout_s}")
        if self.repeats is not None and self.repeats < 1:
            raise ValueError(f"{self.name}: repeats must be >= 1, not {self.repeats}")
        if self.knobs:
            check_knobs(self.knobs, self.constraints, f"workload {self.name}")
        if not self.module:
            object.__setattr__(self, "module", getattr(self.prepare, "__module__", "") or "")
        if self.default_tile not in self.tiles:
            raise ValueError(f"{self.name}: default tile {self.default_tile} not in {self.tiles}")
        if self.default_block not in self.blocks:
            raise ValueError(
                f"{self.name}: default block {self.default_block} not in {self.blocks}"
            )

    @property
    def has_block(self) -> bool:
        return self.blocks != (0,)

    def prepare_job(
        self,
        ctx: RankContext,
        size: int,
        tile: int,
        block: int,
        knobs: dict[str, Value] | None = None,
    ) -> Prepared:
        """`prepare` with the block where the kernel has one, the workload's own knobs as
        keyword arguments where it has any (a plug-in's three-argument `prepare` keeps
        working)."""
        if self.knobs:
            return self.prepare(ctx, size, tile, **(knobs or {}))  # type: ignore[call-arg]
        if self.has_block:
            return self.prepare(ctx, size, tile, block)  # type: ignore[call-arg]
        return self.prepare(ctx, size, tile)

    @property
    def size_range(self) -> tuple[int, int]:
        every = self.sizes + self.held_out
        return (min(every), max(every))

    def min_size(self, ranks: int) -> int:
        return max(1, self.min_size_base + self.min_size_per_rank * ranks)

    def throughput(self, size: int, seconds: float) -> float:
        if seconds <= 0:
            return 0.0
        w = self.work(size)
        amount = w.flops if self.throughput_unit == "GFLOP/s" else w.bytes_moved
        return amount / seconds / 1e9


def check_knobs(knobs: tuple[Knob, ...], constraints: tuple[str, ...], source: str) -> None:
    """KnobError unless `constraints` parse over `knobs`, ranks and threads (the machine's,
    here with stand-in values: a constraint is checked for its form, not enumerated)."""
    machine = (Knob("ranks", "int", (1,), 1), Knob("threads", "int", (1,), 1))
    KnobSpace(
        (*machine, *knobs),
        constraints,
        constants={"cpus": 1, "gpus": 0, "workers": 1},
        source=source,
    )
