"""Which replica answers a keyed request: a claim in a JetStream KV bucket (settings.claims_bucket).

Two decision replicas can each get a copy of one `Idempotency-Key` request (a client's retry
that the queue group hands to the other replica). Both look the key up in the log, find nothing
and would run the job: the log keeps one decision (the second append is a duplicate), but the
device would run twice. Before it runs anything, a replica creates the key's entry in the bucket
(`KeyValue.create`: only one create of a key succeeds); the others wait for the holder's event
in the log, or for the claim to go (released after a failure, or expired when the holder died),
and then claim it themselves. A claim is a lease: the holder renews it every RENEW_EVERY_S
while it works, so a killed holder's claim expires within CLAIM_TTL_S and a retry on another
replica is not held up by it. Operational and short-lived, it stays out of the audit stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from ..eventlog.bus import kv_bucket
from ..log import get_logger
from ..settings import Settings

log = get_logger("claims")

CLAIM_TTL_S = 10.0  # a claim not renewed for this long is gone (its holder died)
# Five renewals a TTL: a holder loses its claim only when starved for 8 s (at TTL / 3, 6.7 s was
# enough once, on a loaded 2-CPU CI machine).
RENEW_EVERY_S = CLAIM_TTL_S / 5


async def claims_bucket(
    js: JetStreamContext, settings: Settings, ttl_s: float = CLAIM_TTL_S
) -> KeyValue:
    """The claims bucket, created when missing (entries expire after `ttl_s`)."""
    return await kv_bucket(js, settings.claims_bucket, ttl_s, settings.stream_replicas)


async def claim(kv: KeyValue, key: str, holder: str) -> int | None:
    """The claim's revision when this caller now holds `key`; None when another holds it."""
    try:
        return await kv.create(key, holder.encode())
    except KeyWrongLastSequenceError:
        return None


@contextlib.asynccontextmanager
async def holding(kv: KeyValue, key: str, holder: str, revision: int) -> AsyncIterator[None]:
    """Keep a claim alive while the body runs (renewed every RENEW_EVERY_S), then release
    it, even when the body fails or is cancelled."""

    async def renew() -> None:
        last = revision
        while True:
            await asyncio.sleep(RENEW_EVERY_S)
            try:
                last = await kv.update(key, holder.encode(), last=last)
            except KeyWrongLastSequenceError as error:
                # expired (or taken) since the last renewal: the log still keeps one event
                log.warning("claim_lost", key=key, holder=holder, error=repr(error))
                return
            except Exception as error:  # a slow or broken connection: the lease may still hold
                log.warning("claim_renewal_failed", key=key, holder=holder, error=repr(error))

    renewing = asyncio.create_task(renew())
    try:
        yield
    finally:
        renewing.cancel()
        await asyncio.gather(renewing, return_exceptions=True)
        await asyncio.shield(release(kv, key))


async def held(kv: KeyValue, key: str) -> bool:
    """Whether someone holds `key` now."""
    try:
        entry = await kv.get(key)
    except NotFoundError:  # never claimed, released (deleted) or expired
        return False
    return entry.value is not None and entry.operation is None


async def release(kv: KeyValue, key: str) -> None:
    await kv.delete(key)
