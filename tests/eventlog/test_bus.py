from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from hpc_ds1.eventlog.bus import ConcurrencyConflict, EventBus
from hpc_ds1.events import DeviceLeft, DeviceRegistered, Envelope, envelope
from hpc_ds1.settings import Settings


def registered(bus: EventBus, device: str = "dev-1") -> Envelope:
    return envelope(
        DeviceRegistered(device_id=device, hostname="h"),
        actor="test",
        source="test",
        prefix=bus.prefix,
    )


async def test_a_retried_publish_is_stored_once(bus: EventBus) -> None:
    env = registered(bus)
    first = await bus.publish(env)
    again = await bus.publish(env)
    assert first == again
    assert await bus.last_sequence() == 1


async def test_publish_many_appends_in_order_and_a_resend_is_stored_once(bus: EventBus) -> None:
    envs = [registered(bus, f"dev-{i}") for i in range(50)]
    sequences = await bus.publish_many(envs, window=16)  # acknowledged 16 at a time
    assert sequences == list(range(1, 51))
    assert await bus.publish_many(envs[10:20], window=4) == list(range(11, 21))
    assert await bus.last_sequence() == 50
    stored = [e async for chunk in bus.replay() for e in chunk]
    assert [e.subject for e in stored] == [env.subject for env in envs]


async def test_concurrent_writers_on_one_aggregate_exactly_one_wins(bus: EventBus) -> None:
    await bus.publish(registered(bus))
    version = await bus.aggregate_version("device", "dev-1")
    assert version == 1
    writers = [
        bus.publish(
            envelope(
                DeviceLeft(device_id="dev-1", reason=f"writer {i}"),
                actor="t",
                source="t",
                prefix=bus.prefix,
            ),
            expected_version=version,
        )
        for i in range(5)
    ]
    results = await asyncio.gather(*writers, return_exceptions=True)
    winners = [r for r in results if isinstance(r, int)]
    losers = [r for r in results if isinstance(r, ConcurrencyConflict)]
    assert len(winners) == 1 and len(losers) == 4
    history = await bus.history("device", "dev-1")
    assert [env.type for _, env in history] == ["device.registered", "device.left"]
    # Another aggregate is not affected by this one's version.
    assert await bus.publish(registered(bus, "dev-2"), expected_version=0) > 0


async def test_a_new_aggregate_expects_version_zero(bus: EventBus) -> None:
    await bus.publish(registered(bus), expected_version=0)
    with pytest.raises(ConcurrencyConflict):
        await bus.publish(registered(bus), expected_version=0)


async def test_consumer_acks_handled_and_dead_letters_the_rest(bus: EventBus) -> None:
    good = registered(bus, "ok-1")
    poison = registered(bus, "poison")
    await bus.publish(good)
    await bus.publish(poison)
    await bus.nc.publish(f"{bus.prefix}.device.junk.registered", b"\x00 not json")
    await bus.nc.flush()
    handled: list[str] = []
    attempts: dict[str, int] = {}
    stop = asyncio.Event()

    async def handler(env: Envelope, seq: int) -> None:
        attempts[env.id] = attempts.get(env.id, 0) + 1
        if env.id == poison.id:
            raise RuntimeError("cannot handle this one")
        handled.append(env.id)

    task = asyncio.create_task(bus.consume("tester", handler, stop, ack_wait=2.0))
    dlq = await bus.js.pull_subscribe(
        f"{bus.settings.dead_letter_prefix}.>", stream=bus.settings.dead_letter_stream
    )
    dead = []
    for _ in range(40):
        try:
            dead += await dlq.fetch(2, timeout=0.5)
        except TimeoutError:
            pass
        if len(dead) >= 2:
            break
    stop.set()
    await task
    await dlq.unsubscribe()
    assert handled == [good.id]
    assert attempts[poison.id] == bus.settings.max_deliver
    reasons = sorted(m.headers["Hpc-Reason"] for m in dead)
    assert reasons[0].startswith("failed 3 times")
    assert reasons[1].startswith("malformed")
    info = await bus.js.consumer_info(bus.stream, "tester")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_a_replay_filtered_on_several_subjects_keeps_the_order(
    bus: EventBus,
) -> None:
    from hpc_ds1.events import TokenRevoked

    revoked = [
        envelope(TokenRevoked(token_id=f"t{i}"), actor="t", source="t", prefix=bus.prefix)
        for i in range(3)
    ]
    devices = [registered(bus, f"dev-{i}") for i in range(3)]
    # device, token, device, token, device, token: the last match of "device" lies before the end
    await bus.publish_many([e for pair in zip(devices, revoked, strict=True) for e in pair])
    wanted = [f"{bus.prefix}.device.>", f"{bus.prefix}.audit.>"]
    got = [e async for chunk in bus.replay(1, wanted) for e in chunk]
    assert [e.seq for e in got] == [1, 3, 5]
    assert [e.subject for e in got] == [env.subject for env in devices]


async def test_closing_after_the_server_went_away_is_clean(
    tmp_path: Path, settings: Settings
) -> None:
    """A compose stop takes NATS down beside the services: a service closing its bus then must
    still stop cleanly (nothing can be drained to a server that is gone)."""
    from hpc_ds1.infra.nats_server import EmbeddedNats
    from hpc_ds1.infra.ports import free_port

    server = EmbeddedNats(tmp_path / "nats", port=free_port())
    url = server.start()
    try:
        gone = await EventBus.connect(settings, url, "test")
        await gone.publish(registered(gone))
    finally:
        server.stop()
    await asyncio.sleep(0.5)  # the client notices and starts reconnecting
    await gone.close()
    assert gone.nc.is_closed


def batches_or_skip(bus: EventBus) -> None:
    if not bus._server_batches():
        pytest.skip("the NATS server predates atomic batches (2.12)")


async def test_publish_many_goes_in_atomic_batches(
    bus: EventBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches_or_skip(bus)
    assert bus.atomic_batches
    one_at_a_time: list[range] = []
    original = bus._append_window

    async def counted(envs: list[Envelope], sequences: list[int], indexes: range) -> None:
        one_at_a_time.append(indexes)
        await original(envs, sequences, indexes)

    monkeypatch.setattr(bus, "_append_window", counted)
    envs = [registered(bus, f"dev-{i}") for i in range(2500)]
    assert await bus.publish_many(envs) == list(range(1, 2501))  # batches of 1000, 1000, 500
    assert one_at_a_time == []
    stored = [e async for chunk in bus.replay() for e in chunk]
    assert [e.subject for e in stored] == [env.subject for env in envs]
    assert [e.data for e in stored[:3]] == [env.to_json() for env in envs[:3]]

    # A resend (the whole batch, or part of it beside new events) is refused as a batch and
    # appended one at a time: the stored ones answer with their first sequence, once each.
    mixed = envs[100:105] + [registered(bus, f"new-{i}") for i in range(5)]
    assert await bus.publish_many(mixed) == [*range(101, 106), *range(2501, 2506)]
    assert await bus.publish_many(envs[:3]) == [1, 2, 3]
    assert await bus.last_sequence() == 2505
    assert len(one_at_a_time) == 2
    assert bus.atomic_batches  # a resend is no reason to stop batching


async def test_a_stream_made_without_batches_gets_them(
    settings: Settings, nats_url: str, bus: EventBus
) -> None:
    batches_or_skip(bus)
    info = await bus.js.stream_info(bus.stream)
    await bus.js.delete_stream(bus.stream)
    await bus.js.add_stream(replace(info.config, allow_atomic=None))  # as before batches
    again = await EventBus.connect(settings, nats_url, "test-again")
    try:
        assert again.atomic_batches
        assert (await again.js.stream_info(bus.stream)).config.allow_atomic
        assert await again.publish_many([registered(again, f"d{i}") for i in range(3)]) == [1, 2, 3]
    finally:
        await again.close()


async def test_refused_batches_still_append_everything_and_then_stop(bus: EventBus) -> None:
    """A server that refuses the batches (here: a stream without allow_atomic, while the bus
    believes otherwise) loses nothing; after a few refusals in a row the bus stops trying."""
    batches_or_skip(bus)
    info = await bus.js.stream_info(bus.stream)
    await bus.js.delete_stream(bus.stream)
    await bus.js.add_stream(replace(info.config, allow_atomic=None))
    assert bus.atomic_batches
    for round_ in range(3):
        envs = [registered(bus, f"r{round_}-{i}") for i in range(4)]
        assert await bus.publish_many(envs) == list(range(4 * round_ + 1, 4 * round_ + 5))
    assert not bus.atomic_batches
    assert await bus.last_sequence() == 12
