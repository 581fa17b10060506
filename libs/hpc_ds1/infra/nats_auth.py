"""Who may do what on the embedded NATS server: one user per service and `cli`.

Every user reads the log (JetStream consumers, core subscriptions to log subjects), talks to the
JetStream API, acks, replies to requests and sends requests to any service. Only the services
that append events (and `cli`, the commands of the same home) may publish on the log subjects;
nobody but `cli` may delete, purge, rewrite or restore the log or its dead-letter stream; a
service answers requests only on its own request subjects; only the trainer (and `cli`) writes
model artifacts to the object store. A subscriber credential (`hpc-ds1 token nats`,
subscribers.py) only reads the log: see subscriber_user."""

from __future__ import annotations

from ..settings import Settings
from .nats_server import NatsUser
from .secrets import CLI_USER, NATS_USERS, HomeCredentials
from .subscribers import load_subscribers

# Services that append events to the log (grep `bus.publish` in services/ and libs/).
LOG_WRITERS = frozenset({"coordinator", "placement", "decision", "trainer", "agent", "gateway"})
# Services that write objects (model artifacts) to JetStream object stores: the trainer, and
# the gateway for the models remote agents upload.
OBJECT_WRITERS = frozenset({"trainer", "gateway"})
# Services that put tasks on the devices' work queues (placement) or take them off for remote
# agents (gateway: acks are $JS.ACK, so only placement publishes there).
WORK_WRITERS = frozenset({"placement"})
# Services that write heartbeats to the liveness KV bucket: the local agent, and the gateway
# on behalf of remote agents.
LIVENESS_WRITERS = frozenset({"agent", "gateway"})
# Services that claim keyed requests before running them (hpc_ds1.eventlog.claims).
CLAIM_WRITERS = frozenset({"decision"})


def _destructive(stream: str) -> tuple[str, ...]:
    api = "$JS.API.STREAM"
    return tuple(
        f"{api}.{verb}.{stream}" for verb in ("DELETE", "PURGE", "UPDATE", "MSG.DELETE", "RESTORE")
    )


def service_user(settings: Settings, name: str, password: str) -> NatsUser:
    """The permissions of service `name` (one of runtime.SERVICES)."""
    prefix, svc = settings.subject_prefix, f"{settings.subject_prefix}-svc"
    publish = [
        "$JS.API.>",  # stream/consumer info and creation, fetches, direct gets
        "$JS.ACK.>",  # acks, naks, terms of consumed messages
        "$JS.FC.>",  # flow-control replies of push consumers (object store reads)
        "_INBOX.>",  # replies to requests
        f"{svc}.>",  # requests to other services
        f"{settings.dead_letter_prefix}.>",  # a consumer's dead letters
    ]
    if name in LOG_WRITERS:
        publish.append(f"{prefix}.>")
    elif name == "projector":
        # its audit anchors (head hash and sequence), and nothing else of the log
        publish.append(f"{prefix}.audit.*.checkpoint")
    if name in OBJECT_WRITERS:
        publish.append("$O.>")
    if name in WORK_WRITERS:
        publish.append(f"{settings.work_prefix}.>")
    if name in LIVENESS_WRITERS:
        publish.append(f"$KV.{settings.liveness_bucket}.>")
    if name in CLAIM_WRITERS:
        publish.append(f"$KV.{settings.claims_bucket}.>")
    return NatsUser(
        name=name,
        password=password,
        publish=tuple(publish),
        publish_deny=_destructive(settings.stream) + _destructive(settings.dead_letter_stream),
        subscribe=("_INBOX.>", f"{prefix}.>", f"{svc}.{name}.>"),
    )


def subscriber_inbox(name: str) -> str:
    """The inbox prefix of subscriber `name` (its clients' `inbox_prefix`): replies and push
    deliveries come there, and it may not read other users' `_INBOX.>` (their replies)."""
    return f"_INBOX_{name}"


def subscriber_user(settings: Settings, name: str, password: str) -> NatsUser:
    """A read-only subscriber of the log (subscribers.check_name has vetted `name`).

    It subscribes to the log's subjects and to its own inbox. Of the JetStream API it may read
    the log stream's info and messages and create, read, fetch from, ack on and delete the
    consumer named `name` (durable or ordered) of the log stream, and nothing else: NATS
    wildcards match whole subject tokens, so a consumer name is allowed whole, never as a
    prefix; one consuming system, one credential. The API subject without a consumer name
    (`$JS.API.CONSUMER.CREATE.<stream>`) is not allowed: its request body may name any
    consumer, which would let it update another's. Publishing to the log, the KV buckets
    (`$KV.>`) and object stores (`$O.>`), and deleting, purging or changing a stream are denied
    outright."""
    stream, api = settings.stream, "$JS.API"
    consumer = f"{stream}.{name}"
    publish = (
        f"{api}.INFO",
        f"{api}.STREAM.NAMES",
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.CREATE.{consumer}",
        f"{api}.CONSUMER.CREATE.{consumer}.>",
        f"{api}.CONSUMER.DURABLE.CREATE.{consumer}",
        f"{api}.CONSUMER.INFO.{consumer}",
        f"{api}.CONSUMER.DELETE.{consumer}",
        f"{api}.CONSUMER.MSG.NEXT.{consumer}",
        f"$JS.ACK.{consumer}.>",
        f"$JS.FC.{consumer}.>",
    )
    deny = (
        f"{settings.subject_prefix}.>",
        "$KV.>",
        "$O.>",
        *(f"{api}.STREAM.{verb}.>" for verb in ("DELETE", "PURGE", "UPDATE", "MSG.DELETE")),
        *(f"{api}.STREAM.{verb}.>" for verb in ("RESTORE", "SNAPSHOT")),
    )
    return NatsUser(
        name=name,
        password=password,
        publish=publish,
        publish_deny=deny,
        subscribe=(f"{settings.subject_prefix}.>", f"{subscriber_inbox(name)}.>"),
        subscribe_deny=("$KV.>", "$O.>", "_INBOX.>"),
    )


def nats_users(settings: Settings, credentials: HomeCredentials) -> list[NatsUser]:
    """Every user of a home's embedded server: the services, `cli` with every right, and the
    home's read-only subscribers (`hpc-ds1 token nats`)."""
    users = [
        service_user(settings, name, credentials.nats_password(name))
        for name in NATS_USERS
        if name != CLI_USER
    ]
    users.append(NatsUser(CLI_USER, credentials.nats_password(CLI_USER)))
    users += [
        subscriber_user(settings, s.name, s.password) for s in load_subscribers(settings.home)
    ]
    return users
