"""Ranks started by srun: the pip MPICH's mpi4py initialises under `srun --mpi=pmi2` (PMI-2 from
Slurm), and `hpc-ds1 run --launcher srun` runs a job as a Slurm job step, against the real
single-node Slurm of the session. The launcher's argv needs no Slurm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_ds1.runner import InvalidJob, launch, run
from hpc_ds1.space import Config
from tests.slurm.cluster import SlurmCluster
from tests.support.commands import HPC_DS1

MPI_PROBE = (
    "from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "print(c.Get_rank(), c.Get_size(), c.allreduce(c.Get_rank() + 1), flush=True)"
)


def test_srun_argv_asks_for_the_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.delenv("SLURM_MPI_TYPE", raising=False)
    monkeypatch.setenv("SLURM_JOB_CPUS_PER_NODE", "4(x2),2")  # 10 CPUs in the allocation
    argv = launch.prefix("srun", 2, 5)
    assert argv[:6] == ["srun", "-n", "2", "--cpus-per-task", "5", "--job-name=hpc-ds1-run"]
    assert "--mpi=pmi2" in argv and "--overcommit" not in argv
    assert "--overcommit" in launch.prefix("srun", 3, 4)  # 12 > 10: oversubscribed
    monkeypatch.setenv("SLURM_MPI_TYPE", "pmix")  # the site's choice: srun reads it itself
    assert not any(a.startswith("--mpi") for a in launch.prefix("srun", 2, 1))


def test_mpiexec_is_the_sites_when_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HPC_DS1_MPIEXEC", raising=False)
    # this venv's bin/ first on PATH (as activated): no site module's mpiexec comes ahead of it
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.defpath]))
    assert launch.prefix("mpiexec", 3, 1)[1:] == ["-n", "3"]
    assert launch.mpiexec_path().startswith(sys.prefix)  # the pip MPICH's, next to Python
    site = tmp_path / "site" / "bin" / "mpiexec"  # a site MPI's, as a module puts it
    site.parent.mkdir(parents=True)
    site.write_text("#!/bin/sh\n")
    site.chmod(0o755)
    monkeypatch.setenv("HPC_DS1_MPIEXEC", str(site))
    assert launch.prefix("mpiexec", 3, 1) == [str(site), "-n", "3"]


def test_an_unknown_or_missing_launcher_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidJob, match="launcher 'pbs' is not one of mpiexec, srun"):
        run("montecarlo", 1000, Config(ranks=1, threads=1, tile=1024), launcher="pbs")
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    with pytest.raises(InvalidJob, match="srun is not on PATH"):
        run("montecarlo", 1000, Config(ranks=1, threads=1, tile=1024), launcher="srun")
    monkeypatch.setenv("HPC_DS1_LAUNCHER", "slurm")
    bad = subprocess.run(
        [HPC_DS1, "run", "--workload", "montecarlo", "--size", "1000", "--launcher", "slurm"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "invalid choice: 'slurm'" in bad.stderr


def test_mpi_initialises_under_srun_with_pmi2(slurm: SlurmCluster) -> None:
    done = subprocess.run(
        ["srun", "-n", "2", "--mpi=pmi2", sys.executable, "-c", MPI_PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env=slurm.env,
    )
    assert done.returncode == 0, done.stderr
    # One MPI job of two ranks (not two singletons of one rank each).
    assert sorted(done.stdout.split("\n")[:2]) == ["0 2 3", "1 2 3"], done.stdout


def test_run_with_the_srun_launcher_is_a_slurm_job_step(slurm: SlurmCluster) -> None:
    done = subprocess.run(
        [
            *(HPC_DS1, "run", "--workload", "montecarlo", "--size", "100000"),
            *("--ranks", "2", "--threads", "1", "--repeats", "1", "--launcher", "srun"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=slurm.env,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    result = json.loads(done.stdout)
    assert result["status"] == "ok" and result["check_ok"] is True, result
    assert result["command"].startswith("srun -n 2 --cpus-per-task 1 "), result
    assert "--mpi=pmi2" in result["command"], result
    # Slurm has it on record: a job of two tasks under the runner's name.
    jobs = subprocess.run(
        ["scontrol", "show", "job", "-o"], capture_output=True, text=True, env=slurm.env
    ).stdout
    assert any(
        f"JobName={launch.JOB_NAME} " in line
        and "JobState=COMPLETED" in line
        and "NumTasks=2 " in line
        for line in jobs.splitlines()
    ), jobs
