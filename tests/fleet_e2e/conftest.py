"""The fleet end-to-end tests' fixtures: network namespaces checked once, and one real fleet per
module (tests/fleet_e2e/netns.py says what it is made of)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .netns import Fleet, netns_unavailable, remove_leftovers, running_fleet


@pytest.fixture(scope="session")
def netns_ok() -> None:
    why = netns_unavailable()
    if why:
        pytest.skip(f"the fleet end-to-end tests need network namespaces: {why}")
    remove_leftovers()


@pytest.fixture(scope="module")
def fleet(netns_ok: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("fleet")) as running:
        yield running
