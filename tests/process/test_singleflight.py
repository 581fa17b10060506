"""SingleFlight: concurrent callers of one key share one call; the next call after it ends runs
anew; a cancelled caller leaves the call to the others; an error reaches every caller."""

from __future__ import annotations

import asyncio

import pytest

from hpc_ds1.process.singleflight import SingleFlight


async def test_concurrent_callers_of_one_key_share_one_call() -> None:
    flights: SingleFlight[int] = SingleFlight()
    calls = 0
    release = asyncio.Event()

    async def lookup() -> int:
        nonlocal calls
        calls += 1
        await release.wait()
        return 42

    waiting = [asyncio.create_task(flights.do("k", lookup)) for _ in range(8)]
    other = asyncio.create_task(flights.do("other", lookup))
    await asyncio.sleep(0)
    assert flights.in_flight == 2
    release.set()
    assert await asyncio.gather(*waiting, other) == [42] * 9
    assert calls == 2 and flights.in_flight == 0
    assert await flights.do("k", lookup) == 42 and calls == 3  # ended: the next one runs anew


async def test_a_cancelled_caller_does_not_cancel_the_others_call() -> None:
    flights: SingleFlight[str] = SingleFlight()
    release = asyncio.Event()

    async def lookup() -> str:
        await release.wait()
        return "found"

    first = asyncio.create_task(flights.do("k", lookup))
    second = asyncio.create_task(flights.do("k", lookup))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await second == "found"
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_an_error_reaches_every_caller_and_is_not_kept() -> None:
    flights: SingleFlight[int] = SingleFlight()
    release = asyncio.Event()

    async def failing() -> int:
        await release.wait()
        raise OSError("database unreachable")

    waiting = [asyncio.create_task(flights.do("k", failing)) for _ in range(3)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(r, OSError) for r in results)

    async def working() -> int:
        return 7

    assert await flights.do("k", working) == 7
