"""Who may do what on the embedded NATS server: one user per service and `cli`.

Every user reads the log (JetStream consumers, core subscriptions to log subjects), talks to the
JetStream API, acks, replies to requests and sends requests to any service. Only the services
that append events (and `cli`, the commands of the same home) may publish on the log subjects;
nobody but `cli` may delete, purge, rewrite or restore the log or its dead-letter stream; a
service answers requests only on its own request subjects; only the trainer (and `cli`) writes
model artifacts to the object store."""

from __future__ import annotations

from ..settings import Settings
from .nats_server import NatsUser
from .secrets import CLI_USER, NATS_USERS, HomeCredentials

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
# Services that claim keyed requests before running them (hpc_ds1.claims).
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


def nats_users(settings: Settings, credentials: HomeCredentials) -> list[NatsUser]:
    """Every user of a home's embedded server: the services, and `cli` with every right."""
    users = [
        service_user(settings, name, credentials.nats_password(name))
        for name in NATS_USERS
        if name != CLI_USER
    ]
    users.append(NatsUser(CLI_USER, credentials.nats_password(CLI_USER)))
    return users
