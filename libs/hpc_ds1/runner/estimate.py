"""How long a run would take, before it starts: the wall-time cap refuses what would run past it.

A run is one warm-up and `repeats` timed runs. The time of one is estimated from the nearest
measured size of the same workload on the same device (the same configuration when it was
measured), scaled by the workload's declared work per size; without a measurement, from the
device's model. The estimate says how it was made, so a refusal can explain itself."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hpc_ds1.runner.checks import InvalidJob
from hpc_ds1.space import Config
from hpc_ds1.workloads import Work, Workload

CAP_SETTING = "HPC_DS1_MAX_RUN_S"


class RunTooLong(InvalidJob):
    """A run whose expected duration exceeds the wall-time cap: refused before it starts."""


@dataclass(frozen=True)
class RuntimeEstimate:
    per_run_s: float  # one timed run
    runs: int  # warm-up + repeats
    how: str

    @property
    def total_s(self) -> float:
        return self.per_run_s * self.runs


@dataclass(frozen=True)
class Measured:
    size: int
    config: Config
    runtime_s: float


def _amount(work: Work) -> tuple[str, float]:
    if work.flops > 0:
        return "flops", work.flops
    if work.bytes_moved > 0:
        return "bytes moved", work.bytes_moved
    return "items", work.items


def _seconds(value: float) -> str:
    if value >= 7200:
        return f"{value / 3600:.3g} h"
    if value >= 120:
        return f"{value / 60:.3g} min"
    return f"{value:.3g} s"


def from_measurements(
    workload: Workload,
    size: int,
    config: Config,
    measured: Iterable[Measured],
    repeats: int,
) -> RuntimeEstimate | None:
    """The nearest measured size (in log size; this configuration's measurements if it has
    any), scaled by the work ratio; None without a usable measurement."""
    usable = [m for m in measured if m.runtime_s > 0 and m.size > 0]
    same = [m for m in usable if m.config == config]
    pool = same or usable
    if not pool:
        return None
    nearest = min(pool, key=lambda m: (abs(math.log(m.size / size)), -m.size))
    kind, want = _amount(workload.work(size))
    _, have = _amount(workload.work(nearest.size))
    ratio = want / have if have > 0 else size / nearest.size
    which = "this configuration" if same else f"configuration {nearest.config.label()}"
    how = (
        f"scaled from the measured {_seconds(nearest.runtime_s)} per run at size "
        f"{nearest.size} ({which}) by the workload's declared work ({kind}: {ratio:.3g}x)"
    )
    return RuntimeEstimate(nearest.runtime_s * ratio, repeats + 1, how)


def from_model(per_run_s: float, repeats: int, model_version: str) -> RuntimeEstimate:
    how = f"predicted by the device's model {model_version}"
    return RuntimeEstimate(per_run_s, repeats + 1, how)


def check_cap(
    estimate: RuntimeEstimate | None, cap_s: float, workload: str, size: int
) -> RuntimeEstimate | None:
    """RunTooLong when the estimate exceeds `cap_s`, with the estimate and how it was made."""
    if estimate is None or estimate.total_s <= cap_s:
        return estimate
    raise RunTooLong(
        f"{workload} size {size} would run for about {_seconds(estimate.total_s)} "
        f"(one warm-up and {estimate.runs - 1} timed runs of about "
        f"{_seconds(estimate.per_run_s)} each; {estimate.how}), past the cap of {cap_s:g} s "
        f"on one run ({CAP_SETTING}): choose a smaller size, or send the runtime you observed "
        "as telemetry to decide without running"
    )


def measured_rows(rows: Iterable[Mapping[str, Any]]) -> list[Measured]:
    """Measurement rows (size, config, status, runtime_s) as Measured, successful runs only."""
    out = []
    for row in rows:
        runtime = row.get("runtime_s")
        if row.get("status") != "ok" or runtime is None or runtime <= 0:
            continue
        try:
            config = Config.model_validate(row["config"])
        except (ValueError, KeyError, TypeError):
            continue
        out.append(Measured(int(row["size"]), config, float(runtime)))
    return out


def load_measured(engine: Any, device_id: str, workload: str) -> list[Measured]:
    """The successful measurements of `workload` on `device_id`, from the read model."""
    from sqlalchemy import select

    from hpc_ds1.db import tables

    t = tables.measurements
    query = select(t.c.size, t.c.config, t.c.status, t.c.runtime_s).where(
        t.c.device_id == device_id, t.c.workload == workload, t.c.status == "ok"
    )
    with engine.connect() as conn:
        return measured_rows(dict(r._mapping) for r in conn.execute(query))
