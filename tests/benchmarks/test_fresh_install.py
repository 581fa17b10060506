"""`pip install .` then `hpc-ds1 setup --quick` on a fresh venv (issue 44), the benchmark's
small mode: what pip resolves for this project without extras (the MPICH wheel by default,
none with HPC_DS1_NO_MPICH=1), and a real fresh venv whose quick setup of two small montecarlo
sizes runs to the end on the embedded default. The full run and its timings:
benchmarks/fresh_install.py (docs/slurm.md, "A site's MPI")."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.fresh_install import fresh_install, resolve
from hpc_ds1.runner import launch


def test_pip_resolves_the_mpich_wheel_by_default_and_leaves_it_out_when_asked() -> None:
    default = resolve()
    assert "mpich" in default and "mpi4py" in default and "hpc-ds1" in default
    without = resolve(no_mpich=True)
    assert "mpich" not in without and "mpi4py" in without
    assert set(default) - set(without) == {"mpich"}


def test_a_fresh_venv_without_extras_sets_up_to_the_end(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    result = fresh_install(venv, sizes="100000,200000", repeats=1)
    assert "mpich" in result.distributions and "hpc-ds1" in result.distributions
    # the wheel's mpiexec, unless an MPICH-compatible one is on this machine's PATH (a
    # foreign one, such as Debian's Open MPI in /usr/bin, is passed over)
    assert result.mpiexec is not None
    ours = str(venv / "bin" / "mpiexec")
    assert result.mpiexec == ours or launch.mpich_compatible(result.mpiexec)
    setup = result.setup
    assert setup["measured"] == setup["planned"] > 0 and setup["by_status"] == {
        "ok": setup["measured"]
    }
    model = setup["model"]
    assert isinstance(model, dict) and Path(model["path"]).is_file()
    assert os.path.commonpath([model["path"], str(venv / "home")]) == str(venv / "home")
