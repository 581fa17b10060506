"""Feature vectors: work per size (not the workload's name), configuration, machine, working set
per rank and per worker, telemetry.

Column layout: BASE (runtime model and familiarity guard) then TELEMETRY (move model only). A
model file names its columns (metadata "features", "n_base"); a file trained before a column
was added is fed the columns it names (`Layout`)."""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from hpc_ds1.space import Config

WORK_FEATURES = ("log10_flops", "log10_bytes", "log10_memory", "log10_intensity", "log2_size")
CONFIG_FEATURES = ("log2_ranks", "log2_threads", "log2_tile", "tile_pos", "gpu", "workers_per_cpu")
# The kernel's second block (the stencil's temporal block: sweeps per pass); 0 where the
# configuration leaves the kernel its fixed block.
BLOCK_FEATURES = ("log2_block",)
# A workload's own knobs (Config.knobs), by knob name in order: a number v as log2(1 + |v|)
# with v's sign (0 and 1 stay apart: a switch), a bool as 0/1, a string as a stable code in
# [0, 1): trees split on them, and no knob's definition is needed to read a configuration
# (log2 alone put 0 and 1 together: on a recorded GPU space its runtime model read nothing of
# three switches, 0.22 RMSE in log10 against 0.07). 0 where a configuration has fewer
# knobs; knobs past the twelfth are not features (the recorded GPU kernels have 8 and 10).
# Trained on only where a measurement has knobs.
OWN_KNOB_FEATURES = tuple(f"own_knob_{i}" for i in range(1, 13))
MACHINE_FEATURES = ("logical_cpus", "physical_cores", "log2_memory_gib", "gpus")
# What decides where a configuration's order turns between sizes: the data each rank and each
# worker (rank x thread) holds against the caches, a product of size and configuration that a
# tree cannot split on from log memory and log ranks apart. The model is per device, so the
# cache sizes themselves are constant and need no column.
WORKING_SET_FEATURES = ("log2_bytes_per_rank", "log2_bytes_per_worker")
TELEMETRY_FEATURES = ("log10_runtime", "log10_throughput", "has_telemetry")
BASE_FEATURES = (
    *WORK_FEATURES,
    *CONFIG_FEATURES,
    *MACHINE_FEATURES,
    *WORKING_SET_FEATURES,
    *BLOCK_FEATURES,
    *OWN_KNOB_FEATURES,
)
STATE_FEATURES = (*BASE_FEATURES, *TELEMETRY_FEATURES)
N_WORK = len(WORK_FEATURES)
N_BASE = len(BASE_FEATURES)
N_STATE = len(STATE_FEATURES)

FloatArray = npt.NDArray[np.float32]


def _log10(x: float) -> float:
    return math.log10(max(float(x), 1.0))


def work_vector(flops: float, bytes_moved: float, memory_bytes: float, size: int) -> list[float]:
    intensity = (float(flops) + 1.0) / (float(bytes_moved) + 1.0)
    return [
        _log10(flops),
        _log10(bytes_moved),
        _log10(memory_bytes),
        math.log10(intensity),
        math.log2(max(size, 1)),
    ]


@functools.lru_cache(maxsize=4096)
def registry_work(workload: str, size: int) -> tuple[float, ...] | None:
    """Work features of a registered workload at `size`; None when it is not registered."""
    from hpc_ds1.workloads import UnknownWorkload, get_workload

    try:
        wl = get_workload(workload)
    except UnknownWorkload:
        return None
    w = wl.work(size)
    return tuple(work_vector(w.flops, w.bytes_moved, w.memory_bytes, size))


@functools.lru_cache(maxsize=256)
def registry_tiles(workload: str) -> tuple[int, ...] | None:
    from hpc_ds1.workloads import UnknownWorkload, get_workload

    try:
        return tuple(get_workload(workload).tiles)
    except UnknownWorkload:
        return None


def machine_vector(fp: Any) -> list[float]:
    """From a Fingerprint or its dict."""
    get = (lambda k: fp[k]) if isinstance(fp, dict) else (lambda k: getattr(fp, k))
    return [
        float(get("logical_cpus")),
        float(get("physical_cores")),
        math.log2(max(float(get("memory_bytes")) / 2**30, 1e-3)),
        float(len(get("gpus"))),
    ]


def tile_position(tile: int, tiles: Sequence[int] | None) -> float:
    """Where the tile sits in the workload's tile range: 0 smallest, 1 largest, 0.5 unknown."""
    if not tiles or len(tiles) < 2:
        return 0.5
    lo, hi = math.log2(min(tiles)), math.log2(max(tiles))
    return min(max((math.log2(tile) - lo) / (hi - lo), -1.0), 2.0) if hi > lo else 0.5


def config_vector(config: Config, tiles: Sequence[int] | None, logical_cpus: float) -> list[float]:
    return [
        math.log2(config.ranks),
        math.log2(config.threads),
        math.log2(config.tile),
        tile_position(config.tile, tiles),
        1.0 if config.gpu else 0.0,
        config.ranks * config.threads / max(logical_cpus, 1.0),
    ]


def working_set_vector(work: Sequence[float], config: Config) -> list[float]:
    """log2 bytes per rank and per worker, from the work's log10 memory (WORK_FEATURES[2])."""
    log2_bytes = float(work[2]) * math.log2(10.0)
    return [
        log2_bytes - math.log2(config.ranks),
        log2_bytes - math.log2(config.ranks * config.threads),
    ]


def block_vector(config: Config) -> list[float]:
    return [math.log2(config.block) if config.block > 0 else 0.0]


def own_knob_vector(config: Config) -> list[float]:
    out = [_knob_code(value) for _, value in config.knobs[: len(OWN_KNOB_FEATURES)]]
    return out + [0.0] * (len(OWN_KNOB_FEATURES) - len(out))


def _knob_code(value: object) -> float:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        # log2(1 + |v|) with v's sign: 0 and 1 (a switch) apart, large values compressed
        return math.copysign(math.log2(1.0 + abs(value)), value)
    return zlib.crc32(str(value).encode()) / 2**32


def telemetry_vector(runtime_s: float | None, throughput: float | None) -> list[float]:
    if runtime_s is None or runtime_s <= 0:
        return [0.0, 0.0, 0.0]
    tput = math.log10(throughput) if throughput is not None and throughput > 0 else 0.0
    return [math.log10(runtime_s), tput, 1.0]


def row(
    work: Sequence[float],
    config: Config,
    tiles: Sequence[int] | None,
    machine: Sequence[float],
    runtime_s: float | None = None,
    throughput: float | None = None,
) -> list[float]:
    """One full state row (STATE_FEATURES)."""
    return [
        *work,
        *config_vector(config, tiles, machine[0]),
        *machine,
        *working_set_vector(work, config),
        *block_vector(config),
        *own_knob_vector(config),
        *telemetry_vector(runtime_s, throughput),
    ]


def as_matrix(rows: Sequence[Sequence[float]]) -> FloatArray:
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)


class Layout:
    """The columns one model file was trained on, taken out of this version's full rows: every
    name the file lists must be one this version computes (a newer file is refused in words)."""

    def __init__(self, names: Sequence[str] | None, n_base: int | None) -> None:
        names = list(names) if names else list(LEGACY_STATE_FEATURES)
        unknown = [n for n in names if n not in STATE_FEATURES]
        if unknown:
            raise ValueError(
                f"this model file uses features this version of hpc-ds1 does not compute "
                f"({', '.join(unknown)}): upgrade hpc-ds1, or train a model with this version "
                "(hpc-ds1 setup)"
            )
        self.names = tuple(names)
        legacy_base = len(LEGACY_STATE_FEATURES) - len(TELEMETRY_FEATURES)
        self.n_base = int(n_base) if n_base is not None else legacy_base
        self.n_state = len(names)
        self.current = self.names == STATE_FEATURES
        self._state = [STATE_FEATURES.index(n) for n in names]
        self._base = self._state[: self.n_base]

    def state(self, row: Sequence[float]) -> list[float]:
        """The file's columns of one full state row."""
        return list(row) if self.current else [row[i] for i in self._state]

    def base(self, row: Sequence[float]) -> list[float]:
        """The file's BASE columns of one full row (state or base)."""
        return list(row[:N_BASE]) if self.current else [row[i] for i in self._base]


# The BASE columns a model trains on unless told otherwise: every column but the working set's.
# On a full setup's development set the working-set columns changed no session and no System 1
# pick (docs/evaluation.md section 8): the runtime models that win there (ridge over pairwise
# products, a forest on the size-relative target) already span or split on them. A default file
# keeps the columns of every file written before them, which older versions load.
# The block column is trained on: it is a knob of the space, and on a workload without a block it
# is constant (0) and costs nothing.
DEFAULT_BASE_FEATURES = (*WORK_FEATURES, *CONFIG_FEATURES, *MACHINE_FEATURES, *BLOCK_FEATURES)
# The columns of every model file written before WORKING_SET_FEATURES (2 Dec 2026).
LEGACY_STATE_FEATURES = (*WORK_FEATURES, *CONFIG_FEATURES, *MACHINE_FEATURES, *TELEMETRY_FEATURES)
