"""The setup campaign for real: tiny sizes, every configuration of this machine's space."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from hpc_ds1.db import tables
from hpc_ds1.hardware import fingerprint
from hpc_ds1.settings import Settings
from hpc_ds1.setup import PROFILES, Campaign, plan_jobs
from hpc_ds1.space import ConfigSpace
from hpc_ds1.stack import open_stack
from hpc_ds1.workloads import get_workload

TINY = {"gemm": [48, 64], "montecarlo": [20_000]}


def chunks() -> list:
    fp = fingerprint()
    out = []
    for name, sizes in TINY.items():
        wl = get_workload(name)
        out += plan_jobs([wl], {name: ConfigSpace.for_device(fp, wl)}, PROFILES["quick"], sizes)
    return out


class Interrupted(Exception):
    pass


async def test_setup_records_every_run_and_resumes_after_an_interruption(
    settings: Settings,
) -> None:
    plan = chunks()
    planned = sum(len(c) for c in plan)
    assert planned == 3 * len(ConfigSpace.for_device(fingerprint(), "gemm").configs())
    calls: list[int] = []

    def stop_after_first_chunk(done: int, total: int, label: str) -> None:
        calls.append(done)
        if done >= len(plan[0]):
            raise Interrupted

    async with open_stack(settings, ("projector", "agent"), "test-setup") as stack:
        device = await stack.local_device()
        with pytest.raises(Interrupted):
            await Campaign(stack, device).run(plan, stop_after_first_chunk)
        await stack.caught_up()
        second = await Campaign(stack, device).run(plan, lambda *_: None)
        assert (second.skipped, second.measured) == (len(plan[0]), planned - len(plan[0]))
        await stack.caught_up()
        third = await Campaign(stack, device).run(plan, lambda *_: None)
        assert (third.skipped, third.measured) == (planned, 0)
        await stack.caught_up()
        with stack.engine.connect() as conn:
            t = tables.measurements
            rows = conn.execute(
                select(t.c.workload, t.c.size, t.c.status, func.count())
                .group_by(t.c.workload, t.c.size, t.c.status)
                .order_by(t.c.workload, t.c.size)
            ).all()
            spreads = conn.execute(select(func.count()).where(t.c.spread.is_not(None))).scalar()
    per_size = len(plan[0])
    assert [tuple(r) for r in rows] == [
        ("gemm", 48, "ok", per_size),
        ("gemm", 64, "ok", per_size),
        ("montecarlo", 20_000, "ok", per_size),
    ]
    assert spreads == planned  # every result carries its measured noise
