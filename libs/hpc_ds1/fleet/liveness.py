"""Device liveness: heartbeats in a JetStream KV bucket (settings.liveness_bucket), keyed by
device id, with a TTL of settings.offline_after_s, so a silent device's entry expires. High-rate
and ephemeral, it stays out of the audit stream; the coordinator turns crossings (online ↔
offline) into device.status_changed events."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import orjson
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, Field

from ..bus import kv_bucket
from ..settings import Settings


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


def is_online(heartbeat: Heartbeat | None, settings: Settings, now: float | None = None) -> bool:
    """Heard from within offline_after_s (the TTL may not have removed a stale entry yet)."""
    if heartbeat is None:
        return False
    return (now if now is not None else time.time()) - heartbeat.time <= settings.offline_after_s


def as_dict(heartbeat: Heartbeat | None) -> dict[str, Any] | None:
    return None if heartbeat is None else heartbeat.model_dump(mode="json")
