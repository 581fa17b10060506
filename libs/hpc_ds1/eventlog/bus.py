"""A small wrapper over nats-py JetStream: the EVENTS stream, idempotent and optimistic publish,
durable pull consumers with bounded redelivery and a dead-letter stream."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import nats
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    PubAck,
    RawStreamMsg,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import (
    APIError,
    BadRequestError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue

from ..events import Envelope, MalformedEvent, decode
from ..log import get_logger
from ..settings import Settings

log = get_logger("bus")

WRONG_LAST_SEQUENCE = 10071  # JetStream's error code for a failed expected-sequence check
PUBLISH_RETRY_S = 15.0  # how long an unanswered append is retried (a leader election takes seconds)
PUBLISH_ACK_WAIT_S = 5.0  # publish_many: how long a window's acks are awaited before a resend
# JetStream atomic batch publishing (nats-server 2.12+): a batch is stored whole or not at all,
# with one acknowledgement and, under `sync_interval: always`, one flush to disk for the batch.
ATOMIC_BATCH_SINCE = (2, 12)
ATOMIC_BATCH_MAX = 1000  # the server's default jetstream.limits.batch.max_msgs
ATOMIC_BATCH_DUPLICATE = 10201  # "atomic publish batch contains duplicate message id"
ATOMIC_BATCH_GIVE_UP = 3  # refusals in a row (not resends) after which a bus stops batching


class ConcurrencyConflict(Exception):
    """Another writer appended to the aggregate since it was read."""


class MissingStream(LookupError):
    """A connection that does not create the streams (`EventBus.connect(create=False)`: a
    command attached to a home's server, or one that only reads) found no event stream."""


@dataclass(frozen=True)
class RawEvent:
    """One stored message as read back from the stream, before decoding."""

    seq: int
    subject: str
    data: bytes


Handler = Callable[[Envelope, int], Awaitable[None]]

_V1_ACK_TOKENS = 9  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>


def stream_sequence(msg: Msg) -> int:
    """A JetStream message's stream sequence, read from its reply subject alone: `metadata`
    parses every field into dataclasses (a tenth of the projector's time per event)."""
    reply = msg.reply or ""
    tokens = reply.split(".")
    if reply.startswith("$JS.ACK.") and len(tokens) == _V1_ACK_TOKENS:
        return int(tokens[5])
    return int(msg.metadata.sequence.stream)  # the v2 form (domain, account hash): as nats-py


T = TypeVar("T")


async def until_answered(call: Callable[[], Awaitable[T]], what: str) -> T:
    """A JetStream API call sent again while it gets no answer (a cluster electing a leader
    after a node died, or busy creating raft groups at a start), for up to PUBLISH_RETRY_S.
    For calls that are safe to repeat: reads, and creations an identical config answers as a
    success (add_stream, add_consumer, key-value and object-store buckets)."""
    deadline = asyncio.get_running_loop().time() + PUBLISH_RETRY_S
    while True:
        try:
            return await call()
        except (NatsTimeout, NoStreamResponseError, ServiceUnavailableError) as error:
            if asyncio.get_running_loop().time() >= deadline:
                raise
            log.warning("jetstream_retry", what=what, error=repr(error))
            await asyncio.sleep(0.25)


async def kv_bucket(js: JetStreamContext, name: str, ttl_s: float, replicas: int) -> KeyValue:
    """A KV bucket of one value per key (history 1) whose entries expire after `ttl_s`, created
    when missing; each call asked again while a cluster elects a leader (until_answered)."""
    config = KeyValueConfig(
        bucket=name, history=1, ttl=ttl_s, storage=StorageType.FILE, replicas=replicas
    )
    try:
        return await until_answered(functools.partial(js.key_value, name), name)
    except NotFoundError:
        return await until_answered(functools.partial(js.create_key_value, config), name)


def server_list(url: str) -> list[str]:
    """HPC_DS1_NATS_URL may name several servers of one cluster, comma-separated: the client
    connects to any of them and moves to another when its server goes away."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ValueError(f"no NATS server in {url!r}; give nats://HOST:PORT[,nats://HOST:PORT...]")
    return servers


class EventBus:
    def __init__(self, nc: Client, settings: Settings) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.settings = settings
        self.stream = settings.stream
        self.prefix = settings.subject_prefix
        # Set from the event stream's config (allow_atomic) when it is created or found.
        self.atomic_batches = False
        self._batch_refusals = 0

    @classmethod
    async def connect(
        cls, settings: Settings, url: str, name: str, create: bool = True
    ) -> EventBus:
        """Connect as the user named in `url` (nats://user:password@host:port), if any. Refused
        credentials fail at once; an unreachable server is waited for, as before. `create`:
        create the event and dead-letter streams when missing (the services, and a command
        that owns its home); False (a command attached to a running server, or one that only
        reads): create nothing, and MissingStream when there is no event stream."""

        async def quiet(_: Exception) -> None:
            return None

        try:
            probe = await nats.connect(
                server_list(url), allow_reconnect=False, connect_timeout=2, error_cb=quiet
            )
        except nats.errors.Error as error:
            if "authorization" in str(error).lower() or "authentication" in str(error).lower():
                server = url.split(",")[0].split("://")[-1].rsplit("@", 1)[-1]
                raise PermissionError(
                    f"the NATS server {server} refused the credentials of {name!r} ({error}): "
                    "use the URL of Endpoints.nats_url_for(user), or credentials in "
                    "HPC_DS1_NATS_URL (nats://user:password@host:port)"
                ) from None
        except Exception:
            pass  # not reachable yet: the reconnecting client below waits for it
        else:
            await probe.close()
        nc = await nats.connect(
            server_list(url),
            name=f"hpc-ds1-{name}",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            drain_timeout=5,
            # A link that dies silently (no FIN) is found by missed pings: ~30 s, not the
            # client default's ~4 min, before the client reconnects elsewhere.
            ping_interval=10,
            max_outstanding_pings=3,
        )
        bus = cls(nc, settings)
        try:
            if create:
                await bus.ensure_streams()
            else:
                await bus.require_stream()
        except BaseException:
            await nc.close()
            raise
        return bus

    async def close(self) -> None:
        """Drain and close; a connection whose server is already gone is closed without the
        drain (nothing can be flushed to it, and nothing unacknowledged was ever recorded)."""
        if self.nc.is_closed:
            return
        try:
            await self.nc.drain()
        except (
            nats.errors.ConnectionReconnectingError,
            nats.errors.ConnectionClosedError,
            nats.errors.DrainTimeoutError,
        ) as error:
            # A compose stop takes NATS down beside the services: stopping is still clean.
            log.warning("closed_without_drain", error=type(error).__name__)
            await self.nc.close()

    def _server_batches(self) -> bool:
        """Whether the connected server accepts atomic batches (a cluster's servers are expected
        to run one version; an older one answers a batch with an error and publish_many then
        appends one event at a time)."""
        version = self.nc.connected_server_version
        try:
            return (version.major, version.minor) >= ATOMIC_BATCH_SINCE
        except (TypeError, ValueError, AttributeError):
            return False

    async def ensure_streams(self) -> None:
        """Create the event stream and its dead-letter stream; keep everything, discard nothing.
        The event stream allows atomic batches where the server has them (publish_many)."""
        batches = self._server_batches()
        for name, subjects in (
            (self.stream, [f"{self.prefix}.>"]),
            (self.settings.dead_letter_stream, [f"{self.settings.dead_letter_prefix}.>"]),
        ):
            config = StreamConfig(
                name=name,
                subjects=subjects,
                storage=StorageType.FILE,
                retention=RetentionPolicy.LIMITS,
                discard=DiscardPolicy.NEW,
                max_msgs=-1,
                max_bytes=-1,
                max_age=0,
                duplicate_window=120.0,
                num_replicas=self.settings.stream_replicas,
                allow_atomic=True if batches and name == self.stream else None,
            )
            # Every service of a serve does this at once; on a cluster each create waits for
            # a new raft group, so an answer can take longer than a request's timeout on a
            # loaded machine: ask again (an identical add_stream is answered as a success).
            try:
                info = await self._until_answered(functools.partial(self.js.stream_info, name))
            except NotFoundError:
                info = await self._until_answered(functools.partial(self.js.add_stream, config))
            if name == self.stream:
                self.atomic_batches = bool(info.config.allow_atomic)
                if batches and not self.atomic_batches:
                    await self._allow_batches(info.config)

    async def _allow_batches(self, config: StreamConfig) -> None:
        """A stream created before batches (or by an older server) gets them once; a refusal
        (a user without the right, a stream managed elsewhere) keeps one-at-a-time appends."""
        try:
            info = await self.js.update_stream(replace(config, allow_atomic=True))
        except (APIError, NatsTimeout) as error:
            log.warning("atomic_batches_unavailable", stream=self.stream, error=repr(error))
            return
        self.atomic_batches = bool(info.config.allow_atomic)

    async def require_stream(self) -> None:
        """MissingStream unless the event stream exists; creates nothing."""
        try:
            info = await self._until_answered(functools.partial(self.js.stream_info, self.stream))
        except NotFoundError:
            raise MissingStream(
                f"no event stream {self.stream!r} (HPC_DS1_STREAM) on the NATS server, and this "
                "command creates none: start `hpc-ds1 serve` for this home (it creates the "
                "stream), or set HPC_DS1_STREAM to the stream the server uses"
            ) from None
        self.atomic_batches = bool(info.config.allow_atomic) and self._server_batches()

    # --- writing -------------------------------------------------------------------------

    def _headers(
        self, env: Envelope, expected_version: int | None, extra: dict[str, str] | None = None
    ) -> dict[str, str]:
        headers = {**(extra or {}), "Nats-Msg-Id": env.id}
        if expected_version is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expected_version)
            headers["Nats-Expected-Last-Subject-Sequence-Subject"] = self.aggregate_subjects(
                env.aggregate, env.aggregate_id
            )
        return headers

    async def publish(self, env: Envelope, expected_version: int | None = None) -> int:
        """Append one event; returns its stream sequence. A retry with the same envelope id is
        stored once. With `expected_version` (the aggregate's last sequence, 0 for a new one)
        the append fails with ConcurrencyConflict if anyone else appended in between.
        An append that gets no answer (a cluster electing a new stream leader, the connection
        moving to another server) is sent again, the same event, for up to PUBLISH_RETRY_S:
        its Nats-Msg-Id keeps a second copy out of the log."""
        return int((await self.append(env, expected_version)).seq)

    async def append(
        self,
        env: Envelope,
        expected_version: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> PubAck:
        """`publish` with more headers on the stored message, answering the PubAck itself:
        `duplicate` is true when the envelope id was appended before, within the stream's
        duplicate window, and `seq` is then that original's sequence
        (hpc_ds1.eventlog.idempotency)."""
        deadline = asyncio.get_running_loop().time() + PUBLISH_RETRY_S
        while True:
            try:
                ack = await self.js.publish(
                    env.subject,
                    env.to_json(),
                    stream=self.stream,
                    headers=self._headers(env, expected_version, headers),
                )
            except BadRequestError as error:
                if error.err_code == WRONG_LAST_SEQUENCE:
                    raise ConcurrencyConflict(
                        f"{env.aggregate} {env.aggregate_id} moved past version {expected_version}"
                    ) from None
                raise
            except (NatsTimeout, NoStreamResponseError) as error:
                if asyncio.get_running_loop().time() >= deadline:
                    raise
                log.warning("publish_retry", subject=env.subject, error=repr(error))
                await asyncio.sleep(0.25)
                continue
            return ack

    async def publish_many(self, envs: Iterable[Envelope], window: int = 1024) -> list[int]:
        """Appends with batched acknowledgements; returns the sequences in order.
        Where the stream allows it, up to ATOMIC_BATCH_MAX events go as one JetStream atomic
        batch: one acknowledgement and, with `sync_interval: always`, one flush for the batch
        (13x the appends/s of one-at-a-time here). A batch that is refused whole (one of its
        events was appended before: a resend) or not answered is appended one event at a time
        instead, where each event's Nats-Msg-Id keeps a second copy out and answers with the
        original's sequence. Without batches: up to `window` events sent at once, their acks
        awaited together; an append unanswered after PUBLISH_ACK_WAIT_S is sent again for up
        to PUBLISH_RETRY_S; a refusal (a wrong stream) raises."""
        pending = list(envs)
        sequences = [0] * len(pending)
        step = min(window, ATOMIC_BATCH_MAX) if self.atomic_batches else window
        for start in range(0, len(pending), step):
            indexes = range(start, min(start + step, len(pending)))
            if not (self.atomic_batches and await self._append_batch(pending, sequences, indexes)):
                await self._append_window(pending, sequences, indexes)
        return sequences

    async def _append_batch(
        self, envs: list[Envelope], sequences: list[int], indexes: range
    ) -> bool:
        """One atomic batch; False when it was not stored as sent (nothing of it was, unless it
        had been before) and the caller should append its events one at a time."""
        batch_id = uuid.uuid4().hex
        last = indexes[-1]
        reply = None
        for number, i in enumerate(indexes, 1):
            env = envs[i]
            headers = {
                "Nats-Msg-Id": env.id,
                "Nats-Expected-Stream": self.stream,
                "Nats-Batch-Id": batch_id,
                "Nats-Batch-Sequence": str(number),
            }
            if i != last:
                await self.nc.publish(env.subject, env.to_json(), headers=headers)
                continue
            headers["Nats-Batch-Commit"] = "1"
            try:
                reply = await self.nc.request(
                    env.subject, env.to_json(), timeout=PUBLISH_ACK_WAIT_S, headers=headers
                )
            except (NatsTimeout, nats.errors.NoRespondersError) as unanswered:
                log.warning("batch_unanswered", events=len(indexes), error=repr(unanswered))
                return False
        answer = orjson.loads(reply.data) if reply is not None else {}
        refusal = answer.get("error")
        if refusal is not None or answer.get("count") != len(indexes):
            if refusal is None or refusal.get("err_code") != ATOMIC_BATCH_DUPLICATE:
                # Not a resend: a lost message of the batch, a limit, a server refusing them.
                log.warning("atomic_batch_refused", error=refusal, count=answer.get("count"))
                self._batch_refusals += 1
                if self._batch_refusals >= ATOMIC_BATCH_GIVE_UP:
                    self.atomic_batches = False
            return False
        self._batch_refusals = 0
        first = int(answer["seq"]) - len(indexes) + 1
        for offset, i in enumerate(indexes):
            sequences[i] = first + offset
        return True

    async def _append_window(
        self, envs: list[Envelope], sequences: list[int], indexes: range
    ) -> None:
        deadline = asyncio.get_running_loop().time() + PUBLISH_RETRY_S
        waiting = list(indexes)
        while waiting:
            acks: dict[int, asyncio.Future[PubAck]] = {}
            for i in waiting:
                env = envs[i]
                acks[i] = await self.js.publish_async(
                    env.subject, env.to_json(), stream=self.stream, headers=self._headers(env, None)
                )
            await asyncio.wait(acks.values(), timeout=PUBLISH_ACK_WAIT_S)
            waiting = []
            for i, ack in acks.items():
                if not ack.done():
                    ack.cancel()
                    waiting.append(i)
                elif isinstance(ack.exception(), NoStreamResponseError):
                    waiting.append(i)
                else:
                    sequences[i] = int(ack.result().seq)  # raises a refusal as it is
            if waiting:
                if asyncio.get_running_loop().time() >= deadline:
                    raise NatsTimeout
                log.warning("publish_retry", events=len(waiting))
                await asyncio.sleep(0.25)

    # --- reading -------------------------------------------------------------------------

    def aggregate_subjects(self, aggregate: str, aggregate_id: str) -> str:
        return f"{self.prefix}.{aggregate}.{aggregate_id}.*"

    async def aggregate_version(self, aggregate: str, aggregate_id: str) -> int:
        """The stream sequence of the aggregate's last event; 0 when it has none."""
        try:
            msg = await self.js.get_last_msg(
                self.stream, self.aggregate_subjects(aggregate, aggregate_id)
            )
        except NotFoundError:
            return 0
        return int(msg.seq or 0)

    async def stored(
        self, seq: int | None = None, subject: str | None = None
    ) -> RawStreamMsg | None:
        """One stored message with its headers: by sequence, or the last on a subject; None
        when there is none."""
        try:
            return await self._until_answered(
                lambda: self.js.get_msg(self.stream, seq=seq, subject=subject)
            )
        except NotFoundError:
            return None

    async def _until_answered(self, call: Callable[[], Awaitable[T]]) -> T:
        """`until_answered` on this bus's stream."""
        return await until_answered(call, self.stream)

    @staticmethod
    async def _fetch_or_unavailable(
        sub: JetStreamContext.PullSubscription, batch: int
    ) -> list[Msg]:
        """One fetch; a fetch that waited its second out raises TimeoutError, and one sent while
        the consumer's leader is being elected (a node died) ServiceUnavailableError, which
        _until_answered sends again."""
        try:
            msgs: list[Msg] = await sub.fetch(batch, timeout=1.0)
        except NatsTimeout:
            raise TimeoutError from None
        return msgs

    async def last_sequence(self) -> int:
        info = await self._until_answered(lambda: self.js.stream_info(self.stream))
        return int(info.state.last_seq)

    async def replay(
        self,
        start_seq: int = 1,
        filter_subject: str | Sequence[str] | None = None,
        stop_at: int | None = None,
        batch: int = 500,
    ) -> AsyncIterator[list[RawEvent]]:
        """Read the log in order from `start_seq` up to `stop_at` (default: the end now); only
        the subjects matching `filter_subject` (one pattern, or several) when given."""
        stop_at = await self.last_sequence() if stop_at is None else stop_at
        if stop_at < start_seq:
            return
        several = (
            None if filter_subject is None or isinstance(filter_subject, str) else filter_subject
        )
        sub = await self._until_answered(
            lambda: self.js.pull_subscribe(
                filter_subject if isinstance(filter_subject, str) else f"{self.prefix}.>",
                durable=None,
                stream=self.stream,
                config=ConsumerConfig(
                    filter_subjects=list(several) if several else None,
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=start_seq,
                    ack_policy=AckPolicy.NONE,
                    inactive_threshold=30.0,
                    mem_storage=True,
                ),
            )
        )
        try:
            while True:
                try:
                    msgs = await self._until_answered(
                        lambda: self._fetch_or_unavailable(sub, batch)
                    )
                except (NatsTimeout, TimeoutError):
                    # A filtered replay may have no message left at or before stop_at.
                    info = await self._until_answered(sub.consumer_info)
                    if info.num_pending == 0:
                        return
                    continue
                events = [RawEvent(stream_sequence(m), m.subject, m.data) for m in msgs]
                kept = [e for e in events if e.seq <= stop_at]
                if kept:
                    yield kept
                if len(kept) < len(events) or events[-1].seq >= stop_at:
                    return
                if filter_subject is not None and len(events) < batch:
                    # A filtered replay whose last match lies before stop_at: ask, rather than
                    # wait out a fetch's second.
                    info = await self._until_answered(sub.consumer_info)
                    if info.num_pending == 0:
                        return
        finally:
            await sub.unsubscribe()

    async def history(self, aggregate: str, aggregate_id: str) -> list[tuple[int, Envelope]]:
        """Every event of one aggregate, in order, with its sequence."""
        if await self.aggregate_version(aggregate, aggregate_id) == 0:
            return []
        found: list[tuple[int, Envelope]] = []
        async for chunk in self.replay(1, self.aggregate_subjects(aggregate, aggregate_id)):
            found += [(raw.seq, decode(raw.data, raw.subject)) for raw in chunk]
        return found

    # --- consuming -----------------------------------------------------------------------

    async def dead_letter(self, msg: Msg, durable: str, reason: str) -> None:
        meta = msg.metadata
        await self.js.publish(
            f"{self.settings.dead_letter_prefix}.{durable}",
            msg.data,
            stream=self.settings.dead_letter_stream,
            headers={
                "Hpc-Original-Subject": msg.subject,
                "Hpc-Original-Sequence": str(meta.sequence.stream),
                "Hpc-Deliveries": str(meta.num_delivered),
                "Hpc-Reason": reason[:1000],
            },
        )
        log.warning(
            "dead_letter",
            consumer=durable,
            subject=msg.subject,
            seq=meta.sequence.stream,
            reason=reason,
        )

    async def consume(
        self,
        durable: str,
        handler: Handler,
        stop: asyncio.Event,
        filter_subject: str | None = None,
        batch: int = 64,
        ack_wait: float = 30.0,
    ) -> None:
        """Run `handler` for every event on a durable pull consumer until `stop` is set.
        A failing handler is retried (with back-off) up to max_deliver times, then the message
        goes to the dead-letter stream; an undecodable message goes there at once."""
        max_deliver = self.settings.max_deliver
        sub = await self._until_answered(
            lambda: self.js.pull_subscribe(
                filter_subject or f"{self.prefix}.>",
                durable=durable,
                stream=self.stream,
                config=ConsumerConfig(
                    ack_policy=AckPolicy.EXPLICIT,
                    max_deliver=max_deliver,
                    ack_wait=ack_wait,
                    deliver_policy=DeliverPolicy.ALL,
                ),
            )
        )
        try:
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(batch, timeout=0.5)
                except (NatsTimeout, TimeoutError):
                    continue
                except APIError as error:
                    log.warning("fetch_failed", consumer=durable, error=str(error))
                    await asyncio.sleep(0.5)
                    continue
                for msg in msgs:
                    await self._handle(msg, durable, handler, max_deliver)
        finally:
            await sub.unsubscribe()

    async def _handle(self, msg: Msg, durable: str, handler: Handler, max_deliver: int) -> None:
        try:
            env = decode(msg.data, msg.subject)
        except MalformedEvent as error:
            await self.dead_letter(msg, durable, f"malformed: {error}")
            await msg.term()
            return
        try:
            await handler(env, msg.metadata.sequence.stream)
        except Exception as error:
            deliveries = msg.metadata.num_delivered
            if deliveries >= max_deliver:
                await self.dead_letter(msg, durable, f"failed {deliveries} times: {error!r}")
                await msg.term()
            else:
                log.warning("handler_failed", consumer=durable, type=env.type, error=repr(error))
                await msg.nak(delay=min(0.1 * 2**deliveries, 5.0))
            return
        await msg.ack()
