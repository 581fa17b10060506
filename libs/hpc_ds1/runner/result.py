"""The result of one job: what ran, how it went, how long it took and how sure we are."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from hpc_ds1.space import Config


class Status(StrEnum):
    OK = "ok"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    WRONG_ANSWER = "wrong_answer"


class Job(BaseModel):
    """One (workload, size, config) to run `repeats` timed times after one warm-up."""

    model_config = ConfigDict(frozen=True)
    workload: str
    size: int
    config: Config
    repeats: int = 3


class RunResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    workload: str
    size: int
    config: Config
    status: Status
    runtime_s: float | None = None  # median over repeats of the slowest rank's time
    runtimes_s: tuple[float, ...] = ()
    min_runtime_s: float | None = None
    spread: float | None = None  # robust relative spread: 1.4826 * MAD / median
    cv: float | None = None  # coefficient of variation (stdev / mean)
    repeats: int = 0
    throughput: float | None = None
    throughput_unit: str = ""
    items_per_s: float | None = None
    item_name: str = ""
    flops: float = 0.0
    bytes_moved: float = 0.0
    memory_bytes: int = 0  # declared footprint of the problem
    check_ok: bool | None = None
    check_error: float | None = None
    check_detail: str = ""
    peak_memory_bytes: int | None = None  # resident memory of all ranks after the timed runs
    warmup_s: float | None = None  # first (untimed) run, slowest rank: JIT + first execution
    jit_s: float | None = None  # warmup_s minus a timed run: compile and thread-pool start
    startup_s: float | None = None  # launch until the rank program was ready (shared per launch)
    command: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.OK
