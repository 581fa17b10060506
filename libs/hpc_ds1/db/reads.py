"""Small reads of the projection that several services make."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select

from . import tables


def latest_model(engine: Engine, device_id: str) -> tuple[str, str] | None:
    """The device's newest model: (version, artifact key), or None before its first."""
    t = tables.models
    with engine.connect() as conn:
        row = conn.execute(
            select(t.c.model_version, t.c.artifact)
            .where(t.c.device_id == device_id)
            .order_by(t.c.seq.desc())
            .limit(1)
        ).first()
    return None if row is None else (row[0], row[1])


def load_measurements(engine: Engine, device_id: str) -> list[dict[str, Any]]:
    """Every measurement of the device, in log order (the trainer's input)."""
    t = tables.measurements
    with engine.connect() as conn:
        rows = conn.execute(select(t).where(t.c.device_id == device_id).order_by(t.c.seq))
        return [dict(r._mapping) for r in rows]


def sibling_runs(
    engine: Engine, workloads: list[str], size: int, device_id: str
) -> dict[tuple[str, str], list[tuple[dict[str, Any], str, float | None]]]:
    """What the fleet measured of `workloads` at `size` on devices other than `device_id`, and
    of any other workload in `workloads` on this device too (a recorded GPU stands for a
    device of its own): per (device, workload), every run's (config, status, seconds). The
    warm start of `setup --budget --warm` reads it (setup/warm.py)."""
    t = tables.measurements
    own = workloads[0] if workloads else None
    query = select(t.c.device_id, t.c.workload, t.c.config, t.c.status, t.c.runtime_s).where(
        t.c.workload.in_(workloads), t.c.size == size
    )
    found: dict[tuple[str, str], list[tuple[dict[str, Any], str, float | None]]] = {}
    with engine.connect() as conn:
        for row in conn.execute(query.order_by(t.c.seq)):
            if row.device_id == device_id and row.workload == own:
                continue  # this device's own runs are the setup's, not a sibling's
            found.setdefault((row.device_id, row.workload), []).append(
                (dict(row.config), row.status, row.runtime_s)
            )
    return found


def measured_cells(engine: Engine, workloads: list[str]) -> dict[tuple[str, str], set[int]]:
    """Per (device, workload) of `workloads`, the sizes it has an ok run of: what a warm
    session (`tune --warm`) can start from, and whether its own device measured the job."""
    t = tables.measurements
    query = (
        select(t.c.device_id, t.c.workload, t.c.size)
        .where(t.c.workload.in_(workloads), t.c.status == "ok")
        .distinct()
    )
    found: dict[tuple[str, str], set[int]] = {}
    with engine.connect() as conn:
        for row in conn.execute(query):
            found.setdefault((row.device_id, row.workload), set()).add(int(row.size))
    return found


def fleet_names(engine: Engine) -> tuple[set[str], set[str]]:
    """Every device that joined and every workload any device measured: what `--warm-from`
    may name."""
    devices, measurements = tables.devices, tables.measurements
    with engine.connect() as conn:
        ids = {r[0] for r in conn.execute(select(devices.c.device_id))}
        ran = conn.execute(select(measurements.c.device_id, measurements.c.workload).distinct())
        pairs = [(r[0], r[1]) for r in ran]
    return ids | {d for d, _ in pairs}, {w for _, w in pairs}
