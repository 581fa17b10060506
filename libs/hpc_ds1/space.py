"""The configuration space of a device for a workload, its moves and neighbours (pure logic)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

if TYPE_CHECKING:
    from hpc_ds1.hardware import Fingerprint

RANKS_UP = "RANKS_UP"
RANKS_DOWN = "RANKS_DOWN"
THREADS_UP = "THREADS_UP"
THREADS_DOWN = "THREADS_DOWN"
TILE_UP = "TILE_UP"
TILE_DOWN = "TILE_DOWN"
# The kernel's second blocking dimension, for workloads that have one (the stencil's temporal
# block: sweeps per pass over memory and per halo exchange).
BLOCK_UP = "BLOCK_UP"
BLOCK_DOWN = "BLOCK_DOWN"
USE_GPU = "USE_GPU"
USE_CPU = "USE_CPU"
# A rank traded for threads, or threads for a rank, at the same ranks x threads: the split an
# HPC engineer tries first. Without it, going from ranks=2 threads=1 to ranks=1 threads=2 takes
# two single changes through a worse configuration (fewer workers, or oversubscribed).
RANKS_UP_THREADS_DOWN = "RANKS_UP_THREADS_DOWN"
RANKS_DOWN_THREADS_UP = "RANKS_DOWN_THREADS_UP"
STOP = "STOP"
MOVES: tuple[str, ...] = (
    RANKS_UP, RANKS_DOWN, THREADS_UP, THREADS_DOWN, TILE_UP, TILE_DOWN, USE_GPU, USE_CPU,
    RANKS_UP_THREADS_DOWN, RANKS_DOWN_THREADS_UP, BLOCK_UP, BLOCK_DOWN,
)  # fmt: skip
TRADES: dict[str, int] = {RANKS_UP_THREADS_DOWN: 1, RANKS_DOWN_THREADS_UP: -1}
ALL_ACTIONS: tuple[str, ...] = (*MOVES, STOP)
OVERSUBSCRIPTION = 2  # ranks x threads may reach this many times the logical CPUs


def without_block_0(dumped: dict[str, Any]) -> dict[str, Any]:
    """A dumped configuration as it is recorded: block 0 (the kernel's own) left out."""
    if not dumped.get("block"):
        dumped.pop("block", None)
    return dumped


class Config(BaseModel):
    """One configuration of a job: MPI ranks, numba threads per rank, kernel tile, the kernel's
    second block (0: the kernel's fixed one, as before the knob; every configuration recorded
    before it has 0), GPU or not."""

    model_config = ConfigDict(frozen=True)
    ranks: int = Field(ge=1)
    threads: int = Field(ge=1)
    tile: int = Field(ge=1)
    block: int = Field(default=0, ge=0)
    gpu: bool = False

    @model_serializer(mode="wrap")
    def _without_block_0(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Block 0 is left out: a configuration is recorded as every one was before the block
        was a knob, and a workload without a block never shows one."""
        return without_block_0(handler(self))

    def label(self) -> str:
        block = f" block={self.block}" if self.block else ""
        return f"ranks={self.ranks} threads={self.threads} tile={self.tile}{block} gpu={self.gpu}"


class InfeasibleConfig(ValueError):
    """A configuration outside the space; the message says what is wrong and what is accepted."""


def _powers_of_two(limit: int) -> tuple[int, ...]:
    out, value = [], 1
    while value <= max(limit, 1):
        out.append(value)
        value *= 2
    return tuple(out)


def counts(limit: int) -> tuple[int, ...]:
    """Rank or thread counts up to `limit`: the powers of two, and `limit` halved while it
    stays whole, so a 96-CPU allocation offers 96, 48, 24, 12, 6 and 3 beside 1, 2, 4 ... 64.
    A power-of-two `limit` gives the powers of two alone (the space of every earlier version).
    Sorted: the moves step along this list."""
    limit = max(limit, 1)
    chain, value = set(), limit
    while True:
        chain.add(value)
        if value % 2:
            break
        value //= 2
    return tuple(sorted(set(_powers_of_two(limit)) | chain))


@dataclass(frozen=True)
class ConfigSpace:
    """ranks, threads: powers of two and the usable CPUs' halving chain (`counts`);
    ranks x threads <= max_workers; tiles and blocks per workload (blocks (0,): the kernel has
    no second block); gpu only when the device has one (one rank per GPU)."""

    ranks: tuple[int, ...]
    threads: tuple[int, ...]
    tiles: tuple[int, ...]
    gpus: int = 0
    max_workers: int = 0
    default_tile: int | None = None
    blocks: tuple[int, ...] = (0,)
    default_block: int = 0

    @classmethod
    def for_device(cls, fp: Fingerprint | None = None, workload: object = None) -> ConfigSpace:
        """The space of device `fp` (this one by default) for `workload` (a name or Workload)."""
        if fp is None:
            from hpc_ds1.hardware import fingerprint

            fp = fingerprint()
        tiles: tuple[int, ...] = (1,)
        blocks: tuple[int, ...] = (0,)
        default_tile, default_block = None, 0
        if workload is not None:
            from hpc_ds1.workloads import Workload, get_workload

            wl = workload if isinstance(workload, Workload) else get_workload(str(workload))
            tiles, default_tile = wl.tiles, wl.default_tile
            blocks, default_block = wl.blocks, wl.default_block
        space = cls.for_cpus(fp.cpus, tiles, len(fp.gpus), blocks, default_block)
        return replace(space, default_tile=default_tile)

    @classmethod
    def for_cpus(
        cls,
        logical_cpus: int,
        tiles: Sequence[int],
        gpus: int = 0,
        blocks: Sequence[int] = (0,),
        default_block: int | None = None,
    ) -> ConfigSpace:
        """The space of `logical_cpus` usable CPUs (the allocation's, not the box's)."""
        workers = OVERSUBSCRIPTION * max(logical_cpus, 1)
        ordered = tuple(sorted(set(blocks))) or (0,)
        if default_block not in ordered:
            default_block = ordered[(len(ordered) - 1) // 2]
        return cls(
            ranks=counts(workers),
            threads=counts(max(logical_cpus, 1)),
            tiles=tuple(sorted(set(tiles))),
            gpus=gpus,
            max_workers=workers,
            blocks=ordered,
            default_block=default_block,
        )

    def runnable(self) -> ConfigSpace:
        """Wider than the tuned space: what a user's job may already be using (up to twice the
        oversubscription, and block 0: the kernel's fixed block, as every job ran before the
        block was a knob), so a decision can start from it and move back into the space."""
        cpus = max(1, self.max_workers // OVERSUBSCRIPTION)
        workers = 2 * self.max_workers
        return replace(
            self,
            ranks=counts(workers),
            threads=counts(OVERSUBSCRIPTION * cpus),
            max_workers=workers,
            blocks=tuple(sorted({0, *self.blocks})),
        )

    @property
    def has_gpu(self) -> bool:
        return self.gpus > 0

    @property
    def gpu_tile(self) -> int:
        """The tile of every GPU configuration: the GPU kernels launch fixed shapes, so another
        tile would run the same job again (on an H200, 20 of a gemm space's 100 configurations
        were such copies before, and TILE_UP/DOWN from one of them spent a run on noise)."""
        return self.default_tile or self.tiles[(len(self.tiles) - 1) // 2]

    def problem(self, config: Config) -> str | None:
        """Why `config` is not in this space, in words; None when it is."""
        if config.ranks not in self.ranks:
            return f"ranks={config.ranks} is not accepted; ranks must be one of {list(self.ranks)}"
        if config.threads not in self.threads:
            return (
                f"threads={config.threads} is not accepted; threads must be one of "
                f"{list(self.threads)}"
            )
        if config.tile not in self.tiles:
            return f"tile={config.tile} is not accepted; tile must be one of {list(self.tiles)}"
        if config.block not in self.blocks:
            if self.blocks == (0,):
                return f"block={config.block} is not accepted: this workload's kernel has no block"
            return f"block={config.block} is not accepted; block must be one of {list(self.blocks)}"
        if config.ranks * config.threads > self.max_workers:
            return (
                f"ranks x threads = {config.ranks * config.threads} exceeds {self.max_workers} "
                f"({OVERSUBSCRIPTION} x the logical CPUs)"
            )
        if config.gpu and not self.has_gpu:
            return "gpu=True is not accepted: this device has no CUDA GPU"
        if config.gpu and config.ranks > self.gpus:
            return f"gpu=True accepts at most one rank per GPU: ranks <= {self.gpus}"
        if config.gpu and config.tile != self.gpu_tile:
            return f"gpu=True runs the GPU kernel, which has no tile: tile must be {self.gpu_tile}"
        if config.gpu and config.block not in (0, self.blocks[0]):
            # the GPU kernels have no block: other values would run the same job again
            return (
                f"gpu=True runs the GPU kernel, which has no block: block must be {self.blocks[0]}"
            )
        return None

    def contains(self, config: Config) -> bool:
        return self.problem(config) is None

    def validate(self, config: Config) -> Config:
        reason = self.problem(config)
        if reason is not None:
            raise InfeasibleConfig(reason)
        return config

    def configs(self) -> list[Config]:
        """Every feasible configuration."""
        try:
            return list(_feasible(self))
        except TypeError:  # a space built by hand with lists is not hashable: not cached
            return list(_feasible.__wrapped__(self))

    def default(self, tile: int | None = None) -> Config:
        """One rank using every core, the middle tile, the kernel's own block: a sensible
        starting point."""
        threads = max(t for t in self.threads)
        middle = self.tiles[(len(self.tiles) - 1) // 2]
        chosen = tile if tile is not None else (self.default_tile or middle)
        return Config(ranks=1, threads=threads, tile=chosen, block=self.default_block)


# A space and a configuration are immutable, and the replays of training and evaluation ask for
# the same spaces' configurations and neighbours hundreds of thousands of times (70 % of a
# training's time went there): each is worked out once.
@functools.lru_cache(maxsize=1024)
def _feasible(space: ConfigSpace) -> tuple[Config, ...]:
    out = []
    for gpu in (False, True) if space.has_gpu else (False,):
        for r in space.ranks:
            for t in space.threads:
                for tile in space.tiles:
                    for block in space.blocks:
                        c = Config(ranks=r, threads=t, tile=tile, block=block, gpu=gpu)
                        if space.contains(c):
                            out.append(c)
    return tuple(out)


def _step(values: tuple[int, ...], current: int, direction: int) -> int | None:
    if current not in values:
        return None
    index = values.index(current) + direction
    return values[index] if 0 <= index < len(values) else None


def _trade(config: Config, space: ConfigSpace, direction: int) -> Config | None:
    """The next rank count up (direction 1) or down (-1) that splits the same ranks x threads
    exactly into a thread count of the space; None when there is none."""
    if config.ranks not in space.ranks or config.threads not in space.threads:
        return None
    workers = config.ranks * config.threads
    for ranks in space.ranks[::direction]:
        if (ranks - config.ranks) * direction > 0 and workers % ranks == 0:
            if workers // ranks in space.threads:
                return config.model_copy(update={"ranks": ranks, "threads": workers // ranks})
    return None


def apply_move(config: Config, move: str, space: ConfigSpace) -> Config | None:
    """The configuration one `move` away, or None when the move leaves the space."""
    if move not in MOVES:
        raise ValueError(f"unknown move {move!r}; moves are {', '.join(MOVES)}")
    if move in TRADES:
        traded = _trade(config, space, TRADES[move])
        return traded if traded is not None and space.contains(traded) else None
    changes: dict[str, object] = {}
    axis = {"RANKS": ("ranks", space.ranks), "THREADS": ("threads", space.threads)}
    axis["TILE"] = ("tile", space.tiles)
    axis["BLOCK"] = ("block", space.blocks)
    if move in (USE_GPU, USE_CPU):
        want = move == USE_GPU
        if config.gpu == want:
            return None
        changes["gpu"] = want
        if want:  # the GPU kernel has no tile nor block: the move takes the GPU's own
            changes["tile"] = space.gpu_tile
            changes["block"] = (
                config.block if config.block in (0, space.blocks[0]) else space.blocks[0]
            )
    else:
        name, direction = move.rsplit("_", 1)
        field, values = axis[name]
        nxt = _step(values, getattr(config, field), 1 if direction == "UP" else -1)
        if nxt is None:
            return None
        changes[field] = nxt
    candidate = config.model_copy(update=changes)
    return candidate if space.contains(candidate) else None


def neighbours(config: Config, space: ConfigSpace) -> dict[str, Config]:
    """Every feasible configuration one move away, keyed by the move (STOP is not a neighbour)."""
    try:
        return dict(_neighbours(config, space))
    except TypeError:  # a space built by hand with lists is not hashable: not cached
        return dict(_neighbours.__wrapped__(config, space))


@functools.lru_cache(maxsize=65536)
def _neighbours(config: Config, space: ConfigSpace) -> tuple[tuple[str, Config], ...]:
    out = []
    for move in MOVES:
        nxt = apply_move(config, move, space)
        if nxt is not None:
            out.append((move, nxt))
    return tuple(out)
