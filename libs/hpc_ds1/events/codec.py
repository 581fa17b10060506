"""From wire bytes to an envelope, and from an envelope to its typed event."""

from __future__ import annotations

from pydantic import ValidationError

from .base import Envelope, Event
from .catalog import EVENT_TYPES


class MalformedEvent(ValueError):
    """The bytes are not an envelope, or its data does not fit its declared type."""


def decode(raw: bytes, subject: str | None = None) -> Envelope:
    try:
        env = Envelope.model_validate_json(raw)
    except ValidationError as error:
        raise MalformedEvent(f"not an event envelope: {_first_error(error)}") from None
    if subject is not None and env.subject != subject:
        raise MalformedEvent(f"envelope subject {env.subject!r} != message subject {subject!r}")
    return env


def typed(env: Envelope) -> Event | None:
    """The typed event, None for a type this version does not know; raises on bad data."""
    cls = EVENT_TYPES.get(env.type)
    if cls is None:
        return None
    if env.version != cls.version:
        raise MalformedEvent(f"{env.type} version {env.version} (this build knows {cls.version})")
    try:
        return cls.model_validate(env.data)
    except ValidationError as error:
        raise MalformedEvent(f"{env.type}: {_first_error(error)}") from None


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(root)"
    return f"{where}: {first['msg']} ({error.error_count()} error(s))"
