"""Free ports: parallel test workers pick from disjoint slices, so two never race for one."""

from __future__ import annotations

import socket

import pytest

from hpc_ds1.infra.ports import _worker_slice, free_port


def test_a_free_port_can_be_bound_and_avoids_the_well_known_ones() -> None:
    port = free_port()
    assert port not in (4222, 5432, 8765)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


@pytest.mark.parametrize("worker", ["gw0", "gw1", "gw2"])
def test_each_worker_takes_only_its_own_slice(monkeypatch: pytest.MonkeyPatch, worker: str) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    index = int(worker[2:])
    assert {free_port() // 2 % 3 for _ in range(20)} == {index}


def test_two_workers_both_get_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    # bind() hands out even ports first: a slice by parity would leave gw1 none
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        assert {free_port() // 2 % 2 for _ in range(10)} == {int(worker[2:])}


def test_outside_a_worker_or_with_odd_variables_any_port_will_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "master")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "two")
    assert _worker_slice() == (0, 1)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    assert _worker_slice() == (0, 1)
