"""The fault scenarios: each injects a real fault (`kill -9` of a real process, a cut link)
`repeat` times under load and counts, from outside, what survived and what was lost."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from sqlalchemy import select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.subjects import agent_run_subject, start_session_subject
from hpc_ds1.events import SessionFinished, SessionMoveDecided, SessionStepRun, new_id, typed
from hpc_ds1.requests import RunRequest
from hpc_ds1.settings import Settings
from hpc_ds1.workloads import get_workload

from .cluster import (
    Cluster,
    Service,
    checkpoint,
    count_rows,
    kill_marked,
    marked,
    migrated,
    rank_processes,
    stream_ids,
    wait_answering,
)
from .loads import Load
from .outcome import Outcome
from .publisher import measurement, publish_through_faults


async def _connect(cluster: Cluster, settings: Settings, name: str) -> EventBus:
    return await EventBus.connect(settings, cluster.nats_url, name)


# --- nats-server mid-stream -------------------------------------------------------------------


async def nats_server(cluster: Cluster, load: Load, repeat: int, rng: random.Random) -> Outcome:
    out = Outcome("nats-server", "kill -9 nats-server (sync always) mid-stream, restart")
    for rep in range(repeat):
        out.repeats += 1
        await _nats_once(cluster, load, rep, rng, out)
    return out


async def _nats_once(
    cluster: Cluster, load: Load, rep: int, rng: random.Random, out: Outcome
) -> None:
    settings = cluster.settings(f"n{rep}", database=False)
    bus = await _connect(cluster, settings, "faults-publisher")
    events = [measurement(settings.subject_prefix, i) for i in range(load.nats_events)]
    kill_at = rng.randint(load.nats_events // 5, load.nats_events * 3 // 5)
    reached = asyncio.Event()
    count = 0

    def on_ack(_: str) -> None:
        nonlocal count
        count += 1
        if count == kill_at:
            reached.set()

    publishing = asyncio.create_task(publish_through_faults(bus, events, window=16, on_ack=on_ack))
    await asyncio.wait(
        [publishing, asyncio.create_task(reached.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    if publishing.done():
        out.fail(rep, "the publisher finished before the kill")
    else:
        await asyncio.to_thread(cluster.kill_nats)
        out.kills += 1
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        await asyncio.to_thread(cluster.restart_nats)
    published = await publishing
    stored = Counter(await stream_ids(bus))
    lost = [i for i in published.acked if stored[i] == 0]
    dups = sum(n - 1 for n in stored.values() if n > 1)
    out.add_events(len(published.acked), sum(1 for i in published.acked if stored[i]))
    out.lost += len(lost)
    out.duplicates += dups
    if published.unacked:
        out.fail(rep, f"{len(published.unacked)} events never acknowledged after restart")
    elif not lost and not dups and published.acked:
        out.survived += 1
    if rep == 0:
        out.notes.append(
            f"publisher retries around one kill (rep 1): {published.retries} {published.errors}"
        )
    for stream in (settings.stream, settings.dead_letter_stream):
        with contextlib.suppress(Exception):
            await bus.js.delete_stream(stream)
    await bus.close()


# --- the projection: Postgres or the projector killed mid-backlog ---------------------------


def _audit_seqs(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(orjson.loads(line)["seq"]) for line in path.read_bytes().splitlines() if line]


def _projected(engine_url: str, settings: Settings) -> tuple[set[str], int, int, int]:
    """(event ids in `events`, rows in `events`, measurement rows, recorded gaps)."""
    from hpc_ds1.db import make_engine

    engine = make_engine(engine_url, pool_size=1)
    try:
        with engine.connect() as conn:
            ids = {r[0] for r in conn.execute(select(tables.events.c.event_id))}
        return (
            ids,
            count_rows(engine, tables.events),
            count_rows(engine, tables.measurements),
            count_rows(engine, tables.gaps),
        )
    finally:
        engine.dispose()


def _checkpoint_or_zero(url: str) -> int:
    from hpc_ds1.db import make_engine

    engine = make_engine(url, pool_size=1)
    try:
        return checkpoint(engine)
    except Exception:
        return -1
    finally:
        engine.dispose()


async def _wait_checkpoint(url: str, at_least: int, within_s: float) -> int:
    deadline = time.monotonic() + within_s
    while True:
        value = await asyncio.to_thread(_checkpoint_or_zero, url)
        if value >= at_least:
            return value
        if time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.02)


MORE_BACKLOGS = 3  # further backlogs published when the projector outran the kill


async def _projection(
    cluster: Cluster, load: Load, repeat: int, rng: random.Random, victim: str
) -> Outcome:
    what = {
        "postgres": "kill -9 the Postgres postmaster mid-projection, restart",
        "projector": "kill -9 the projector process mid-backlog, restart",
    }[victim]
    out = Outcome(victim, what)
    for rep in range(repeat):
        out.repeats += 1
        settings = cluster.settings(f"{victim[:2]}{rep}")
        assert settings.database_url
        url = settings.database_url
        migrated(url).dispose()
        bus = await _connect(cluster, settings, "faults-publisher")
        backlog = [measurement(settings.subject_prefix, i) for i in range(load.backlog)]
        live = [measurement(settings.subject_prefix, i, tag="live") for i in range(load.live)]
        await bus.publish_many(backlog)
        projector = cluster.spawn("projector", settings)
        kill_at = rng.randint(load.backlog // 10, load.backlog // 2)
        seen = await _wait_checkpoint(url, kill_at, 120)
        # A quick projector can fold the whole backlog between two polls of its checkpoint
        # (a busy machine delays the poll): give it another backlog and aim again, so the kill
        # still lands mid-backlog.
        for _ in range(MORE_BACKLOGS):
            if seen < len(backlog):
                break
            start = len(backlog)
            more = [measurement(settings.subject_prefix, start + i) for i in range(load.backlog)]
            kill_at = start + rng.randint(load.backlog // 10, load.backlog // 2)
            backlog += more
            await bus.publish_many(more)
            seen = await _wait_checkpoint(url, kill_at, 120)
        if seen >= len(backlog):
            out.fail(rep, f"the projector folded the backlog before the kill ({seen})")
        elif seen < kill_at:
            out.fail(rep, f"the projector never reached {kill_at} (at {seen}): {projector.tail()}")
        # Events keep arriving while the victim is down.
        publishing = asyncio.create_task(publish_through_faults(bus, live, window=8))
        if victim == "postgres":
            await asyncio.to_thread(cluster.kill_postgres)
        else:
            await asyncio.to_thread(projector.kill9)
        out.kills += 1
        await asyncio.sleep(rng.uniform(0.3, 1.5))
        if victim == "postgres":
            await asyncio.to_thread(cluster.restart_postgres)
        else:
            projector = cluster.spawn("projector", settings)
        published = await publishing
        last = await bus.last_sequence()
        reached = await _wait_checkpoint(url, last, 120)
        restarted = False
        if reached < last and not projector.alive():
            out.fail(rep, f"the projector died: {projector.tail(5)}")
            projector = cluster.spawn("projector", settings)  # to count what was stored anyway
            restarted = True
            reached = await _wait_checkpoint(url, last, 120)
        ids, rows, measured, gaps = await asyncio.to_thread(_projected, url, settings)
        acked = [e.id for e in backlog] + published.acked
        lost = [i for i in acked if i not in ids]
        seqs = _audit_seqs(settings.audit_path)
        audit_dups = len(seqs) - len(set(seqs))
        audit_missing = last - len(set(seqs) & set(range(1, last + 1)))
        out.add_events(len(acked), len(acked) - len(lost))
        out.lost += len(lost)
        out.duplicates += audit_dups + (rows - len(ids))
        out.gaps += gaps
        problems = []
        if reached < last:
            problems.append(f"checkpoint {reached} never reached the stream's end {last}")
        if rows != last:
            problems.append(f"{rows} event rows for {last} stream messages")
        if measured != len(acked):
            problems.append(f"{measured} measurement rows for {len(acked)} acknowledged events")
        if audit_missing:
            problems.append(f"{audit_missing} sequences missing from the audit file")
        if published.unacked:
            problems.append(f"{len(published.unacked)} live events never acknowledged")
        for problem in problems:
            out.fail(rep, problem)
        if not problems and not lost and not audit_dups and not gaps and not restarted:
            out.survived += 1
        projector.stop()
        await bus.close()
    return out


async def postgres(cluster: Cluster, load: Load, repeat: int, rng: random.Random) -> Outcome:
    return await _projection(cluster, load, repeat, rng, "postgres")


async def projector(cluster: Cluster, load: Load, repeat: int, rng: random.Random) -> Outcome:
    return await _projection(cluster, load, repeat, rng, "projector")


# --- the coordinator mid-session ---------------------------------------------------------------

SESSION_START = {"ranks": 1, "threads": 1, "tile": 32}


async def train_tiny_model(settings: Settings, sizes: dict[str, list[int]], repeats: int) -> str:
    """A few real runs and a model trained by the trainer service (as tests/e2e does)."""
    from hpc_ds1.eventlog.subjects import train_subject
    from hpc_ds1.machine.hardware import fingerprint
    from hpc_ds1.setup import Campaign, Profile, plan_jobs
    from hpc_ds1.space import ConfigSpace
    from hpc_ds1.stack import open_stack

    fp = fingerprint()
    chunks = []
    for name, measured in sizes.items():
        wl = get_workload(name)
        space = {name: ConfigSpace.for_device(fp, wl)}
        chunks += plan_jobs([wl], space, Profile("faults", None, repeats), measured)
    async with open_stack(settings, ("projector", "agent", "trainer"), "faults-setup") as stack:
        device_id = await stack.local_device()
        report = await Campaign(stack, device_id).run(chunks, lambda *_: None)
        if report.failed:
            raise RuntimeError(f"{report.failed} setup runs failed")
        await stack.caught_up()
        reply = await stack.bus.nc.request(
            train_subject(settings), orjson.dumps({"device_id": device_id}), timeout=600
        )
        answer = orjson.loads(reply.data)
        if not answer.get("ok"):
            raise RuntimeError(f"training failed: {answer}")
        await stack.caught_up()
    return device_id


def _launches(marker: str) -> set[int]:
    """The pids of the job launches (mpiexec) running now under `marker`."""
    found = set()
    for proc in rank_processes(marker):
        with contextlib.suppress(Exception):
            if "mpiexec" in " ".join(proc.cmdline()[:1]):
                found.add(proc.pid)
    return found


async def _session_log(bus: EventBus, session_id: str) -> list[object]:
    return [typed(env) for _, env in await bus.history("session", session_id)]


async def _tune_measurements(bus: EventBus) -> int:
    found = 0
    async for chunk in bus.replay(1, f"{bus.prefix}.measurement.>"):
        found += sum(1 for raw in chunk if orjson.loads(raw.data)["data"]["purpose"] == "tune")
    return found


async def _start_session(bus: EventBus, settings: Settings, load: Load) -> str:
    session_id = new_id()
    body = {
        "workload": "gemm",
        "size": load.session_size,
        "start": SESSION_START,
        "session_id": session_id,
        "wait_for_engineer": False,
    }
    reply = await bus.nc.request(
        start_session_subject(settings),
        orjson.dumps(body),
        timeout=60,
        headers={"Hpc-Actor": "faults"},
    )
    answer = orjson.loads(reply.data)
    if not answer.get("ok"):
        raise RuntimeError(f"the session did not start: {answer}")
    return session_id


async def _kill_during_run(
    cluster: Cluster,
    bus: EventBus,
    session_id: str,
    target: int,
    coordinator: Service,
    rng: random.Random,
) -> bool:
    """SIGKILL the coordinator while the session's `target`-th real run is on the device;
    False if the session finished first."""
    seen: set[int] = set()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        seen |= await asyncio.to_thread(_launches, cluster.marker)
        if len(seen) >= target:
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            await asyncio.to_thread(coordinator.kill9)
            return True
        log = await _session_log(bus, session_id)
        if any(isinstance(e, SessionFinished) for e in log):
            return False
        await asyncio.sleep(0.05)
    raise TimeoutError(f"session {session_id} ran nothing for 300 s")


async def coordinator(cluster: Cluster, load: Load, repeat: int, rng: random.Random) -> Outcome:
    out = Outcome("coordinator", "kill -9 the coordinator during a session step, restart")
    settings = cluster.settings("co", auto_threshold=0.0, escalate_threshold=0.0)
    assert settings.database_url
    migrated(settings.database_url).dispose()
    # These start while the model trains (the agent after: one agent per device at a time).
    services: dict[str, Service] = {
        name: cluster.spawn(name, settings) for name in ("projector", "decision", "coordinator")
    }
    started = time.monotonic()
    sizes = {name: list(sizes) for name, sizes in load.train_sizes}
    await train_tiny_model(settings, sizes, load.train_repeats)
    out.notes.append(f"tiny setup and training: {time.monotonic() - started:.0f} s")
    services["agent"] = cluster.spawn("agent", settings)
    bus = await _connect(cluster, settings, "faults-client")
    try:
        for name in services:
            await wait_answering(bus, settings, name, 120, "device_id" if name == "agent" else None)
        stepped = 0
        for rep in range(repeat):
            out.repeats += 1
            # Kill during the k-th real run of a session (1: its baseline); a session that
            # finishes before its k-th run is replaced by one killed during its baseline.
            killed, session_id = False, ""
            for target in dict.fromkeys((1 + rep % 3, 1)):
                try:
                    session_id = await _start_session(bus, settings, load)
                except RuntimeError as error:
                    out.fail(rep, str(error))
                    break
                killed = await _kill_during_run(
                    cluster, bus, session_id, target, services["coordinator"], rng
                )
                if killed:
                    break
                out.notes.append(
                    f"repetition {rep + 1}: a session finished before its run {target}; "
                    "another one was killed during its baseline"
                )
            if not killed:
                out.fail(rep, "no kill happened")
                continue
            out.kills += 1
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            services["coordinator"] = cluster.spawn("coordinator", settings)
            finished: list[SessionFinished] = []
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                log = await _session_log(bus, session_id)
                finished = [e for e in log if isinstance(e, SessionFinished)]
                if finished:
                    break
                await asyncio.sleep(0.3)
            log = await _session_log(bus, session_id)
            runs = Counter(e.step for e in log if isinstance(e, SessionStepRun))
            moves = Counter(e.step for e in log if isinstance(e, SessionMoveDecided))
            stepped += sum(1 for e in log if isinstance(e, SessionStepRun) and e.measurement_id)
            dups = sum(n - 1 for n in runs.values() if n > 1)
            dups += sum(n - 1 for n in moves.values() if n > 1)
            dups += max(len(finished) - 1, 0)
            out.duplicates += dups
            if not finished:
                out.fail(rep, f"the session never finished: {services['coordinator'].tail(5)}")
                continue
            if finished[0].reason == "failed":
                out.fail(rep, f"the session finished failed: {finished[0].detail}")
                continue
            if dups == 0:
                out.survived += 1
        tuned = await _tune_measurements(bus)
        out.notes.append(
            f"{tuned} real runs measured for {stepped} step events: a run in flight at the kill "
            "is run again by the restarted coordinator (the first one's measurement stays in "
            "the log, the step event is written once)"
        )
    finally:
        await bus.close()
        for service in services.values():
            service.stop()
    return out


# --- an agent mid-job --------------------------------------------------------------------------


def lock_free(home: Path) -> bool:
    path = home / "device.lock"
    if not path.exists():
        return True
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
    return True


async def _ask_agent(bus: EventBus, subject: str, request: RunRequest) -> Msg:
    """Request a run; an agent that answers its status but does not listen yet (it is still
    sweeping a job its killed predecessor left) is waited for, as the coordinator does."""
    for _ in range(600):
        try:
            return await bus.nc.request(subject, request.model_dump_json().encode(), timeout=120)
        except NoRespondersError:
            await asyncio.sleep(0.1)
    raise TimeoutError(f"no agent listened on {subject} for 60 s")


async def agent(cluster: Cluster, load: Load, repeat: int, rng: random.Random) -> Outcome:
    out = Outcome("agent", "kill -9 the agent while its job's ranks run")
    settings = cluster.settings("ag")
    assert settings.database_url
    migrated(settings.database_url).dispose()
    bus = await _connect(cluster, settings, "faults-caller")
    try:
        for rep in range(repeat):
            out.repeats += 1
            marker = f"{cluster.marker}-agent{rep}"
            service = cluster.spawn("agent", settings, marker=marker)
            facts = await wait_answering(bus, settings, "agent", 120, fact="device_id")
            request = RunRequest(
                workload="montecarlo",
                size=load.montecarlo_size,
                config={"ranks": 2, "threads": 1, "tile": get_workload("montecarlo").default_tile},
                repeats=5,
                actor="faults",
            )
            caller = asyncio.create_task(
                _ask_agent(bus, agent_run_subject(settings, facts["device_id"]), request)
            )
            deadline = time.monotonic() + 120
            ranks: list[object] = []
            while time.monotonic() < deadline and not caller.done():
                ranks = [
                    p
                    for p in await asyncio.to_thread(rank_processes, marker)
                    if "hpc_ds1.runner.rank" in " ".join(p.cmdline())
                ]
                if ranks:
                    break
                await asyncio.sleep(0.05)
            if not ranks:
                early = "still waiting"
                if caller.done():
                    early = repr(caller.exception() or orjson.loads(caller.result().data))
                out.fail(rep, f"the job's ranks never ran; the caller got: {early[:300]}")
                caller.cancel()
                service.stop()
                kill_marked(marker)
                continue
            await asyncio.sleep(rng.uniform(0.0, 0.5))
            await asyncio.to_thread(service.kill9)
            out.kills += 1
            grace = time.monotonic() + load.orphan_grace_s
            left = await asyncio.to_thread(marked, marker)
            while left and time.monotonic() < grace:
                await asyncio.sleep(0.1)
                left = await asyncio.to_thread(marked, marker)
            freed = await asyncio.to_thread(lock_free, settings.home)
            orphans = len(left)
            out.orphans += orphans
            if orphans:
                names = sorted({p.name() for p in left if p.is_running()})
                out.fail(
                    rep,
                    f"{orphans} job processes ({', '.join(names)}) still alive "
                    f"{load.orphan_grace_s:g} s after the agent died",
                )
                kill_marked(marker)
            if not freed:
                out.fail(rep, "device.lock still held after the agent died")
            answer = "no reply"
            try:
                reply = await asyncio.wait_for(caller, 1.0)
                body = orjson.loads(reply.data)
                answer = "ok" if body.get("ok") else f"error: {body.get('error')}"
            except TimeoutError:
                caller.cancel()
            except Exception as error:
                answer = type(error).__name__
            if answer == "ok":
                out.fail(rep, "the caller got a success for a job killed mid-run")
            if rep == 0:
                out.notes.append(f"the caller's answer for a killed job: {answer}")
            if not orphans and freed and answer != "ok":
                out.survived += 1
    finally:
        await bus.close()
    return out


Scenario = Callable[[Cluster, Load, int, random.Random], Awaitable[Outcome]]
