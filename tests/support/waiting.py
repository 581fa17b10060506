"""Waiting for a condition, with one message when it does not come: what was awaited, for how
long, and the last value seen (plus `context()`, e.g. a server's log)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any


def wait_for(
    what: str,
    check: Callable[[], Any],
    within_s: float = 60.0,
    every_s: float = 0.1,
    context: Callable[[], str] | None = None,
) -> Any:
    """The first truthy value of `check()`; AssertionError after `within_s`."""
    deadline = time.monotonic() + within_s
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(_message(what, within_s, last, context))
        time.sleep(every_s)


async def until(
    what: str,
    check: Callable[[], Any] | Callable[[], Awaitable[Any]],
    within_s: float = 60.0,
    every_s: float = 0.05,
    context: Callable[[], str] | None = None,
) -> Any:
    """`wait_for` on the event loop: `check` may be a coroutine function."""
    deadline = time.monotonic() + within_s
    last: Any = None
    while True:
        last = check()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(_message(what, within_s, last, context))
        await asyncio.sleep(every_s)


def _message(what: str, within_s: float, last: Any, context: Callable[[], str] | None) -> str:
    extra = context() if context is not None else ""
    return f"{what}: not within {within_s:g} s (last: {last!r}){extra}"
