"""BeatWatch on a real heartbeat bucket (issue 46, ten thousand devices): the entries already
there, then each new beat pushed as it is put, a deleted key gone, a malformed entry left out;
the coordinator's ticks read the watch, not the bucket key by key."""

from __future__ import annotations

import asyncio

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.fleet.liveness import BeatWatch, Heartbeat, beat, liveness_bucket
from hpc_ds1.settings import Settings
from tests.support.waiting import until


async def test_the_watch_has_every_beat_as_it_is_put(bus: EventBus, settings: Settings) -> None:
    kv = await liveness_bucket(bus.js, settings)
    await beat(kv, Heartbeat(device_id="dev-a", time=1.0))
    await beat(kv, Heartbeat(device_id="dev-b", time=2.0, running="t1", running_for_s=3.0))
    watch = BeatWatch(kv)
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    try:
        await asyncio.wait_for(watch.synced.wait(), 10)
        assert {k: b.time for k, b in watch.beats.items()} == {"dev-a": 1.0, "dev-b": 2.0}
        assert watch.beats["dev-b"].running == "t1"

        await beat(kv, Heartbeat(device_id="dev-a", time=5.0))
        await beat(kv, Heartbeat(device_id="dev-c", time=6.0))
        await until(
            "beats",
            lambda: "dev-c" in watch.beats and watch.beats["dev-a"].time == 5.0,
            within_s=10.0,
        )
        await kv.delete("dev-b")
        await until("the deleted key to leave", lambda: "dev-b" not in watch.beats, within_s=10.0)
        await kv.put("dev-d", b"not a heartbeat")
        await beat(kv, Heartbeat(device_id="dev-e", time=7.0))
        await until("the beat after a malformed one", lambda: "dev-e" in watch.beats, within_s=10.0)
        assert "dev-d" not in watch.beats
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def test_an_entry_is_taken_by_its_operation() -> None:
    watch = BeatWatch(kv=None)  # type: ignore[arg-type]
    watch.take("dev-a", Heartbeat(device_id="dev-a", time=1.0).model_dump_json().encode())
    assert set(watch.beats) == {"dev-a"}
    watch.take("dev-a", None, "PURGE")
    assert watch.beats == {}
    watch.take("dev-b", b"", None)
    assert "dev-b" not in watch.beats  # an empty value is no beat
    assert watch.updates == 3
