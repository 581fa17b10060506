"""The configuration space of a device for a workload, its moves and neighbours (pure logic)."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from hpc_ds1.knobs import Knob, KnobError, KnobSpace, Value

if TYPE_CHECKING:
    from hpc_ds1.machine.hardware import Fingerprint

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
# The move model's classes for the moves of a workload's own knobs (named `nb+`, `nb-`,
# `algo=fast` by the knob space): one up, one down, one set-to-a-value. A decision gives a
# class's probability to the class's move the runtime model ranks best (`action_class`).
KNOB_UP = "KNOB_UP"
KNOB_DOWN = "KNOB_DOWN"
KNOB_SET = "KNOB_SET"
OWN_KNOB_CLASSES: tuple[str, ...] = (KNOB_UP, KNOB_DOWN, KNOB_SET)
ALL_ACTIONS: tuple[str, ...] = (*MOVES, STOP, *OWN_KNOB_CLASSES)


def action_class(move: str) -> str:
    """The move model's class of `move`: itself for the machine's and the built-ins' moves,
    KNOB_UP / KNOB_DOWN / KNOB_SET for a workload's own knob's."""
    if move in ALL_ACTIONS:
        return move
    return KNOB_UP if move.endswith("+") else KNOB_DOWN if move.endswith("-") else KNOB_SET


def is_move_name(move: str) -> bool:
    """Whether `move` names a move: the machine's and the built-ins' (MOVES, STOP) or a
    workload's own knob's (`name+`, `name-`, `name=value`)."""
    if move in MOVES or move == STOP:
        return True
    return OWN_MOVE.match(move) is not None


OWN_MOVE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}([+-]|=[A-Za-z0-9_.:+\-]{1,64})$")


def representatives(per_move: dict[str, float]) -> dict[str, str]:
    """Each move class's move: the move itself for the machine's and the built-ins' moves; for
    KNOB_UP / KNOB_DOWN / KNOB_SET, the workload's own knob move of that class with the lowest
    predicted log runtime change (`per_move`), as `decide` gives it the class's probability."""
    out: dict[str, str] = {}
    for move, delta in sorted(per_move.items()):
        cls = action_class(move)
        if cls not in out or delta < per_move[out[cls]]:
            out[cls] = move
    return out


OVERSUBSCRIPTION = 2  # ranks x threads may reach this many times the logical CPUs


def without_block_0(dumped: dict[str, Any]) -> dict[str, Any]:
    """A dumped configuration as it is recorded: block 0 (the kernel's own) and no knobs of the
    workload's own left out, so a configuration is recorded as every one was before them."""
    if not dumped.get("block"):
        dumped.pop("block", None)
    if "knobs" in dumped:
        if dumped["knobs"]:
            dumped["knobs"] = dict(dumped["knobs"])
        else:
            dumped.pop("knobs")
    return dumped


KnobValues = tuple[tuple[str, Value], ...]


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
    # The workload's own knobs (a TOML file's or a plug-in's), by name, sorted: a tuple, so a
    # configuration stays hashable; given and recorded as a table {"nb": 64, "algo": "fast"}.
    knobs: KnobValues = ()

    @field_validator("knobs", mode="before")
    @classmethod
    def _knob_table(cls, value: Any) -> Any:
        if isinstance(value, dict):
            value = tuple(value.items())
        if isinstance(value, list | tuple):
            pairs = [tuple(p) if isinstance(p, list | tuple) else p for p in value]
            if all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
                names = [p[0] for p in pairs]
                if len(set(names)) != len(names):
                    raise ValueError(f"knobs names a knob twice: {names}")
                return tuple(sorted(pairs, key=lambda p: str(p[0])))
        return value

    @model_serializer(mode="wrap")
    def _without_block_0(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Block 0 and empty knobs are left out: a configuration is recorded as every one was
        before the block and the workload's own knobs were knobs."""
        return without_block_0(handler(self))

    def knob(self, name: str) -> Value | None:
        """The value of the workload's own knob `name`, None when the configuration has none."""
        return dict(self.knobs).get(name)

    def label(self) -> str:
        block = f" block={self.block}" if self.block else ""
        own = "".join(f" {name}={value}" for name, value in self.knobs)
        return (
            f"ranks={self.ranks} threads={self.threads} tile={self.tile}{block}{own} gpu={self.gpu}"
        )


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
    # A workload's own knobs and the constraints between them, ranks and threads (Kernel
    # Tuner's `restrictions`; the constants cpus, gpus and workers may be read): `knob_space`.
    knobs: tuple[Knob, ...] = ()
    constraints: tuple[str, ...] = ()

    @classmethod
    def for_device(cls, fp: Fingerprint | None = None, workload: object = None) -> ConfigSpace:
        """The space of device `fp` (this one by default) for `workload` (a name or Workload)."""
        if fp is None:
            from hpc_ds1.machine.hardware import fingerprint

            fp = fingerprint()
        tiles: tuple[int, ...] = (1,)
        blocks: tuple[int, ...] = (0,)
        default_tile, default_block = None, 0
        knobs: tuple[Knob, ...] = ()
        constraints: tuple[str, ...] = ()
        if workload is not None:
            from hpc_ds1.workloads import Workload, get_workload

            wl = workload if isinstance(workload, Workload) else get_workload(str(workload))
            tiles, default_tile = wl.tiles, wl.default_tile
            blocks, default_block = wl.blocks, wl.default_block
            knobs, constraints = wl.knobs, wl.constraints
        space = cls.for_cpus(
            fp.cpus, tiles, len(fp.gpus), blocks, default_block, knobs, constraints
        )
        if workload is not None and not wl.ranks_and_threads:
            space = replace(space, ranks=(1,), threads=(1,), max_workers=OVERSUBSCRIPTION)
        return replace(space, default_tile=default_tile)

    @classmethod
    def for_cpus(
        cls,
        logical_cpus: int,
        tiles: Sequence[int],
        gpus: int = 0,
        blocks: Sequence[int] = (0,),
        default_block: int | None = None,
        knobs: Sequence[Knob] = (),
        constraints: Sequence[str] = (),
    ) -> ConfigSpace:
        """The space of `logical_cpus` usable CPUs (the allocation's, not the box's). A
        workload with `knobs` of its own runs on the CPUs only (no GPU configuration)."""
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
            knobs=tuple(knobs),
            constraints=tuple(constraints),
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
        return self.gpus > 0 and not self.knobs

    @property
    def knob_space(self) -> KnobSpace | None:
        """The machine's ranks and threads and the workload's own knobs as one KnobSpace, under
        the workload's constraints and ranks x threads <= max_workers; None for a workload
        without knobs of its own (the space of ranks, threads, tiles and blocks)."""
        return _knob_space(self) if self.knobs else None

    @property
    def gpu_tile(self) -> int:
        """The tile of every GPU configuration: the GPU kernels launch fixed shapes, so another
        tile would run the same job again (on an H200, 20 of a gemm space's 100 configurations
        were such copies before, and TILE_UP/DOWN from one of them spent a run on noise)."""
        return self.default_tile or self.tiles[(len(self.tiles) - 1) // 2]

    def problem(self, config: Config) -> str | None:
        """Why `config` is not in this space, in words; None when it is."""
        plain = self._plain_problem(config)
        if plain is not None or self.knob_space is None:
            return plain
        names = [k.name for k in self.knobs]
        missing = [n for n in names if config.knob(n) is None]
        unknown = sorted({n for n, _ in config.knobs} - set(names))
        if missing or unknown:
            pairs = ((missing, "missing"), (unknown, "unknown"))
            wrong = [f"knobs {', '.join(found)} {what}" for found, what in pairs if found]
            return (
                f"{'; '.join(wrong)}: this workload's configurations give each of its knobs "
                f"{', '.join(names)}"
            )
        try:
            return self.knob_space.problem(_as_knobs(config, self.knob_space))
        except KnobError as error:
            return str(error).split(": ", 2)[-1]

    def knob_values(self, given: dict[str, Value] | None) -> dict[str, Value]:
        """The workload's own knobs as a user gave them, each left out as the space's default
        configuration has it (the knobs' defaults where the constraints allow them; a name the
        workload does not have stays, for `problem` to refuse in words)."""
        if not self.knobs:
            return dict(given or {})
        return {**dict(self.default().knobs), **(given or {})}

    def _plain_problem(self, config: Config) -> str | None:
        if not self.knobs and config.knobs:
            names = ", ".join(name for name, _ in config.knobs)
            return f"knobs {names} are not accepted: this workload declares no knobs of its own"
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
        """One rank using every core, the middle tile, the kernel's own block, the workload's
        knobs at their defaults: a sensible starting point (where the constraints refuse it,
        the first valid configuration)."""
        threads = max(t for t in self.threads)
        middle = self.tiles[(len(self.tiles) - 1) // 2]
        chosen = tile if tile is not None else (self.default_tile or middle)
        config = Config(ranks=1, threads=threads, tile=chosen, block=self.default_block)
        if self.knob_space is None:
            return config
        own = {k.name: k.default for k in self.knobs}
        wanted = _as_knobs(config.model_copy(update={"knobs": own}), self.knob_space)
        found = wanted if self.knob_space.contains(wanted) else self.knob_space.default()
        return _from_knobs(found, config, self.knob_space)


# A space and a configuration are immutable, and the replays of training and evaluation ask for
# the same spaces' configurations and neighbours hundreds of thousands of times (70 % of a
# training's time went there): each is worked out once.
# The knob space's names of the machine's moves, as every earlier record names them.
MACHINE_MOVES = {
    "ranks+": RANKS_UP,
    "ranks-": RANKS_DOWN,
    "threads+": THREADS_UP,
    "threads-": THREADS_DOWN,
    "trade:ranks>threads": RANKS_DOWN_THREADS_UP,
    "trade:threads>ranks": RANKS_UP_THREADS_DOWN,
}


@functools.lru_cache(maxsize=256)
def _knob_space(space: ConfigSpace) -> KnobSpace:
    cpus = max(1, space.max_workers // OVERSUBSCRIPTION)
    machine = (
        Knob("ranks", "int", space.ranks, 1),
        Knob("threads", "int", space.threads, max(space.threads)),
    )
    return KnobSpace(
        (*machine, *space.knobs),
        (*space.constraints, "ranks * threads <= workers"),
        constants={"cpus": cpus, "gpus": space.gpus, "workers": space.max_workers},
        trades=(("ranks", "threads"),),
        source="the workload's knobs",
    )


def _as_knobs(config: Config, knobs: KnobSpace) -> tuple[Value, ...]:
    """`config` as a configuration of `knobs` (KnobError naming a missing or unknown knob)."""
    own = dict(config.knobs)
    return knobs.config({"ranks": config.ranks, "threads": config.threads, **own})


def _from_knobs(values: tuple[Value, ...], like: Config, knobs: KnobSpace) -> Config:
    named = knobs.as_dict(values)
    ranks, threads = int(named.pop("ranks")), int(named.pop("threads"))
    return like.model_copy(
        update={"ranks": ranks, "threads": threads, "knobs": tuple(sorted(named.items()))}
    )


@functools.lru_cache(maxsize=1024)
def _feasible(space: ConfigSpace) -> tuple[Config, ...]:
    knobs = space.knob_space
    if knobs is not None:
        like = space.default()
        return tuple(_from_knobs(values, like, knobs) for values in knobs.configs())
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
    if space.knob_space is not None:
        known = {MACHINE_MOVES.get(m, m) for m in space.knob_space.move_names()}
        if move not in known:
            raise ValueError(f"unknown move {move!r}; moves are {', '.join(sorted(known))}")
        return neighbours(config, space).get(move)
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
    knobs = space.knob_space
    if knobs is not None:
        # A knob move jumps holes the constraints cut to the nearest valid value (KnobSpace).
        # A configuration without the workload's knobs (a job from before them) has none.
        try:
            values = _as_knobs(config, knobs)
            found = knobs.neighbours(values)
        except KnobError:
            return ()
        return tuple(
            (MACHINE_MOVES.get(move, move), _from_knobs(v, config, knobs))
            for move, v in found.items()
        )
    out = []
    for move in MOVES:
        nxt = apply_move(config, move, space)
        if nxt is not None:
            out.append((move, nxt))
    return tuple(out)


@dataclass(frozen=True)
class KnobView:
    """A ConfigSpace as a KnobSpace, for the searches that walk any knobs
    (hpc_ds1.tuning.search): the same configurations, each a tuple of knob values."""

    knobs: KnobSpace
    like: Config  # the fields the knobs leave as they are

    def config(self, values: tuple[Value, ...]) -> Config:
        named = self.knobs.as_dict(values)
        own = {n: v for n, v in named.items() if n not in _FIELDS}
        fields = {n: v for n, v in named.items() if n in _FIELDS}
        return self.like.model_copy(update={**fields, "knobs": tuple(sorted(own.items()))})

    def values(self, config: Config) -> tuple[Value, ...]:
        named = {**{f: getattr(config, f) for f in _FIELDS}, **dict(config.knobs)}
        return self.knobs.config({n: named[n] for n in self.knobs.names})


_FIELDS = ("ranks", "threads", "tile", "block", "gpu")


def knob_view(space: ConfigSpace) -> KnobView:
    """`space` as a KnobSpace over ranks, threads and the workload's own knobs, or, for a
    workload without them, over ranks, threads, the tile, the block (where the kernel has one)
    and the GPU (where the device has one), under the rules of `ConfigSpace.problem`."""
    like = space.default()
    if space.knob_space is not None:
        return KnobView(space.knob_space, like)
    knobs = [
        Knob("ranks", "int", space.ranks, like.ranks),
        Knob("threads", "int", space.threads, like.threads),
        Knob("tile", "int", space.tiles, like.tile),
    ]
    constraints = ["ranks * threads <= workers"]
    if space.blocks != (0,):
        knobs.append(Knob("block", "int", space.blocks, like.block))
    if space.has_gpu:
        knobs.append(Knob("gpu", "bool", (False, True), False))
        constraints += [
            "not gpu or ranks <= gpus",
            f"not gpu or tile == {space.gpu_tile}",
        ]
        if space.blocks != (0,):
            constraints.append(f"not gpu or block in (0, {space.blocks[0]})")
    view = KnobSpace(
        knobs,
        constraints,
        constants={"workers": space.max_workers, "gpus": space.gpus},
        trades=(("ranks", "threads"),),
        source="the configuration space",
    )
    return KnobView(view, like)
