"""From wire bytes to an envelope, and from an envelope to its typed event."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from .base import Envelope, Event
from .catalog import EVENT_TYPES
from .upcast import upcast


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


# What every envelope the services write looks like: each field present with its plain JSON
# type and the time as `datetime.isoformat()` or pydantic write it. Such an envelope is built
# from an already parsed message without validating it again; anything else goes through
# `decode`, which accepts or refuses it as before.
_ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?(?:Z|[+-]\d\d:\d\d)?\Z")
_ORDER = tuple(Envelope.model_fields)
_KEYS = frozenset(_ORDER)
_OPTIONAL = frozenset(("correlation_id", "causation_id"))
_REQUIRED = _KEYS - _OPTIONAL


def envelope_of(parsed: Any, subject: str) -> Envelope | None:
    """The envelope of a message already parsed as JSON (orjson), when it has the exact shape
    the services write and `subject` as its subject; None otherwise (then `decode` it)."""
    if not isinstance(parsed, dict):
        return None
    keys = tuple(parsed)
    if keys == _ORDER:  # every field, in the model's order: as the services write it
        fields = dict(parsed)
    elif _KEYS.issuperset(keys) and _REQUIRED.issubset(keys):
        # In the model's field order: pydantic writes a constructed model's JSON in that order.
        fields = {name: parsed.get(name) for name in _ORDER}
    else:
        return None
    if fields["subject"] != subject:
        return None
    if not (
        type(fields["id"]) is str
        and type(fields["type"]) is str
        and type(fields["subject"]) is str
        and type(fields["actor"]) is str
        and type(fields["source"]) is str
    ):
        return None
    correlation, causation = fields["correlation_id"], fields["causation_id"]
    if (correlation is not None and type(correlation) is not str) or (
        causation is not None and type(causation) is not str
    ):
        return None
    version, data, when = fields["version"], fields["data"], fields["time"]
    if type(version) is not int or version < 1 or type(data) is not dict:
        return None
    if type(when) is not str or not _ISO_TIME.match(when):
        return None
    try:
        time = datetime.fromisoformat(when)
    except ValueError:
        return None
    fields["time"] = time if time.tzinfo else time.replace(tzinfo=UTC)
    # What Envelope.model_construct(**parsed) makes (defaults filled, no extra, no private
    # attribute), without its per-field loop: a twentieth of the projector's time per event.
    # The tests compare the result with decode's, so a pydantic that lays models out
    # differently fails them rather than the projector.
    env = _new(Envelope)
    _set(env, "__dict__", fields)
    _set(env, "__pydantic_fields_set__", set(keys))
    _set(env, "__pydantic_extra__", None)
    _set(env, "__pydantic_private__", None)
    return env


_new = Envelope.__new__
_set = object.__setattr__


def typed(env: Envelope) -> Event | None:
    """The typed event, None for a type this version does not know; raises on bad data."""
    cls = EVENT_TYPES.get(env.type)
    if cls is None:
        return None
    data = env.data
    if env.version > cls.version:
        raise MalformedEvent(
            f"{env.type} version {env.version} was written by a newer release (this one reads "
            f"up to {cls.version})"
        )
    if env.version < cls.version:
        reached, data = upcast(env.type, env.version, env.data, cls.version)
        if reached != cls.version:
            raise MalformedEvent(
                f"{env.type} version {env.version}: no upcaster from version {reached} to "
                f"{cls.version} (hpc_ds1.events.upcast)"
            )
    try:
        return cls.model_validate(data)
    except ValidationError as error:
        raise MalformedEvent(f"{env.type}: {_first_error(error)}") from None


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(root)"
    return f"{where}: {first['msg']} ({error.error_count()} error(s))"
