"""Typed events, their envelope and parsing from the wire."""

from .base import SUBJECT_TOKEN, Envelope, Event, envelope, new_id, subject_for, utcnow
from .catalog import (
    EVENT_TYPES,
    DecisionMade,
    DeviceLeft,
    DeviceRegistered,
    MeasurementRecorded,
    ModelPublished,
)
from .codec import MalformedEvent, decode, typed

__all__ = [
    "EVENT_TYPES",
    "SUBJECT_TOKEN",
    "DecisionMade",
    "DeviceLeft",
    "DeviceRegistered",
    "Envelope",
    "Event",
    "MalformedEvent",
    "MeasurementRecorded",
    "ModelPublished",
    "decode",
    "envelope",
    "new_id",
    "subject_for",
    "typed",
    "utcnow",
]
