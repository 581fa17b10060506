"""A recorded landscape as a workload: a brute-forced tuning cache (Kernel Tuner's format or
T4, `workloads.recorded_space`) that setup, decide, tune and evaluate run like any other job.

A TOML file declares it (docs/plugins.md, "A recorded GPU"):

    [workload]
    name = "convolution-a100"
    recorded = "cachefiles/convolution_milo/A100.json.gz"   # relative to this file
    kernel = "kernels/convolution_milo.json"                # the T1 file: its Conditions

Its knobs are the file's (with their constraints), its configurations exactly the recorded
ones, one problem size (1). It has no ranks nor threads: a recorded GPU kernel has neither, so
both stay at 1. A run draws one of the recorded repeats per timed repeat (`RecordedDevice`), so
the noise is the hardware's; a recorded failure fails the way it failed there (a compile,
runtime or invalid failure as a failed run, a correctness one as a wrong answer, a timeout as
a timeout); a configuration the file does not hold is refused. Nothing is made up."""

from __future__ import annotations

import functools
import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_ds1.knobs import KnobError
from hpc_ds1.workloads.base import RankContext, Work, Workload
from hpc_ds1.workloads.recorded_space import NotRecorded, RecordedDevice, RecordedSpace

# HPC_DS1_REPLAY_SEED: the replay's draws repeat from this seed (tests, benchmarks); unset,
# each process draws from a fresh seed, as a machine's noise would.
SEED_ENV = "HPC_DS1_REPLAY_SEED"
FAILURE_STATUS = {  # recorded failure kind -> runner status
    "invalid": "failed",
    "compile": "failed",
    "runtime": "failed",
    "correctness": "wrong_answer",
    "timeout": "timed_out",
}


def _no_prepare(ctx: RankContext, size: int, tile: int) -> Any:
    raise RuntimeError("a recorded workload is replayed from its file; it has no rank program")


def _no_work(size: int) -> Work:
    return Work(flops=0.0, bytes_moved=0.0, memory_bytes=0, items=1.0)


def _no_memory(size: int, ranks: int) -> int:
    return 0


@dataclass(frozen=True)
class RecordedWorkload(Workload):
    recorded: str = ""  # the recorded file
    kernel: str = ""  # its T1 kernel file ("" for a Kernel Tuner cache that needs none)
    source: str = ""  # the TOML file that declared it

    def landscape(self) -> RecordedSpace:
        return load_landscape(self.recorded, self.kernel)


@functools.lru_cache(maxsize=32)
def load_landscape(recorded: str, kernel: str) -> RecordedSpace:
    return RecordedSpace.load(recorded, kernel=kernel or None)


def recorded_workload(
    name: str, recorded: str | Path, kernel: str | Path | None = None, *, source: str = ""
) -> RecordedWorkload:
    """The workload replaying `recorded` (RecordedError when the file cannot be read)."""
    space = load_landscape(str(recorded), str(kernel or ""))
    return RecordedWorkload(
        name=name,
        description=f"{space.device}: {space.count} recorded configurations of "
        f"{len(space.space.knobs)} knobs ({Path(recorded).name})",
        prepare=_no_prepare,
        work=_no_work,
        memory=_no_memory,
        sizes=(1,),
        held_out=(),
        tiles=(1,),
        default_tile=1,
        min_size_per_rank=0,
        module=__name__,
        knobs=space.space.knobs,
        constraints=tuple(c.text for c in space.space.constraints),
        ranks_and_threads=False,
        recorded=str(recorded),
        kernel=str(kernel or ""),
        source=source,
    )


_devices: dict[tuple[str, str], RecordedDevice] = {}
_lock = threading.Lock()


def _device(wl: RecordedWorkload) -> RecordedDevice:
    key = (wl.recorded, wl.kernel)
    with _lock:
        found = _devices.get(key)
        if found is None:
            seed = os.environ.get(SEED_ENV)
            chosen = int(seed) if seed else random.SystemRandom().randrange(2**32)
            found = _devices[key] = RecordedDevice(wl.landscape(), seed=chosen)
        return found


def replay(
    wl: RecordedWorkload, knobs: dict[str, Any], repeats: int
) -> tuple[str, list[float], str]:
    """(status, the drawn runtimes in seconds, an error): one draw per timed repeat; a recorded
    failure fails on the first (NotRecorded, a KeyError, for a configuration not in the file)."""
    device = _device(wl)
    try:
        config = device.recorded.space.config(knobs)
    except KnobError as error:
        raise NotRecorded(str(error)) from None
    times: list[float] = []
    with _lock:  # one device, one random stream
        for _ in range(repeats):
            run = device.run(config)
            if not run.ok:
                kind = run.failure or "runtime"
                return FAILURE_STATUS.get(kind, "failed"), [], f"recorded failure: {kind}"
            assert run.seconds is not None
            times.append(run.seconds)
    return "ok", times, ""
