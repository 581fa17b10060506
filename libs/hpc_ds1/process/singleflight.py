"""One call in flight per key: concurrent callers asking for the same key while it runs share
its result (Go's singleflight). A cache's entry that expires under load otherwise sends every
waiting request to the database at once, each on its own pooled connection, and the pool opens
new ones past its size (a connection with scram authentication costs milliseconds of CPU)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._running: dict[Hashable, asyncio.Future[T]] = {}

    async def do(self, key: Hashable, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`'s result, or that of the call for `key` already running. A caller that is
        cancelled does not cancel the call the others wait on."""
        running = self._running.get(key)
        if running is None:
            running = asyncio.ensure_future(call())
            self._running[key] = running
            running.add_done_callback(lambda _: self._running.pop(key, None))
        return await asyncio.shield(running)

    def running(self, key: Hashable) -> bool:
        """Whether a call for `key` is in flight (a `do` now would join it)."""
        return key in self._running

    @property
    def in_flight(self) -> int:
        return len(self._running)
