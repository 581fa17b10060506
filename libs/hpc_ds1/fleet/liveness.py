"""Device liveness: heartbeats in a JetStream KV bucket (settings.liveness_bucket), keyed by
device id, with a TTL of settings.offline_after_s, so a silent device's entry expires. High-rate
and ephemeral, it stays out of the audit stream; the coordinator turns crossings (online ↔
offline) into device.status_changed events."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from typing import Any

import orjson
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, Field

from ..eventlog.bus import kv_bucket
from ..log import get_logger
from ..settings import Settings

log = get_logger("liveness")


class Heartbeat(BaseModel):
    """What an agent says about itself every settings.heartbeat_interval_s."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device_id: str
    time: float = Field(description="Unix time the coordinator received it.")
    running: str | None = Field(default=None, description="The task id it is running.")
    running_for_s: float | None = Field(default=None, ge=0)
    queued: int = Field(default=0, ge=0, description="Tasks it holds but has not started.")


async def liveness_bucket(js: JetStreamContext, settings: Settings) -> KeyValue:
    """The heartbeat bucket, created when missing (history 1, TTL offline_after_s). Each call
    is asked again while a cluster elects a leader (bus.until_answered)."""
    return await kv_bucket(
        js, settings.liveness_bucket, settings.offline_after_s, settings.stream_replicas
    )


async def beat(kv: KeyValue, heartbeat: Heartbeat) -> None:
    await kv.put(heartbeat.device_id, orjson.dumps(heartbeat.model_dump(mode="json")))


async def last_beat(kv: KeyValue, device_id: str) -> Heartbeat | None:
    try:
        entry = await kv.get(device_id)
    except KeyNotFoundError:
        return None
    if not entry.value:
        return None
    return Heartbeat.model_validate(orjson.loads(entry.value))


async def all_beats(kv: KeyValue, also: Iterable[str] = ()) -> dict[str, Heartbeat]:
    """Every device heard from within the TTL. `also`: device ids read by key whether or not
    the listing named them: a key put while the bucket is listed can be missing from the list,
    which would read as a silent device."""
    try:
        keys = set(await kv.keys())
    except NoKeysError:  # an empty bucket
        keys = set()
    keys |= set(also)
    beats: dict[str, Heartbeat] = {}
    for key in sorted(keys):
        found = await last_beat(kv, key)
        if found is not None:
            beats[key] = found
    return beats


class BeatWatch:
    """Every device's last heartbeat, kept current by one watch on the bucket: the server
    pushes each beat as it is put, so a tick reads a dict instead of listing the bucket and
    reading every key (issue 46: ten thousand devices were ten thousand reads a second).
    An entry that stops changing goes stale by its time (`is_online`), as before; a deleted
    or purged key leaves the dict."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.beats: dict[str, Heartbeat] = {}
        self.synced = asyncio.Event()  # the bucket's entries at the start have all arrived
        self.updates = 0

    async def run(self, stop: asyncio.Event) -> None:
        watcher = await self.kv.watchall()

        async def stopping() -> None:
            await stop.wait()
            await watcher.stop()

        ender = asyncio.create_task(stopping())
        try:
            async for entry in watcher:
                if entry is None:  # the end of the entries that were there at the start
                    self.synced.set()
                    continue
                self.take(entry.key, entry.value, entry.operation)
        finally:
            ender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await ender

    def take(self, key: str, value: bytes | None, operation: str | None = None) -> None:
        """One entry as the watch delivers it."""
        self.updates += 1
        if operation in ("DEL", "PURGE") or not value:
            self.beats.pop(key, None)
            return
        try:
            self.beats[key] = Heartbeat.model_validate(orjson.loads(value))
        except ValueError as error:  # a malformed entry is not a beat: logged, left out
            log.warning("heartbeat_malformed", device_id=key, error=str(error)[:200])


def is_online(heartbeat: Heartbeat | None, settings: Settings, now: float | None = None) -> bool:
    """Heard from within offline_after_s (the TTL may not have removed a stale entry yet)."""
    if heartbeat is None:
        return False
    return (now if now is not None else time.time()) - heartbeat.time <= settings.offline_after_s


def as_dict(heartbeat: Heartbeat | None) -> dict[str, Any] | None:
    return None if heartbeat is None else heartbeat.model_dump(mode="json")
