"""A three-node JetStream cluster on loopback, the log at three replicas: one node killed with
SIGKILL during a publish load (the stream's leader, later another), publishing goes on through
another node, nothing acknowledged is lost, and a restarted node catches up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest

from hpc_ds1.eventlog.bus import EventBus, server_list
from hpc_ds1.events import Envelope, TokenCreated, decode, envelope
from hpc_ds1.infra.cluster import LocalCluster, render_node_config
from hpc_ds1.models_store import bucket_name, models_bucket
from hpc_ds1.operations.backup import backup, restore
from hpc_ds1.settings import Settings

PUBLISHERS = 4


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    # sync "default": a SIGKILL loses no page cache, and every ack waits for two nodes anyway.
    with LocalCluster(tmp_path / "cluster", size=3, sync="default") as running:
        yield running


class Load:
    """PUBLISHERS tasks appending events one after another; `acked` maps every acknowledged
    event id to its sequence. EventBus.publish itself retries an append left unanswered by a
    dying node, so no append should fail; one that does is recorded in `failed` and sent
    again (same id, stored once) so that the checks of the log still hold."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.acked: dict[str, int] = {}
        self.failed: list[str] = []
        self.stop = asyncio.Event()
        self.counter = 0

    def _next(self) -> Envelope:
        self.counter += 1
        event = TokenCreated(
            token_id=f"t{self.counter}", holder="load", role="viewer", sha256=f"{self.counter:064x}"
        )
        return envelope(event, actor="test", source="test", prefix=self.bus.prefix)

    async def _publisher(self) -> None:
        while not self.stop.is_set():
            env = self._next()
            while True:
                try:
                    self.acked[env.id] = await self.bus.publish(env)
                    break
                except Exception as error:
                    self.failed.append(repr(error))
                    await asyncio.sleep(0.1)

    async def reach(self, count: int, within_s: float = 120.0) -> None:
        deadline = time.monotonic() + within_s
        while len(self.acked) < count:
            assert time.monotonic() < deadline, f"only {len(self.acked)} of {count} acked"
            await asyncio.sleep(0.05)

    def start(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self._publisher()) for _ in range(PUBLISHERS)]


async def replicas(bus: EventBus) -> tuple[str, dict[str, bool]]:
    """The stream's leader and, per follower, whether it is current."""
    info = await bus.js.stream_info(bus.stream)
    assert info.cluster is not None and info.cluster.leader
    return info.cluster.leader, {str(r.name): bool(r.current) for r in info.cluster.replicas or []}


async def until_current(bus: EventBus, name: str, within_s: float = 120.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            leader, followers = await replicas(bus)
            if leader == name or followers.get(name):
                return
        except Exception:  # no leader for a moment
            pass
        assert time.monotonic() < deadline, f"node {name} did not catch up"
        await asyncio.sleep(0.2)


async def test_the_log_survives_a_killed_node_and_the_node_catches_up(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    settings = Settings(
        home=tmp_path / "home", nats_url=cluster.url, stream_replicas=3, log_json=True
    )
    bus = await EventBus.connect(settings, cluster.url, "test")
    try:
        info = await bus.js.stream_info(settings.stream)
        assert info.config.num_replicas == 3
        store = await models_bucket(bus.js, settings)
        assert store is not None
        await store.put("dev/v1.onnx", b"model")
        bucket = await bus.js.stream_info(f"OBJ_{bucket_name(settings)}")
        assert bucket.config.num_replicas == 3

        load = Load(bus)
        tasks = load.start()
        await load.reach(200)

        leader, _ = await replicas(bus)
        cluster.kill(leader)
        await load.reach(len(load.acked) + 200)  # appends go on without the leader

        cluster.start_node(leader)
        await until_current(bus, leader)
        await load.reach(len(load.acked) + 100)

        # Another node goes: the restarted one now holds the log with the third.
        connected = f"nats://{bus.nc.connected_url.netloc}" if bus.nc.connected_url else ""
        others = [n for n in cluster.nodes if n.name != leader and n.running]
        victim = next((n for n in others if n.url == connected), others[0])
        cluster.kill(victim.name)
        await load.reach(len(load.acked) + 200)
        load.stop.set()
        await asyncio.gather(*tasks)
        if victim.url == connected:
            assert bus.nc.connected_url is not None
            assert f"nats://{bus.nc.connected_url.netloc}" != connected  # it moved on

        stored: dict[str, int] = {}
        # Reading goes on too: creating the reading consumer waits out the election of a new
        # meta leader, which the last kill may have taken away.
        for raw in [raw async for chunk in bus.replay(1) for raw in chunk]:
            event_id = decode(raw.data, raw.subject).id
            assert event_id not in stored, "an event stored twice"
            stored[event_id] = raw.seq
        assert load.acked.items() <= stored.items()  # every acknowledged event, at its sequence
        assert len(stored) == len(load.acked) == load.counter  # and nothing else
        assert load.failed == []  # the service went on: no append failed
        # The model bucket's stream may be electing a leader after the last kill: wait it out.
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            try:
                model = await store.get("dev/v1.onnx")
                break
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.5)
        assert model.data == b"model"
    finally:
        await bus.close()


def test_several_servers_in_one_url() -> None:
    assert server_list("nats://a:4222, nats://b:4222,") == ["nats://a:4222", "nats://b:4222"]
    with pytest.raises(ValueError, match="no NATS server"):
        server_list(" , ")


def test_every_node_routes_to_the_others(tmp_path: Path) -> None:
    config = render_node_config("n2", 4222, 6222, [6221, 6222, 6223], tmp_path)
    assert 'server_name: "n2"' in config
    assert "listen: 127.0.0.1:6222" in config
    for port in (6221, 6222, 6223):
        assert f"nats-route://127.0.0.1:{port}" in config
    assert "sync_interval: always" in config


async def test_a_single_server_log_moves_onto_the_cluster_by_backup_and_restore(
    cluster: LocalCluster, settings: Settings, bus: EventBus, tmp_path: Path
) -> None:
    """How a site grows: a backup of the single server's log, restored into the cluster at
    three replicas, the same messages at the same sequences (a deleted one included)."""
    events = [Load(bus)._next() for _ in range(20)]
    sequences = await bus.publish_many(events)
    await bus.js.delete_msg(settings.stream, sequences[3])
    await backup(bus, settings, tmp_path / "backup")
    grown = settings.model_copy(
        update={"nats_url": cluster.url, "stream_replicas": 3, "home": tmp_path / "grown"}
    )
    target = await EventBus.connect(grown, cluster.url, "test")
    try:
        summary = await restore(target, grown, tmp_path / "backup")
        assert (summary.events, summary.last_seq) == (19, 20)
        info = await target.js.stream_info(grown.stream)
        assert info.config.num_replicas == 3
        assert (info.state.messages, info.state.last_seq) == (19, 20)
        source = [(e.seq, e.subject, e.data) async for chunk in bus.replay(1) for e in chunk]
        copied = [(e.seq, e.subject, e.data) async for chunk in target.replay(1) for e in chunk]
        assert copied == source
    finally:
        await target.close()
