"""A real run's result as the event that records it."""

from __future__ import annotations

from hpc_ds1.events import MeasurementRecorded, new_id
from hpc_ds1.runner import RunResult
from hpc_ds1.space import Config


def config_key(config: Config) -> str:
    """A short, subject-safe name of a configuration, e.g. r2-t1-k128-cpu."""
    return f"r{config.ranks}-t{config.threads}-k{config.tile}-{'gpu' if config.gpu else 'cpu'}"


def measurement_event(
    result: RunResult,
    device_id: str,
    purpose: str,
    measurement_id: str | None = None,
    held_out: bool = False,
) -> MeasurementRecorded:
    return MeasurementRecorded(
        measurement_id=measurement_id or new_id(),
        device_id=device_id,
        workload=result.workload,
        size=result.size,
        config=result.config.model_dump(),
        status=result.status.value,
        runtime_s=result.runtime_s,
        throughput=result.throughput,
        throughput_unit=result.throughput_unit,
        repeats=max(1, result.repeats),
        spread=result.spread,
        check_ok=result.check_ok,
        check_error=result.check_error,
        held_out=held_out,
        purpose=purpose,
    )
