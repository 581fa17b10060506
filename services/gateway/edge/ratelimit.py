"""Per-address limits on what only an attacker repeats: failed authentication and joins.

A probe sent 2,000 wrong bearer tokens at 416/s (each a database lookup and a log line) and
minted 30 devices in 2 s with one join token. Here, in memory of one gateway process:

- `RateLimiter`: a token bucket per client address. `per_minute` allowances a minute, refilled
  evenly (one every 60/per_minute s), at most `per_minute` banked (the burst). Spending from an
  empty bucket is refused with the seconds until one is back (the 429's Retry-After).
- `QuietLog`: the first event per address per window is logged; the rest are counted, and the
  count is logged once the window is over (with the address's next line, or with any address's
  line after it: a flood is one line, then one summary).

Both hold at most `max_keys` addresses: past it the least recently used one is forgotten (it
starts afresh: memory stays bounded whatever the number of addresses, and an attacker with many
addresses gains no more than each address gives him anyway).

The client address is the socket's peer (`request.client.host`), replaced by a forwarded
header only for the proxies named in HPC_DS1_FORWARDED_ALLOW_IPS (uvicorn's proxy headers,
services/gateway/__init__.py)."""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable

from starlette.requests import Request

MAX_KEYS = 10_000
FORWARDED_HEADERS = ("x-forwarded-for", "forwarded", "x-real-ip")

Clock = Callable[[], float]


def client_address(request: Request) -> str:
    """The address the request came from (the socket's peer, or a trusted proxy's client)."""
    return request.client.host if request.client is not None else "unknown"


def is_loopback(host: str | None) -> bool:
    """127.0.0.0/8 or ::1 (an IPv4-mapped loopback too); anything else, or no address, is not."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


def this_machine(request: Request) -> bool:
    """The caller is on this machine: a loopback peer whose request no proxy relayed (a
    forwarded header from loopback comes through a proxy on this host that is not named in
    HPC_DS1_FORWARDED_ALLOW_IPS: its callers are anywhere)."""
    if not is_loopback(client_address(request)):
        return False
    return not any(name in request.headers for name in FORWARDED_HEADERS)


def retry_after(seconds: float) -> dict[str, str]:
    """The Retry-After header for a wait of `seconds` (whole seconds, at least 1)."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


class RateLimiter:
    """A token bucket per key; `per_minute` 0: no limit."""

    def __init__(
        self, per_minute: int, *, max_keys: int = MAX_KEYS, clock: Clock = time.monotonic
    ) -> None:
        self.per_minute = per_minute
        self.rate = per_minute / 60.0  # allowances back per second
        self.max_keys = max_keys
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # level, when

    def __len__(self) -> int:
        return len(self._buckets)

    def _level(self, key: str, now: float) -> float:
        found = self._buckets.get(key)
        if found is None:
            return float(self.per_minute)
        level, since = found
        return min(float(self.per_minute), level + (now - since) * self.rate)

    def wait(self, key: str) -> float:
        """0 when `key` has an allowance now; else the seconds until it has one. Spends nothing."""
        if self.per_minute <= 0:
            return 0.0
        level = self._level(key, self.clock())
        return 0.0 if level >= 1.0 else (1.0 - level) / self.rate

    def spend(self, key: str) -> float:
        """Spend one allowance of `key`: 0 when it had one; else nothing is spent and the
        seconds until it will have one are returned."""
        if self.per_minute <= 0:
            return 0.0
        now = self.clock()
        level = self._level(key, now)
        if level < 1.0:
            return (1.0 - level) / self.rate
        self._buckets[key] = (level - 1.0, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return 0.0


class QuietLog:
    """Whether to log an event of a key now: the first per key per `window_s`; the others are
    counted and handed back as summaries once their window is over."""

    def __init__(
        self, window_s: float = 60.0, *, max_keys: int = MAX_KEYS, clock: Clock = time.monotonic
    ) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        self.clock = clock
        # key -> [window start, events not logged]; oldest window first
        self._windows: OrderedDict[str, list[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._windows)

    def note(self, key: str) -> tuple[bool, list[tuple[str, int]]]:
        """(log this event, [(key, events not logged) of every window now over])."""
        now = self.clock()
        over: list[tuple[str, int]] = []
        while self._windows:
            first, (started, unlogged) = next(iter(self._windows.items()))
            if now - started < self.window_s and len(self._windows) < self.max_keys:
                break
            del self._windows[first]
            if unlogged:
                over.append((first, int(unlogged)))
        window = self._windows.get(key)
        if window is None:
            self._windows[key] = [now, 0]
            return True, over
        window[1] += 1
        return False, over
