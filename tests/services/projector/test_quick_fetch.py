"""The projector's fetch takes messages already queued without a task per message
(`quick_next_msg`); what a fetch returns is what nats-py's own fetch returns."""

from __future__ import annotations

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from hpc_ds1.eventlog.bus import EventBus, stream_sequence
from hpc_ds1.events import DeviceRegistered, envelope
from hpc_ds1.services.projector.projector import quick_next_msg


async def _pull(bus: EventBus):  # type: ignore[no-untyped-def]
    return await bus.js.pull_subscribe(
        f"{bus.prefix}.>",
        durable=None,
        stream=bus.stream,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=1,
            ack_policy=AckPolicy.NONE,
            mem_storage=True,
        ),
    )


async def test_quick_fetch_returns_what_nats_py_returns(bus: EventBus) -> None:
    events = [
        envelope(
            DeviceRegistered(device_id=f"d{i}", hostname="h"),
            actor="t",
            source="t",
            prefix=bus.prefix,
        )
        for i in range(300)
    ]
    await bus.publish_many(events)
    plain, quick = await _pull(bus), await _pull(bus)
    assert quick_next_msg(quick._sub)
    seen: dict[str, list[tuple[int, str, bytes]]] = {"plain": [], "quick": []}
    for name, sub in (("plain", plain), ("quick", quick)):
        while len(seen[name]) < len(events):
            msgs = await sub.fetch(128, timeout=2)
            seen[name] += [(stream_sequence(m), m.subject, m.data) for m in msgs]
    assert seen["quick"] == seen["plain"]
    assert [s for s, _, _ in seen["quick"]] == list(range(1, len(events) + 1))
    assert quick._sub._pending_size == 0
    # Nothing left: an empty queue goes to nats-py's own wait, and times out as it does:
    # nats-py raises its own TimeoutError, or a plain one when the deadline ran out while its
    # no-wait probe was answered (a loaded machine); both are TimeoutError, and the projector's
    # _fetch takes both for "nothing yet".
    for sub in (plain, quick):
        with pytest.raises(TimeoutError):
            await sub.fetch(10, timeout=0.3)
        await sub.unsubscribe()


def test_a_subscription_without_a_queue_is_left_alone() -> None:
    class Bare:
        async def next_msg(self, timeout: float | None = 1.0) -> None:
            return None

    bare = Bare()
    method = bare.next_msg
    assert not quick_next_msg(bare)  # type: ignore[arg-type]
    assert bare.next_msg == method
