"""all_beats: the listing of the heartbeat bucket, plus the known devices read by key."""

from __future__ import annotations

from typing import Any

import orjson
from nats.js.errors import KeyNotFoundError, NoKeysError

from hpc_ds1.fleet.liveness import Heartbeat, all_beats


class _Entry:
    def __init__(self, value: bytes) -> None:
        self.value = value


class ListingMisses:
    """A bucket whose listing leaves out the keys in `unlisted`, as a listing taken while
    those keys are put can; reads by key see every key."""

    def __init__(self, beats: dict[str, Heartbeat], unlisted: set[str]) -> None:
        self.values = {d: orjson.dumps(b.model_dump(mode="json")) for d, b in beats.items()}
        self.unlisted = unlisted

    async def keys(self) -> list[str]:
        listed = [k for k in self.values if k not in self.unlisted]
        if not listed:
            raise NoKeysError
        return listed

    async def get(self, key: str) -> Any:
        if key not in self.values:
            raise KeyNotFoundError
        return _Entry(self.values[key])


def _beats(*devices: str) -> dict[str, Heartbeat]:
    return {d: Heartbeat(device_id=d, time=1000.0 + i) for i, d in enumerate(devices)}


async def test_a_known_device_missing_from_the_listing_is_still_heard() -> None:
    kv = ListingMisses(_beats("dev-a", "dev-b"), unlisted={"dev-b"})
    assert set(await all_beats(kv)) == {"dev-a"}  # type: ignore[arg-type]
    heard = await all_beats(kv, also=["dev-a", "dev-b"])  # type: ignore[arg-type]
    assert heard == _beats("dev-a", "dev-b")


async def test_a_known_device_without_a_beat_is_not_invented() -> None:
    kv = ListingMisses(_beats("dev-a"), unlisted={"dev-a"})  # the listing is empty
    heard = await all_beats(kv, also=["dev-a", "gone"])  # type: ignore[arg-type]
    assert set(heard) == {"dev-a"}
