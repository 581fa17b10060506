"""`hpc-ds1 token nats`: a read-only subscriber credential of the embedded NATS server, made and
revoked by the real command against a served home, used by a real nats.py connection: it gets
live events and replays the log through its own consumers, every message valid against its JSON
Schema in schemas/; it is refused on publishing to the log, on purge, on other consumers, on the
KV buckets, the object stores and other users' inboxes; once revoked it is cut off."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import nats
import pytest
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlalchemy import Engine, select

from hpc_ds1.cli import PreconditionError
from hpc_ds1.cli.token import _nats_owner
from hpc_ds1.db import make_engine, tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import DeviceRegistered, decode, envelope
from hpc_ds1.infra.home import Endpoints, own_home
from hpc_ds1.infra.nats_auth import subscriber_user
from hpc_ds1.infra.subscribers import check_name
from hpc_ds1.process.runtime import run_services
from hpc_ds1.security.tokens import lookup, token_hash
from hpc_ds1.settings import Settings
from tests.infra.homes import home_settings

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
HPC_DS1 = str(Path(sys.executable).parent / "hpc-ds1")


@pytest.fixture(scope="module")
def owned(module_scratch: Path) -> Iterator[tuple[Settings, Endpoints]]:
    settings = home_settings(module_scratch / "home")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with own_home(settings) as endpoints:
            yield settings, endpoints


@contextlib.asynccontextmanager
async def served(settings: Settings, ends: Endpoints) -> AsyncIterator[tuple[EventBus, Engine]]:
    """The home's projector running (the token commands wait for it), the cli user's bus, the
    database, and what the subscriber must not touch: a KV bucket, an object store and another
    consumer."""
    stop = asyncio.Event()
    cli = await EventBus.connect(settings, ends.nats_url_for("cli"), "test")
    runner = asyncio.create_task(
        run_services(("projector",), settings, ends.nats_url_for, ends.app_database_url(), stop)
    )
    engine = make_engine(ends.app_database_url(), pool_size=1)
    try:
        kv = await cli.js.create_key_value(bucket="SUBTEST_KV")
        await kv.put("k", b"secret")
        store = await cli.js.create_object_store("SUBTEST_OBJ")
        await store.put("m", b"model")
        await cli.js.add_consumer(
            settings.stream, ConsumerConfig(durable_name="other", ack_policy=AckPolicy.EXPLICIT)
        )
        yield cli, engine
    finally:
        stop.set()
        await asyncio.gather(runner, return_exceptions=True)
        await cli.close()
        engine.dispose()


async def token(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """`hpc-ds1 token ARGS` attached to the served home, as its owner's shell runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(settings.home), HPC_DS1_LOG_JSON="true")
    return await asyncio.to_thread(
        subprocess.run,
        [HPC_DS1, "token", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def valid(raw: bytes, subject: str) -> str:
    """The event's type, once the message is valid against its schema file and its model."""
    body = json.loads(raw)
    jsonschema.validate(body, json.loads((SCHEMAS / "envelope.json").read_text()))
    schema = json.loads((SCHEMAS / f"{body['type']}.v{body['version']}.json").read_text())
    jsonschema.validate(body["data"], schema)
    assert decode(raw, subject).type == body["type"]
    return str(body["type"])


def test_the_permissions_are_read_only() -> None:
    user = subscriber_user(Settings(stream="EVENTS", subject_prefix="hpcds1"), "feed", "pw")
    assert "hpcds1.>" in user.publish_deny and "$KV.>" in user.publish_deny
    assert "$O.>" in user.publish_deny
    assert "$JS.API.STREAM.PURGE.>" in user.publish_deny
    assert "$JS.API.CONSUMER.CREATE.EVENTS" not in user.publish  # names any consumer
    assert all(".feed" in s or "CONSUMER" not in s for s in user.publish)
    assert user.subscribe == ("hpcds1.>", "_INBOX_feed.>")
    assert check_name("projector") and check_name("a.b") and check_name("cli")
    assert check_name("feed-1") is None


def test_an_external_nats_is_configured_by_its_operator(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, nats_url="nats://hpcds1:pw@n1.site:4222")
    with pytest.raises(PreconditionError, match=r"site-infrastructure\.md"):
        _nats_owner(settings)


async def test_a_subscriber_reads_the_log_and_nothing_more(
    owned: tuple[Settings, Endpoints],
) -> None:
    settings, ends = owned
    prefix, stream = settings.subject_prefix, settings.stream
    async with served(settings, ends) as (cli, engine):
        for n in range(3):
            event = DeviceRegistered(device_id=f"dev-{n}", hostname="h", fingerprint={})
            await cli.publish(envelope(event, actor="test", source="test", prefix=prefix))

        refused = await token(settings, "nats", "--name", "cli")
        assert refused.returncode == 2 and "service's NATS user" in refused.stderr

        made = await token(settings, "nats", "--name", "watcher", "--json")
        assert made.returncode == 0, made.stdout + made.stderr
        answer = json.loads(made.stdout)
        password = answer["context"]["password"]
        assert answer["context"]["url"] == ends.nats_url and answer["context"]["user"] == "watcher"
        assert answer["context"]["inbox_prefix"] == "_INBOX_watcher"
        assert answer["nats_py"]["servers"] == [ends.nats_url]
        # The secret: on stdout once, never in a log, nor in the audit file.
        assert password not in made.stderr
        assert password not in (settings.home / "nats" / "nats.log").read_text()
        with engine.connect() as conn:
            row = conn.execute(
                select(tables.tokens).where(tables.tokens.c.token_id == answer["token_id"])
            ).one()
        assert row.role == "nats" and row.holder == "watcher" and not row.revoked
        assert row.sha256 == token_hash(password)
        assert lookup(engine, password) is None  # no bearer token of the API
        with contextlib.suppress(FileNotFoundError):
            assert password not in settings.audit_path.read_text()

        errors: list[str] = []

        async def collect(error: Exception) -> None:
            errors.append(str(error).lower())

        nc = await nats.connect(**answer["nats_py"], allow_reconnect=False, error_cb=collect)
        js = nc.jetstream(timeout=2)
        try:
            # Live: the log's subjects as they are appended.
            live = await nc.subscribe(f"{prefix}.>")
            await nc.flush()
            event = DeviceRegistered(device_id="dev-live", hostname="h", fingerprint={})
            await cli.publish(envelope(event, actor="test", source="test", prefix=prefix))
            msg = await live.next_msg(timeout=5)
            assert valid(msg.data, msg.subject) == "device.registered"
            await live.unsubscribe()

            # Replay with an ordered consumer of its own name: every message, in order.
            last = await cli.last_sequence()
            ordered = await js.subscribe(
                f"{prefix}.>",
                stream=stream,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
                config=ConsumerConfig(name="watcher"),
            )
            seqs: list[int] = []
            types: set[str] = set()
            while not seqs or seqs[-1] < last:
                msg = await ordered.next_msg(timeout=5)
                seqs.append(msg.metadata.sequence.stream)
                types.add(valid(msg.data, msg.subject))
            assert seqs == sorted(seqs) and len(seqs) >= 4 and "token.created" in types
            await ordered.unsubscribe()
            await js.delete_consumer(stream, "watcher")

            # Replay from a sequence with a durable pull consumer, acked.
            pull = await js.pull_subscribe(
                f"{prefix}.>",
                durable="watcher",
                stream=stream,
                config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=2,
                    ack_policy=AckPolicy.EXPLICIT,
                ),
            )
            fetched = await pull.fetch(2, timeout=5)
            assert [m.metadata.sequence.stream for m in fetched] == [2, 3]
            for m in fetched:
                valid(m.data, m.subject)
                await m.ack_sync(timeout=5)
            info = await js.consumer_info(stream, "watcher")
            assert info.ack_floor.stream_seq == 3

            # Refused: appending to the log, purging it, other consumers, KV and object store.
            before = await cli.last_sequence()
            forged = envelope(event, actor="watcher", source="test", prefix=prefix)
            with pytest.raises(NatsTimeout):
                await js.publish(forged.subject, forged.to_json(), timeout=1.0)
            with pytest.raises(NatsTimeout):
                await js.purge_stream(stream)
            with pytest.raises(NatsTimeout):
                await js.delete_stream(stream)
            hijack = {"stream_name": stream, "config": {"name": "other", "max_deliver": 1}}
            for subject, body in [
                (f"$JS.API.CONSUMER.MSG.NEXT.{stream}.other", {"batch": 1}),
                (f"$JS.API.CONSUMER.CREATE.{stream}", hijack),
                (f"$JS.API.CONSUMER.CREATE.{stream}.other", hijack),
                (f"$JS.API.CONSUMER.DELETE.{stream}.other", {}),
            ]:
                with pytest.raises(NatsTimeout):
                    await nc.request(subject, json.dumps(body).encode(), timeout=1.0)
            other = await cli.js.pull_subscribe_bind("other", stream=stream)
            theirs = (await other.fetch(1, timeout=5))[0]
            await nc.publish(theirs.reply, b"+ACK")  # another consumer's ack
            await nc.flush()
            assert (await cli.js.consumer_info(stream, "other")).config.max_deliver != 1

            kv = await cli.js.key_value("SUBTEST_KV")
            for read in (
                lambda: js.key_value("SUBTEST_KV"),
                lambda: js.object_store("SUBTEST_OBJ"),
                lambda: nc.request("$JS.API.DIRECT.GET.KV_SUBTEST_KV.$KV.SUBTEST_KV.k", b""),
                lambda: nc.request("$KV.SUBTEST_KV.k", b"forged", timeout=1.0),
            ):
                with pytest.raises(NatsTimeout):
                    await read()  # type: ignore[no-untyped-call]
            assert (await kv.get("k")).value == b"secret"
            await nc.subscribe("_INBOX.>")  # other users' replies
            await nc.subscribe("$KV.>")
            await nc.flush()
            await asyncio.sleep(0.3)
            assert await cli.last_sequence() == before
            assert (await cli.js.stream_info(stream)).state.messages == before
            violations = [e for e in errors if "permissions violation" in e]
            for subject in (
                forged.subject,
                "$js.api.stream.purge",
                "$js.api.consumer.msg.next",
                "$js.ack",
                "$kv.subtest_kv",
                "_inbox.>",
            ):
                assert any(subject.lower() in e for e in violations), (subject, violations)

            # Revoked: the open connection is closed and a new one is refused.
            revoked = await token(settings, "nats", "--revoke", "watcher")
            assert revoked.returncode == 0, revoked.stdout + revoked.stderr
            for _ in range(100):
                if nc.is_closed:
                    break
                await asyncio.sleep(0.1)
            assert nc.is_closed
            # 'Authorization Violation', or the socket closed before the client read it
            with pytest.raises((nats.errors.Error, OSError)):
                await nats.connect(**answer["nats_py"], allow_reconnect=False)
            assert 'authentication error - user "watcher"' in (
                (settings.home / "nats" / "nats.log").read_text().lower()
            )
            with engine.connect() as conn:
                row = conn.execute(
                    select(tables.tokens).where(tables.tokens.c.token_id == answer["token_id"])
                ).one()
            assert row.revoked
            again = await token(settings, "nats", "--revoke", "watcher")
            assert again.returncode == 2 and "no subscriber credential" in again.stderr
        finally:
            with contextlib.suppress(Exception):
                await nc.close()


@pytest.fixture(scope="module")
def node_nats(module_scratch: Path) -> Path:
    """The npm `nats` package (v2), installed for this module: the second, independent client."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("node and npm are needed for the npm nats client")
    where = module_scratch / "npm"
    done = subprocess.run(
        [npm, "install", "--prefix", str(where), "--no-audit", "--no-fund", "nats@2"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if done.returncode != 0:
        pytest.skip(f"npm could not install nats: {done.stderr[-300:]}")
    return where / "node_modules"


async def node_client(node_modules: Path, args: dict[str, Any]) -> asyncio.subprocess.Process:
    env = {**os.environ, "NODE_PATH": str(node_modules), "SUBSCRIBER_ARGS": json.dumps(args)}
    return await asyncio.create_subprocess_exec(
        "node",
        str(Path(__file__).parent / "js" / "subscriber.cjs"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_the_npm_nats_client_reads_and_is_refused(
    owned: tuple[Settings, Endpoints], node_nats: Path
) -> None:
    settings, ends = owned
    prefix, stream = settings.subject_prefix, settings.stream
    async with served(settings, ends) as (cli, _):
        event = DeviceRegistered(device_id="dev-node-0", hostname="h", fingerprint={})
        await cli.publish(envelope(event, actor="test", source="test", prefix=prefix))
        made = await token(settings, "nats", "--name", "nodejs", "--json")
        assert made.returncode == 0, made.stdout + made.stderr
        made_json = json.loads(made.stdout)
        context = made_json["context"]
        args = {**context, "stream": stream, "prefix": prefix, "consumer": "nodejs"}

        client = await node_client(node_nats, {**args, "mode": "read"})
        assert client.stdout is not None
        ready = await asyncio.wait_for(client.stdout.readline(), 30)
        assert json.loads(ready) == {"ready": True}, ready
        event = DeviceRegistered(device_id="dev-node-live", hostname="h", fingerprint={})
        await cli.publish(envelope(event, actor="test", source="test", prefix=prefix))
        out, err = await asyncio.wait_for(client.communicate(), 90)
        assert client.returncode == 0, out.decode() + err.decode()
        said: dict[str, Any] = {}
        for line in out.decode().splitlines():
            said |= json.loads(line)
        live = said["live"]
        assert valid(live["data"].encode(), live["subject"]) == "device.registered"
        replayed = said["replayed"]
        assert [m["seq"] for m in replayed] == list(range(1, len(replayed) + 1))
        assert len(replayed) >= said["last"] - 1 >= 1
        assert {valid(m["data"].encode(), m["subject"]) for m in replayed} >= {
            "device.registered",
            "token.created",
        }
        assert all(said["refused"].values()), said["refused"]

        # Revoked by its token id, as any token: the NATS user goes too.
        revoked = await token(settings, "revoke", made_json["token_id"])
        assert revoked.returncode == 0, revoked.stdout + revoked.stderr
        client = await node_client(node_nats, {**args, "mode": "connect"})
        out, err = await asyncio.wait_for(client.communicate(), 30)
        assert json.loads(out) == {"connected": False, "error": "AUTHORIZATION_VIOLATION"}, (
            out.decode() + err.decode()
        )
