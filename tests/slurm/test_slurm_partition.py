"""fleet/slurm.py against the session's real Slurm, without a coordinator: an attempt the node
refuses comes back as that refusal (with its job id), a cancelled attempt is cancelled in Slurm
too, and a bad partition name is refused before anything is submitted."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from hpc_ds1.fleet.slurm import SlurmPartition
from hpc_ds1.machine.devicelock import Cancelled
from hpc_ds1.space import Config
from tests.slurm.cluster import SlurmCluster

CONFIG = Config(ranks=1, threads=1, tile=1024)


def test_a_bad_partition_name_is_refused() -> None:
    with pytest.raises(ValueError, match="is not a Slurm partition name"):
        SlurmPartition("a b", Path("/nonexistent"))


def test_the_nodes_refusal_comes_back_with_its_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    partition = SlurmPartition(slurm.partition, tmp_path)
    outcome = partition.run("refused", 1, "no-such-workload", 1000, CONFIG, repeats=1, max_run_s=60)
    assert outcome.result is None and outcome.job_id is not None
    assert outcome.error is not None and "the node refused it" in outcome.error, outcome
    assert "no-such-workload" in outcome.error
    assert partition.state(outcome.job_id) == "COMPLETED"


def test_a_cancelled_attempt_is_cancelled_in_slurm(slurm: SlurmCluster, tmp_path: Path) -> None:
    partition = SlurmPartition(slurm.partition, tmp_path)
    cancel = threading.Event()
    submitted: list[str] = []
    original = partition.wait

    def wait(job_id: str, deadline: float, event: threading.Event | None) -> str:
        submitted.append(job_id)
        threading.Timer(1.0, cancel.set).start()  # the agent stops while the job runs
        return original(job_id, deadline, event)

    partition.wait = wait  # type: ignore[method-assign]
    with pytest.raises(Cancelled, match="cancelled while Slurm job"):
        partition.run(
            "long", 1, "montecarlo", 10**10, CONFIG, repeats=1, max_run_s=600, cancel=cancel
        )
    (job_id,) = submitted
    for _ in range(100):
        if partition.state(job_id) == "CANCELLED":
            break
        time.sleep(0.1)
    assert partition.state(job_id) == "CANCELLED"
