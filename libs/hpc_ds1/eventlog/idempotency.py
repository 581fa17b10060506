"""Idempotent retries of creating requests (`Idempotency-Key`, as Stripe's API and the IETF draft
"The Idempotency-Key HTTP Header Field").

A client sends `Idempotency-Key: <key>` on POST /v1/decide or POST /v1/tasks. The key, scoped
by the caller's token id and the route, becomes a deterministic id (UUIDv5): the id of the
created thing (decision_id, task_id) and of its event (the envelope id, hence Nats-Msg-Id).
The event is appended with `Nats-Expected-Last-Subject-Sequence: 0` over its own aggregate and
carries the SHA-256 of the request (`Hpc-Request-Sha256`) in a header, so:

- a retry finds the original by its subject before doing anything (no second real run);
- a decision replica claims the id before it runs the job (hpc_ds1.eventlog.claims), so a copy on
  another replica waits for that one's event instead of running the job again;
- two copies racing each other: the second append is dropped by JetStream's duplicate window
  (PubAck.duplicate, the original's sequence) or, past the window, refused by the sequence
  check; either way the caller is answered with the original, read back from the stream;
- the same key with a different request is refused (KeyReused);
- a key is remembered as long as the log keeps the event: the EVENTS stream discards nothing.

A key of one token never reaches another token's event: the id is derived from the token id."""

from __future__ import annotations

import base64
import hashlib
import re
import uuid
from dataclasses import dataclass
from typing import Any, Final

import orjson
from nats.js.api import RawStreamMsg

from ..events import Envelope
from .bus import ConcurrencyConflict, EventBus

HEADER: Final = "Idempotency-Key"
KEY_PATTERN: Final = re.compile(r"^[A-Za-z0-9_.:~+/=\-]{1,255}$")
KEY_RULE: Final = (
    "1 to 255 of letters, digits, '-', '_', '.', ':', '~', '+', '/' or '=' "
    "(e.g. a UUID), optionally in double quotes"
)
# NATS headers between services and on the stored event.
ID_HEADER: Final = "Hpc-Idempotency-Id"  # gateway -> service: the derived id
HASH_HEADER: Final = "Hpc-Request-Sha256"  # on the stored event: what was asked
REPLY_HEADER: Final = "Hpc-Reply"  # on the stored event: the reply's extras (base64 JSON)
_NAMESPACE: Final = uuid.UUID("6f0c6a2e-6a52-4f0e-9b7e-1d5b9a2f3c41")


class InvalidKey(ValueError):
    """An Idempotency-Key header that is not 1-255 characters of the accepted alphabet."""


class KeyReused(Exception):
    """The key was used before by the same caller for a different request."""

    def __init__(self) -> None:
        super().__init__(
            f"this {HEADER} was used for a different request: send a new key for a new "
            "request, or the same request to get the original answer"
        )


def parse_key(value: str) -> str:
    """The key from an Idempotency-Key header (the draft's quoted string form is accepted too);
    InvalidKey names the accepted form."""
    key = value.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not KEY_PATTERN.match(key):
        raise InvalidKey(f"invalid {HEADER} header: use {KEY_RULE}")
    return key


def derived_id(principal: str, route: str, key: str) -> str:
    """The id a key names for one caller and route: 32 hex digits (UUIDv5), a subject token."""
    return uuid.uuid5(_NAMESPACE, f"{principal}\n{route}\n{key}").hex


def request_sha256(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


@dataclass(frozen=True)
class Stored:
    """The event a key created, as read back from the stream."""

    seq: int
    envelope: dict[str, Any]
    extras: dict[str, Any] | None  # what the first reply said beyond the event, if stored


def _stored(msg: RawStreamMsg, request_hash: str) -> Stored:
    headers = msg.headers or {}
    found = headers.get(HASH_HEADER)
    if found is not None and found != request_hash:
        raise KeyReused
    raw = headers.get(REPLY_HEADER)
    extras = orjson.loads(base64.b64decode(raw)) if raw else None
    return Stored(int(msg.seq or 0), orjson.loads(msg.data or b"{}"), extras)


async def find(bus: EventBus, subject: str, request_hash: str) -> Stored | None:
    """The event already appended under this subject (its key's), or None; KeyReused when it
    was made for a different request."""
    msg = await bus.stored(subject=subject)
    return None if msg is None else _stored(msg, request_hash)


async def append_once(
    bus: EventBus, env: Envelope, request_hash: str, extras: dict[str, Any] | None = None
) -> Stored | None:
    """Append `env` (its id derived from a key) as its aggregate's first event; None when it
    was appended, the original when a copy was there first (KeyReused if for another request)."""
    headers = {HASH_HEADER: request_hash}
    if extras is not None:
        # As the reply is sent (services answer with default=str), so a replay reads the same.
        headers[REPLY_HEADER] = base64.b64encode(orjson.dumps(extras, default=str)).decode()
    try:
        ack = await bus.append(env, expected_version=0, headers=headers)
    except ConcurrencyConflict:  # past the duplicate window: the subject already holds one
        original = await find(bus, env.subject, request_hash)
        if original is None:
            raise
        return original
    if not ack.duplicate:
        return None
    msg = await bus.stored(seq=int(ack.seq))
    if msg is None:
        raise RuntimeError(f"the log answered duplicate of sequence {ack.seq} but holds none")
    return _stored(msg, request_hash)
