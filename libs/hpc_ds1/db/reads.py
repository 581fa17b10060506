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
