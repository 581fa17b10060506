"""Which way `serve` runs its services: the flag or HPC_DS1_SERVE_MODE when given, else its own
process each where 2 or more CPUs are usable and one process on a single CPU."""

from __future__ import annotations

import pytest

from hpc_ds1.cli.serve import use_processes
from hpc_ds1.machine import allocation


def test_an_explicit_mode_is_kept() -> None:
    assert use_processes("processes") is True
    assert use_processes("one-process") is False


@pytest.mark.parametrize(("cpus", "separate"), [(1, False), (2, True), (64, True)])
def test_auto_follows_the_usable_cpus(
    monkeypatch: pytest.MonkeyPatch, cpus: int, separate: bool
) -> None:
    limited = allocation.Allocation(logical=64, affinity=cpus, quota=None, slurm=None)
    monkeypatch.setattr(allocation, "detect", lambda: limited)
    assert use_processes("auto") is separate
