"""Without an MPI (the `mpich` extra not installed, no site module loaded) a run says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_ds1.runner import launch
from hpc_ds1.runner.api import InvalidJob, Job, run_many
from hpc_ds1.space import Config


def test_a_missing_mpiexec_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no-such-mpi" / "mpiexec"
    monkeypatch.setenv("HPC_DS1_MPIEXEC", str(missing))
    with pytest.raises(launch.LauncherError, match="no MPI found") as error:
        launch.check("mpiexec")
    assert "mpich` extra" in str(error.value) and "module" in str(error.value)
    assert str(missing) in str(error.value)
    job = Job(workload="gemm", size=32, config=Config(ranks=1, threads=1, tile=32))
    with pytest.raises(InvalidJob, match="no MPI found"):
        run_many([job], launcher="mpiexec")


def test_the_installed_mpiexec_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPC_DS1_MPIEXEC", raising=False)
    assert launch.check("mpiexec") == "mpiexec"  # the pip MPICH of this environment
