"""The agent against real NATS, Postgres and processes: requests are accepted while a run holds
the device and run in the order they came; every request is answered (bad input, an OSError, a
run past the cap, a measurement that cannot be recorded); a failed publish is retried with the
same event id; SIGTERM kills the running job and the process exits, leaving nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
from nats.errors import NoRespondersError
from sqlalchemy import Engine, func, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog import bus as hpc_bus
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import agent_run_subject
from hpc_ds1.events import MeasurementRecorded, envelope
from hpc_ds1.machine.devicelock import device_lock
from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.measure import publish_retrying
from hpc_ds1.requests import RunRequest
from hpc_ds1.runner.procs import MARKER_VAR
from hpc_ds1.services.agent import jobs as agent_jobs
from hpc_ds1.services.agent.jobs import sweep_leftovers
from hpc_ds1.settings import Settings
from hpc_ds1.stack import Stack, open_stack
from hpc_ds1.workloads import command_workload, get_workload, register, unregister
from tests.support.commands import HPC_DS1
from tests.support.waiting import until

WAIT_S = 90.0
ONE_RANK = {"ranks": 1, "threads": 1, "tile": 1}
MONTECARLO = {**ONE_RANK, "tile": get_workload("montecarlo").default_tile}


def ask(workload: str, size: int, config: dict[str, Any] | None = None) -> bytes:
    request = RunRequest(workload=workload, size=size, config=config or ONE_RANK, repeats=1)
    return request.model_dump_json().encode()


@pytest.fixture
async def agent(settings: Settings, engine: Engine) -> AsyncIterator[tuple[Stack, str]]:
    async with open_stack(settings, ("projector", "agent"), "test-agent") as stack:
        yield stack, await stack.local_device()


@pytest.fixture
def order_log(tmp_path: Path) -> Any:
    """A command workload that appends its size to a file on every run (warm-up included)."""
    path = tmp_path / "order.txt"
    body = (
        f"import sys; open({str(path)!r}, 'a').write(sys.argv[1] + chr(10)); "
        "print('runtime_s=1e-3')"
    )
    wl = command_workload("test-order", f"{sys.executable} -c {body!r} {{size}}")
    register(wl, replace=True)
    yield path
    unregister(wl.name)


async def test_requests_are_answered_while_a_run_holds_the_device_and_run_in_order(
    agent: tuple[Stack, str], settings: Settings, order_log: Path
) -> None:
    stack, device_id = agent
    nc = stack.bus.nc
    subject = agent_run_subject(settings, device_id)
    inbox = nc.new_inbox()
    replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def collect(msg: Any) -> None:
        await replies.put(orjson.loads(msg.data))

    sub = await nc.subscribe(inbox, cb=collect)
    try:
        with device_lock(settings.home):  # a run of another process of this home holds it
            for size in (3, 1, 2):  # one connection: the agent receives them in this order
                await nc.publish(subject, ask("test-order", size), reply=inbox)
            # Bad input is answered at once, not after the runs queued before it.
            refused = await nc.request(subject, ask("no-such-workload", 1), timeout=30)
            answer = orjson.loads(refused.data)
            assert not answer["ok"] and answer["status"] == 422
            assert "no-such-workload" in answer["error"]
            assert replies.empty()  # nothing ran: the device is held
            assert not await asyncio.to_thread(order_log.exists)
        got = [await asyncio.wait_for(replies.get(), WAIT_S) for _ in range(3)]
    finally:
        await sub.unsubscribe()
    assert all(r["ok"] and r["result"]["status"] == "ok" for r in got), got
    ran = await asyncio.to_thread(order_log.read_text)
    assert ran.split() == ["3", "3", "1", "1", "2", "2"]


async def test_an_oserror_is_answered(agent: tuple[Stack, str], settings: Settings) -> None:
    stack, device_id = agent
    lock = settings.home / "device.lock"
    lock.unlink(missing_ok=True)
    lock.mkdir(parents=True)  # opening the lock fails: an OSError
    reply = await stack.bus.nc.request(
        agent_run_subject(settings, device_id), ask("montecarlo", 10_000, MONTECARLO), timeout=30
    )
    answer = orjson.loads(reply.data)
    assert not answer["ok"] and answer["status"] == 500
    assert "IsADirectoryError" in answer["error"]


def measurements(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(tables.measurements)).scalar_one())


async def test_a_run_past_the_cap_is_refused_before_it_starts(
    agent: tuple[Stack, str], settings: Settings, engine: Engine
) -> None:
    stack, device_id = agent
    measured = MeasurementRecorded(
        measurement_id="m-basis",
        device_id=device_id,
        workload="montecarlo",
        size=1_000_000,
        config=MONTECARLO,
        status="ok",
        runtime_s=0.01,
        repeats=3,
    )
    await stack.bus.publish(
        envelope(measured, actor="test", source="test", prefix=stack.bus.prefix)
    )
    await stack.caught_up()
    reply = await stack.bus.nc.request(
        agent_run_subject(settings, device_id),
        ask("montecarlo", 10**12, MONTECARLO),
        timeout=30,
    )
    answer = orjson.loads(reply.data)
    assert not answer["ok"] and answer["status"] == 422
    error = answer["error"]
    assert "HPC_DS1_MAX_RUN_S" in error and "size 1000000" in error and "declared work" in error
    await stack.caught_up()
    assert await asyncio.to_thread(measurements, engine) == 1  # the basis only: nothing ran


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Publish retries in fractions of a second, not the production's tens of seconds."""
    monkeypatch.setattr(hpc_bus, "PUBLISH_RETRY_S", 0.3)
    monkeypatch.setattr(agent_jobs, "PUBLISH_RETRY_DELAYS_S", (0.1, 0.1))


@pytest.mark.usefixtures("quick_retries")
async def test_a_measurement_that_cannot_be_recorded_is_answered_with_the_result(
    settings: Settings, engine: Engine, order_log: Path
) -> None:
    async with open_stack(settings, ("agent",), "test-agent") as stack:  # no projector
        device_id = fingerprint().device_id
        subject = agent_run_subject(settings, device_id)

        async def registered() -> bool:
            return await stack.bus.last_sequence() >= 1

        await until("the agent registered its device", registered, within_s=WAIT_S)
        await stack.bus.js.delete_stream(settings.stream)  # every publish now fails
        reply = await stack.bus.nc.request(subject, ask("test-order", 5), timeout=WAIT_S)
    answer = orjson.loads(reply.data)
    assert not answer["ok"] and answer["status"] == 503
    assert "could not be recorded after 3 attempts" in answer["error"]
    assert answer["result"]["status"] == "ok"  # the run itself is not lost to the caller
    assert (await asyncio.to_thread(order_log.read_text)).split() == ["5", "5"]


@pytest.mark.usefixtures("quick_retries")
async def test_a_failed_publish_is_retried_with_the_same_event_id(
    settings: Settings, bus: EventBus
) -> None:
    await bus.js.delete_stream(settings.stream)
    event = MeasurementRecorded(
        measurement_id="m-retried",
        device_id="d1",
        workload="gemm",
        size=48,
        config={"ranks": 1, "threads": 1, "tile": 16},
        status="ok",
        runtime_s=0.01,
    )
    env = envelope(event, actor="test", source="test", prefix=settings.subject_prefix)
    failures: list[Exception] = []

    async def restore(attempt: int, error: Exception) -> None:
        failures.append(error)
        await bus.ensure_streams()

    seq = await publish_retrying(bus, env, (0.0, 0.0), on_retry=restore)
    assert len(failures) == 1 and seq == 1
    assert await publish_retrying(bus, env) == 1  # the same id again: stored once
    stored = await bus.js.get_msg(settings.stream, seq)
    assert orjson.loads(stored.data)["id"] == env.id
    assert (await bus.js.stream_info(settings.stream)).state.messages == 1


def command_line(process: psutil.Process) -> str:
    """The process's command line; empty once it has exited (a short-lived helper the job
    started may be a zombie or gone by the time it is read)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def service_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(
        HPC_DS1_HOME=str(settings.home),
        HPC_DS1_NATS_URL=str(settings.nats_url),
        HPC_DS1_DATABASE_URL=str(settings.database_url),
        HPC_DS1_STREAM=settings.stream,
        HPC_DS1_SUBJECT_PREFIX=settings.subject_prefix,
        HPC_DS1_LOG_LEVEL="warning",
    )
    return env


async def test_sigterm_kills_the_running_job_and_the_agent_exits(
    settings: Settings, engine: Engine, bus: EventBus
) -> None:
    proc = subprocess.Popen(  # noqa: ASYNC220  (the test waits for it in a thread)
        [HPC_DS1, "service", "agent"], env=service_env(settings), stdin=subprocess.DEVNULL
    )
    job: list[psutil.Process] = []
    running: asyncio.Task[Any] | None = None
    try:
        nc = bus.nc
        subject = agent_run_subject(settings, fingerprint().device_id)

        async def run_for_hours() -> Any:  # only the stop can end this run
            while True:
                try:
                    return await nc.request(subject, ask("montecarlo", 10**12, MONTECARLO), WAIT_S)
                except NoRespondersError:  # the agent has not subscribed yet
                    assert proc.poll() is None, "the agent exited"
                    await asyncio.sleep(0.1)

        running = asyncio.create_task(run_for_hours())

        async def ranks_running() -> bool:
            nonlocal job
            job = psutil.Process(proc.pid).children(recursive=True)
            return any("hpc_ds1.runner.rank" in command_line(p) for p in job)

        await until("the job's rank runs", ranks_running, within_s=WAIT_S)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, WAIT_S) == 0
        answer = orjson.loads((await running).data)
        assert not answer["ok"] and "stopping" in answer["error"]
        assert not [p.pid for p in job if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        with device_lock(settings.home, timeout=0.5):  # free at once
            pass
    finally:
        proc.kill()
        if running is not None:
            running.cancel()
        for p in job:
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_an_agent_starting_kills_a_job_left_on_record(tmp_path: Path) -> None:
    """A job whose runner and guard both died is on record in the lock file: the agent's start
    kills it; while the device is held by someone, nothing is touched."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, MARKER_VAR: "left-behind"}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], env=env)
    try:
        with device_lock(home):  # its holder's record, then the holder dies
            (home / "device.lock").write_text("left-behind")
            sweep_leftovers(home)  # busy: returns at once
            assert orphan.poll() is None
        sweep_leftovers(home)
        assert orphan.wait(WAIT_S) == -signal.SIGKILL
        assert (home / "device.lock").read_text() == ""
    finally:
        orphan.kill()
