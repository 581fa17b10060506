"""The event envelope and the base class of every typed event."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

# A subject token may not hold '.', '*', '>' or whitespace; ids become subject tokens.
SUBJECT_TOKEN = re.compile(r"^[A-Za-z0-9_\-:]+$")


def new_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(UTC)


class Event(BaseModel):
    """A typed event payload. Subclasses set `aggregate`, `name`, `version`, `id_field`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    aggregate: ClassVar[str]
    name: ClassVar[str]
    version: ClassVar[int] = 1
    id_field: ClassVar[str]

    @classmethod
    def event_type(cls) -> str:
        return f"{cls.aggregate}.{cls.name}"

    def aggregate_id(self) -> str:
        value = str(getattr(self, self.id_field))
        if not SUBJECT_TOKEN.match(value):
            raise ValueError(
                f"{self.id_field}={value!r} cannot be a subject token: "
                "use letters, digits, '_', '-' or ':'"
            )
        return value


class Envelope(BaseModel):
    """What travels on the wire: the common fields around one event's data."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=new_id, description="Unique; used as Nats-Msg-Id.")
    type: str = Field(description="'<aggregate>.<event>', e.g. 'device.registered'.")
    version: int = Field(ge=1)
    subject: str
    time: datetime = Field(default_factory=utcnow)
    actor: str = Field(description="Who caused it: a user name, 'auto', or a service.")
    source: str = Field(description="The service that emitted it.")
    correlation_id: str | None = None
    causation_id: str | None = None
    data: dict[str, Any]

    @field_validator("time")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    @property
    def aggregate(self) -> str:
        return self.type.split(".", 1)[0]

    @property
    def aggregate_id(self) -> str:
        return self.subject.split(".")[2]

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


def subject_for(prefix: str, event: Event) -> str:
    return f"{prefix}.{event.aggregate}.{event.aggregate_id()}.{event.name}"


def envelope(
    event: Event,
    *,
    actor: str,
    source: str,
    prefix: str = "hpcds1",
    correlation_id: str | None = None,
    causation_id: str | None = None,
    event_id: str | None = None,
) -> Envelope:
    """Wrap a typed event for publishing; the correlation id defaults to the event's own id.
    `event_id` (default: a new random id) is a deterministic one for an idempotent request."""
    event_id = event_id or new_id()
    return Envelope(
        id=event_id,
        type=event.event_type(),
        version=event.version,
        subject=subject_for(prefix, event),
        actor=actor,
        source=source,
        correlation_id=correlation_id or event_id,
        causation_id=causation_id,
        data=event.model_dump(mode="json"),
    )
