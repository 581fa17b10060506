"""The OpenMP wait policy of a launch: passive when its workers outnumber the usable CPUs
(a spinning thread holds a core another rank's thread needs), the user's own setting kept."""

from __future__ import annotations

import os

import pytest

from hpc_ds1.runner.api import job_env


@pytest.mark.parametrize(
    ("ranks", "threads", "cpus", "policy"),
    [
        (2, 2, 2, "PASSIVE"),  # 4 threads on 2 CPUs
        (1, 4, 2, "PASSIVE"),
        (1, 2, 2, None),  # one thread a CPU: spinning is the fast wait
        (2, 1, 2, None),
        (4, 1, 2, None),  # ranks of one thread: no OpenMP team waits at a barrier
        (2, 2, 4, None),
    ],
)
def test_passive_only_when_threads_outnumber_cpus(
    ranks: int, threads: int, cpus: int, policy: str | None
) -> None:
    env = job_env(threads, base={"PATH": "/usr/bin"}, ranks=ranks, cpus=cpus)
    assert env.get("OMP_WAIT_POLICY") == policy
    assert env["NUMBA_NUM_THREADS"] == str(threads)


def test_the_users_wait_policy_is_kept() -> None:
    env = job_env(2, base={"OMP_WAIT_POLICY": "active"}, ranks=2, cpus=2)
    assert env["OMP_WAIT_POLICY"] == "active"


def test_the_allocation_decides_by_default() -> None:
    # The usable CPUs are at most the box's: one thread more than it has outnumbers them.
    crowded = (os.cpu_count() or 1) + 1
    assert job_env(crowded, base={}, ranks=1)["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in job_env(1, base={}, ranks=1)
