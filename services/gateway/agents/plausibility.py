"""The projection's side of the runtime checks (hpc_ds1.fleet.plausible): the claimed hardware of
the reporting device, and the fleet's fastest verified runtime of each job by another device.

Verified: a runtime the coordinator saw a device produce for it, not one a device only says it
measured. That is a finished task's measurement (the task row names it, on the device it ran
on) and any measurement of the coordinator's own device (`local`: its agent is the
coordinator's). Blocking (DB): call in a thread."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, select, tuple_
from sqlalchemy.dialects.postgresql import distinct_on

from hpc_ds1.db import tables
from hpc_ds1.fleet.plausible import Verified, implausible

Key = tuple[str, int]


@dataclass(frozen=True)
class Claimed:
    """One runtime a device reports: for which job, at which configuration."""

    workload: str
    size: int
    runtime_s: float
    config: Mapping[str, Any]


def _fingerprints(conn: Any, device_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    d = tables.devices
    ids = sorted(set(device_ids))
    if not ids:
        return {}
    rows = conn.execute(select(d.c.device_id, d.c.fingerprint).where(d.c.device_id.in_(ids)))
    return {r.device_id: r.fingerprint if isinstance(r.fingerprint, dict) else {} for r in rows}


def _fastest(conn: Any, device: str, keys: list[Key]) -> dict[Key, Verified]:
    m, t, d = tables.measurements, tables.tasks, tables.devices
    good = and_(
        m.c.status == "ok",
        m.c.check_ok.is_not(False),
        m.c.runtime_s > 0,
        m.c.device_id != device,
        tuple_(m.c.workload, m.c.size).in_(keys),
    )
    columns = (m.c.workload, m.c.size, m.c.device_id, m.c.runtime_s, m.c.config)
    by_task = (
        select(*columns)
        .join(t, and_(t.c.measurement_id == m.c.measurement_id, t.c.device_id == m.c.device_id))
        .where(good, t.c.status == "finished")
    )
    by_local = select(*columns).join(d, d.c.device_id == m.c.device_id).where(good, d.c.local)
    best: dict[Key, Any] = {}
    for query in (by_task, by_local):
        query = query.ext(distinct_on(m.c.workload, m.c.size)).order_by(
            m.c.workload, m.c.size, m.c.runtime_s
        )
        for r in conn.execute(query):
            key = (r.workload, int(r.size))
            if key not in best or r.runtime_s < best[key].runtime_s:
                best[key] = r
    prints = _fingerprints(conn, (r.device_id for r in best.values()))
    return {
        key: Verified(
            r.device_id,
            float(r.runtime_s),
            r.config if isinstance(r.config, dict) else {},
            prints.get(r.device_id, {}),
        )
        for key, r in best.items()
    }


def refusals(engine: Engine, device: str, claims: list[Claimed]) -> list[str | None]:
    """For each claim, why its runtime cannot be true on `device` (its claimed hardware, the
    fleet's verified runtimes), or None."""
    if not claims:
        return []
    keys = sorted({(c.workload, c.size) for c in claims})
    with engine.connect() as conn:
        fingerprint = _fingerprints(conn, [device]).get(device, {})
        fastest = _fastest(conn, device, keys)
    return [
        implausible(
            c.workload,
            c.size,
            c.runtime_s,
            fingerprint,
            c.config,
            fastest.get((c.workload, c.size)),
        )
        for c in claims
    ]


__all__ = ["Claimed", "refusals"]
