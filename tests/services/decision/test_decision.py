"""The decision service against real NATS, Postgres, agent and runs: a decision with telemetry
is answered while another decision's run waits for the device (runs queue on the agent, decisions
never wait behind them), and a run past the wall-time cap is refused before anything runs, with
the estimate and how it was made."""

from __future__ import annotations

import asyncio
import time

import orjson
from sqlalchemy import Engine, func, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.subjects import status_subject
from hpc_ds1.machine.devicelock import device_lock
from hpc_ds1.settings import Settings
from hpc_ds1.stack import Stack

from .decide import GEMM, MONTECARLO, WAIT_S, decide


async def test_a_decision_with_telemetry_is_answered_while_a_run_waits_for_the_device(
    decider: tuple[Stack, str], settings: Settings
) -> None:
    stack, _ = decider
    body = {"workload": "gemm", "size": 48, "config": GEMM}
    with device_lock(settings.home):  # another job of this home holds the device
        waiting = asyncio.create_task(decide(stack, body))  # no telemetry: it runs first

        async def in_flight() -> int:
            status = status_subject(settings, "decision")
            reply = await stack.bus.nc.request(status, b"", timeout=5)
            return int(orjson.loads(reply.data)["decisions_in_flight"])

        end = time.monotonic() + WAIT_S
        while await in_flight() < 1:  # the decision service holds it, waiting for the run
            assert time.monotonic() < end and not waiting.done()
            await asyncio.sleep(0.05)
        answer = await decide(stack, {**body, "telemetry": {"runtime_s": 0.002}}, timeout=30)
        assert answer["ok"], answer
        assert answer["decision"]["ran"] is False
        assert not waiting.done()  # answered while the run still waits for the device
    ran = await waiting
    assert ran["ok"], ran
    assert ran["decision"]["ran"] is True and ran["decision"]["telemetry"]["runtime_s"] > 0


def measurements(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(tables.measurements)).scalar_one())


async def test_a_run_past_the_cap_is_refused_with_its_estimate(
    decider: tuple[Stack, str], engine: Engine
) -> None:
    stack, _ = decider
    answer = await decide(stack, {"workload": "montecarlo", "size": 10**12, "config": MONTECARLO})
    assert not answer["ok"] and answer["status"] == 422
    error = answer["error"]
    # 0.01 s at 10^6 samples scaled by the declared work (10^6 x): ~10^4 s a run, 4 runs.
    assert "montecarlo size 1000000000000 would run for about 11.1 h" in error
    assert "measured 0.01 s per run at size 1000000 (this configuration)" in error
    assert "declared work" in error and "HPC_DS1_MAX_RUN_S" in error
    await stack.caught_up()
    assert await asyncio.to_thread(measurements, engine) == 1  # the basis only: nothing ran
    # Within the cap it runs.
    small = await decide(stack, {"workload": "montecarlo", "size": 200_000, "config": MONTECARLO})
    assert small["ok"] and small["decision"]["ran"] is True, small
