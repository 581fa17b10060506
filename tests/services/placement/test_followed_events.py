"""Placement's consumer follows only the aggregates its fold reads (FleetState.FOLDED_AGGREGATES):
an event of any other aggregate must change nothing in the fold, or filtering it out would
lose something."""

from __future__ import annotations

import pytest

from hpc_ds1.events.catalog import EVENT_TYPES
from hpc_ds1.fleet.placement import Change, FleetState

OUTSIDE = sorted(
    (name, cls)
    for name, cls in EVENT_TYPES.items()
    if cls.aggregate not in FleetState.FOLDED_AGGREGATES
)


def test_the_filter_leaves_out_the_high_volume_aggregates() -> None:
    left_out = {cls.aggregate for _, cls in OUTSIDE}
    assert {"decision", "session", "token"} <= left_out


@pytest.mark.parametrize(("name", "cls"), OUTSIDE, ids=[n for n, _ in OUTSIDE])
def test_an_event_outside_the_filter_changes_nothing(name: str, cls: type) -> None:
    state = FleetState()
    assert state.apply(1, cls.model_construct(), 0.0) == Change(), name
    assert state == FleetState()
