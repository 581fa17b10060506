"""Old events read by new code: upcasters (issue 46, item 4).

An event type's `version` goes up when the shape of its data changes in a way old data does not
fit: a field renamed, split or made required. The change comes with an upcaster from the old
version to the new one, registered here. `typed` runs the chain, v1 to v2 to v3, before it
validates, so the log never has to be rewritten. An added optional field needs no new version:
old data fits the new model as it is.

Nothing is registered yet: every event type is still at the version it was first written with.
`tests/events/test_upcast.py` checks the mechanism, and `tests/upgrade` checks a home of the
previous release."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

# (event type, version it reads) -> the data at the next version.
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def upcaster(event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register `fn` as the step from `from_version` to `from_version + 1` of `event_type`."""

    def register(fn: Upcaster) -> Upcaster:
        key = (event_type, from_version)
        if key in UPCASTERS:
            raise ValueError(f"{event_type} already has an upcaster from version {from_version}")
        UPCASTERS[key] = fn
        return fn

    return register


def upcast(
    event_type: str,
    version: int,
    data: dict[str, Any],
    target: int,
    registry: Mapping[tuple[str, int], Upcaster] | None = None,
) -> tuple[int, dict[str, Any]]:
    """`data` of `event_type` at `version`, carried as far towards `target` as the registered
    steps go: (the version reached, the data there)."""
    steps = UPCASTERS if registry is None else registry
    while version < target and (event_type, version) in steps:
        data = steps[(event_type, version)](dict(data))
        version += 1
    return version, data
