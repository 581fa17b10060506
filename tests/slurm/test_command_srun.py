"""A TOML command workload (the C/OpenMP heat program) with launcher "mpi" runs its ranks as a
Slurm job step when the runner's launcher is srun, against the session's real Slurm."""

from __future__ import annotations

from pathlib import Path

from hpc_ds1.runner import Status, run
from hpc_ds1.space import Config
from hpc_ds1.workloads import load_workload_file
from tests.slurm.cluster import SlurmCluster
from tests.workloads.heatapp import build_heat, write_heat_toml


def test_a_command_workload_runs_as_a_job_step(slurm: SlurmCluster, tmp_path: Path) -> None:
    build_heat(tmp_path)
    wl = load_workload_file(write_heat_toml(tmp_path, "heat-srun"))
    r = run(wl, 64, Config(ranks=2, threads=1, tile=16), repeats=1, launcher="srun")
    assert r.status is Status.OK, r.error
    assert r.command.startswith("srun -n 2 --cpus-per-task 1")
    # Both ranks printed their strip's result (two matches: SLURM_PROCID 0 and 1).
    assert r.check_ok and "largest of 2 value(s)" in r.check_detail
