"""One active copy of a single-active service: a second waits as a standby naming the active one,
takes over when it goes, and an active copy whose lock another took meanwhile stops."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from sqlalchemy import text

from hpc_ds1.process import leader
from hpc_ds1.process.leader import LeadershipLost, Lease, single_active, watch
from hpc_ds1.settings import Settings


async def test_a_second_copy_waits_then_takes_over(
    settings: Settings, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leader, "TAKEOVER_GRACE_S", 0.2)
    monkeypatch.setattr(leader, "STANDBY_POLL_S", 0.1)
    name = leader.lock_name(settings, "projector")
    first_stop, second_stop = asyncio.Event(), asyncio.Event()
    active: list[str] = []

    async def copy(label: str, stop: asyncio.Event, release: asyncio.Event) -> None:
        async with single_active("projector", name, database_url, stop) as lease:
            if lease is not None:
                active.append(label)
                await release.wait()

    release_first, release_second = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(copy("first", first_stop, release_first))
    for _ in range(200):
        if active == ["first"]:
            break
        await asyncio.sleep(0.05)
    assert active == ["first"]
    second = asyncio.create_task(copy("second", second_stop, release_second))
    probe = Lease(database_url, "probe", name)
    try:
        assert not await asyncio.to_thread(probe.try_acquire)
        holder = await asyncio.to_thread(probe.holder)
        assert holder is not None and holder.startswith("hpc-ds1 projector pid ")
    finally:
        await asyncio.to_thread(probe.release)
    await asyncio.sleep(0.5)
    assert active == ["first"]  # the second waits while the first is active
    release_first.set()
    await first
    for _ in range(100):
        if active == ["first", "second"]:
            break
        await asyncio.sleep(0.05)
    assert active == ["first", "second"]
    release_second.set()
    await second
    # Stopped while waiting: a standby yields None and ends.
    holder_stop = asyncio.Event()
    async with single_active("projector", name, database_url, holder_stop) as held:
        assert held is not None
        stop = asyncio.Event()
        stop.set()
        async with single_active("projector", name, database_url, stop) as standby:
            assert standby is None


async def test_an_active_copy_whose_lock_was_taken_stops(
    settings: Settings, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leader, "CHECK_S", 0.1)
    name = leader.lock_name(settings, "coordinator")
    lease = Lease(database_url, "coordinator", name)
    other = Lease(database_url, "coordinator", name)
    try:
        assert await asyncio.to_thread(lease.try_acquire)
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(lease, stop))
        await asyncio.sleep(0.3)
        assert not watcher.done()  # still held: it carries on
        # The connection breaks (Postgres restarted, say) and another copy takes the lock.
        assert lease._conn is not None
        backend = lease._conn.execute(text("SELECT pg_backend_pid()")).scalar()
        assert await asyncio.to_thread(other.try_acquire) is False
        other._conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": backend})  # type: ignore[union-attr]
        for _ in range(100):
            if await asyncio.to_thread(other.try_acquire):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the lock was not free after its connection was terminated")
        with pytest.raises(LeadershipLost, match="lost its lock"):
            await asyncio.wait_for(watcher, 10)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(other.release)
        await asyncio.to_thread(lease.release)
