"""A real single-node Slurm (tests/slurm/cluster.py), started once for the session as root;
every test here skips, saying why, when that cannot be (not root, the packages absent: as
root, deploy/install-slurm.sh installs them). SLURM_CONF points the client commands (srun,
sbatch, sinfo) and what the tests start at it while it runs."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.slurm.cluster import SlurmCluster, missing


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    why = missing()
    if why is not None:
        pytest.skip(f"no Slurm here: {why}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    with cluster, pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(cluster.conf))
        yield cluster
    left = cluster.own_processes()
    assert not left, f"Slurm processes left behind: {[p.pid for p in left]}"
    assert os.environ.get("SLURM_CONF") != str(cluster.conf)
