"""The gateway's memory of recently seen tokens, so a request does not cost a Postgres lookup.

Every API call carries a token; looking it up in the tokens table took a thread hop, a pooled
connection and a query on every request (the largest part of the gateway's time per
`POST /v1/decide` in the profile, docs/performance.md). Here a token's principal is kept for
`ttl_s` after a lookup found it active, and only while revocation can reach this gateway at once:

- every `token.revoked` event reaches the gateway on a core NATS subscription as it is
  appended, before the projector has folded it; its token id is refused from then on, cached
  or not (a lookup under way when the event comes is refused too);
- nothing is served from memory while the NATS connection is down, and everything kept is
  forgotten when it comes back (events sent meanwhile may have been missed);
- an entry is looked up again after `ttl_s` (HPC_DS1_TOKEN_CACHE_S, 2 s; 0 turns the cache
  off) anyway, so a revocation that never came as an event (a row changed in Postgres by hand)
  takes effect within it.

A token found unknown or revoked is remembered as refused (by its SHA-256, at most
MAX_REFUSED of them, the oldest forgotten first) for `refused_s` (the same HPC_DS1_TOKEN_CACHE_S),
so a flood of one wrong token costs one lookup per `refused_s`, not one per request. A token that
becomes valid is not refused for longer:

- every `token.created` event reaches the gateway on a core NATS subscription too; it forgets
  the refusal of that SHA-256 at once, and for `refused_s` after it no lookup that misses the
  token (the projector has not folded it yet) is remembered;
- the same rules as above: nothing refused is kept or served while the NATS connection is down
  or after it came back, and a token made in Postgres without an event (by hand) works within
  `refused_s`.

A token with an expiry (token.created's expires_at, `hpc-ds1 token create --expires`) is served
from memory only before it: each hit compares the expiry with the clock, so an expired token is
refused at its expiry, not up to `ttl_s` after it (issue 45)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from nats.aio.subscription import Subscription
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.log import get_logger
from hpc_ds1.process.singleflight import SingleFlight
from hpc_ds1.security.tokens import TOKEN_PATTERN, Principal, lookup, token_hash

log = get_logger("gateway.auth")

TTL_S = 2.0  # the default of settings.token_cache_s: the longest a revocation unseen as an event
MAX_ENTRIES = 10_000  # then everything is forgotten at once (one lookup per token again)
MAX_REFUSED = 10_000  # refused tokens remembered; then the oldest is forgotten first
MAX_CREATED = 10_000  # token.created hashes remembered for refused_s; then the oldest goes


@dataclass(frozen=True)
class _Entry:
    principal: Principal
    expires: float


class TokenCache:
    def __init__(self, engine: Engine, bus: EventBus, ttl_s: float = TTL_S) -> None:
        self.engine = engine
        self.bus = bus
        self.ttl_s = ttl_s
        self.revoked: set[str] = set()  # token ids revoked since this gateway subscribed
        self.lookups = 0  # Postgres lookups made (the tests and the docs count them)
        self.refused_s = ttl_s  # how long a token found unknown or revoked is refused unasked
        self.refusals = 0  # requests refused from memory, without a lookup
        self._entries: dict[str, _Entry] = {}
        self._refused: dict[str, float] = {}  # sha256 -> refused until (monotonic), oldest first
        self._created: dict[str, float] = {}  # sha256 -> when its token.created came, oldest first
        self._sub: Subscription | None = None
        self._created_sub: Subscription | None = None
        self._starting = asyncio.Lock()
        self._reconnects = 0
        self._flights: SingleFlight[Principal | None] = SingleFlight()

    async def watch(self) -> None:
        """Subscribe to revocations (once); the cache serves nothing until this is done."""
        if self._sub is not None:
            return
        async with self._starting:
            if self._sub is None:
                subject = f"{self.bus.prefix}.token.*.revoked"
                sub = await self.bus.nc.subscribe(subject, cb=self._revoked)
                created = f"{self.bus.prefix}.token.*.created"
                self._created_sub = await self.bus.nc.subscribe(created, cb=self._made)
                await self.bus.nc.flush()  # the server has the subscription: nothing is missed
                self._reconnects = self._reconnect_count()
                self._sub = sub

    async def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()
        if self._created_sub is not None:
            made, self._created_sub = self._created_sub, None
            await made.unsubscribe()

    async def _revoked(self, msg: Any) -> None:
        try:
            token_id = orjson.loads(msg.data)["data"]["token_id"]
        except Exception:  # not an envelope: the projector sets it aside, nothing to revoke
            return
        if isinstance(token_id, str):
            self.revoked.add(token_id)
            self._entries = {
                k: e for k, e in self._entries.items() if e.principal.token_id != token_id
            }

    async def _made(self, msg: Any) -> None:
        try:
            sha256 = orjson.loads(msg.data)["data"]["sha256"]
        except Exception:  # not an envelope: nothing to forget
            return
        if isinstance(sha256, str):
            self._refused.pop(sha256, None)
            self._created.pop(sha256, None)
            self._created[sha256] = time.monotonic()
            while len(self._created) > MAX_CREATED:
                del self._created[next(iter(self._created))]

    def _reconnect_count(self) -> int:
        return int(self.bus.nc.stats.get("reconnects", 0))

    def _trusted(self) -> bool:
        """Whether a revocation would reach this gateway now; forgets everything if it may
        have missed one (the connection is down, or came back since)."""
        if self._sub is None or not self.bus.nc.is_connected:
            self._forget()
            return False
        reconnects = self._reconnect_count()
        if reconnects != self._reconnects:
            self._forget()
            self._reconnects = reconnects
        return True

    def _forget(self) -> None:
        self._entries.clear()
        self._refused.clear()

    def _refuse(self, key: str, now: float) -> None:
        """Remember `key` as refused, unless its token.created came within refused_s (the
        projector may not have folded it yet)."""
        made = self._created.get(key)
        if made is not None and now - made < self.refused_s:
            return
        self._refused.pop(key, None)
        self._refused[key] = now + self.refused_s
        while len(self._refused) > MAX_REFUSED:
            del self._refused[next(iter(self._refused))]

    async def _lookup(self, token: str) -> Principal | None:
        self.lookups += 1
        return await asyncio.to_thread(lookup, self.engine, token)

    async def principal(self, token: str) -> Principal | None:
        """The holder of a registered, unrevoked token; None otherwise."""
        if not TOKEN_PATTERN.match(token):
            return None
        await self.watch()
        key = token_hash(token)
        trusted = self._trusted()
        entry = self._entries.get(key) if trusted else None
        if entry is not None and time.monotonic() < entry.expires:
            if entry.principal.token_id not in self.revoked and not _expired(entry.principal):
                return entry.principal
        refused = self._refused.get(key) if trusted else None
        if refused is not None:
            if time.monotonic() < refused:
                self.refusals += 1
                return None
            del self._refused[key]
        found = await self._flights.do(key, lambda: self._lookup(token))
        if found is None or found.token_id in self.revoked or _expired(found):
            self._entries.pop(key, None)
            # Kept only if no token.created can have been missed while Postgres was asked.
            if trusted and self.bus.nc.is_connected and self._reconnect_count() == self._reconnects:
                self._refuse(key, time.monotonic())
            return None
        # Kept only if no revocation can have been missed while Postgres was asked.
        if trusted and self.bus.nc.is_connected and self._reconnect_count() == self._reconnects:
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[key] = _Entry(found, time.monotonic() + self.ttl_s)
        return found


def _expired(principal: Principal) -> bool:
    """Whether the token's expiry has come (by this gateway's clock; Postgres's decided the
    lookup, so a token is never served from memory past its expiry by either)."""
    return principal.expires_at is not None and principal.expires_at <= datetime.now(UTC)
