"""The projection read back (its checkpoint, a table's row count, every read model's rows) and a
projector run until its checkpoint reaches a sequence. Shared by the projector tests."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import Engine, func, select

from hpc_ds1.db import tables
from hpc_ds1.services.projector import Projector


def checkpoint(engine: Engine) -> int:
    with engine.connect() as conn:
        value = conn.execute(select(tables.checkpoints.c.last_seq)).scalar()
    return int(value or 0)


def count(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    result = {}
    with engine.connect() as conn:
        for table in (*tables.READ_MODELS, tables.checkpoints):
            key = list(table.primary_key.columns)
            result[table.name] = [tuple(r) for r in conn.execute(select(table).order_by(*key))]
    return result


async def run_until(projector: Projector, engine: Engine, seq: int, timeout: float = 20.0) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    try:
        for _ in range(int(timeout / 0.05)):
            if await asyncio.to_thread(checkpoint, engine) >= seq:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"projection did not reach {seq}: at {checkpoint(engine)}")
    finally:
        stop.set()
        await task
