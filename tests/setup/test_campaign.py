"""The setup campaign for real: tiny sizes, every configuration of this machine's space."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from hpc_ds1.db import tables
from hpc_ds1.machine.hardware import fingerprint
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


async def test_a_cancelled_campaign_starts_no_launch_after_the_one_that_runs(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (asyncio.run cancels the task) while a chunk measures in its thread: the thread
    cannot be cancelled and asyncio.run waits for it; it stops before its next launch."""
    import asyncio
    import threading
    import time

    import hpc_ds1.setup.campaign as campaign_module
    from hpc_ds1.runner import RunResult
    from hpc_ds1.runner.result import Status

    launches: list[float] = []
    first_launch = threading.Event()

    def slow_launches(timeout_s: float, cancel: threading.Event | None = None, on_start=None):  # type: ignore[no-untyped-def]
        def run(jobs):  # type: ignore[no-untyped-def]
            launches.append(time.monotonic())
            first_launch.set()
            assert cancel is not None  # the campaign hands its stop to the launches
            cancel.wait(0.5)  # a launch killed when the campaign is cancelled
            return [
                RunResult(
                    workload=j.workload,
                    size=j.size,
                    config=j.config,
                    status=Status.OK,
                    runtime_s=0.5,
                    runtimes_s=(0.5,),
                    repeats=1,
                )
                for j in jobs
            ]

        return run

    monkeypatch.setattr(campaign_module, "run_jobs", slow_launches)
    plan = chunks()[:1]
    async with open_stack(settings, ("projector", "agent"), "test-setup-cancel") as stack:
        device = await stack.local_device()
        task = asyncio.create_task(Campaign(stack, device).run(plan, lambda *_: None))
        await asyncio.to_thread(first_launch.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(2.0)  # four more launches' time, had the thread gone on
    assert len(launches) == 1
