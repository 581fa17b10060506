"""A second real application (issue 44, item 1): Debian's NWChem, its plane-wave DFT (PSPW) of
a water molecule, under Open MPI's own mpirun, from examples/workloads/nwchem.toml: the size
is the wavefunction cutoff, the knobs its parallel FFT mapping and its minimizer. Run under 2
ranks here; set up, decided for and tuned for real in the slow tier.

`make install` installs NWChem (deploy/install-apps.sh); without it the tests that run it
skip."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from hpc_ds1.runner import Status, run
from hpc_ds1.runner.command import command_argv, command_env
from hpc_ds1.settings import Settings
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import CommandWorkload, load_workload_file
from tests.support.commands import HPC_DS1, run_hpc

ROOT = Path(__file__).resolve().parents[2]
NWCHEM_TOML = ROOT / "examples" / "workloads" / "nwchem.toml"
needs_nwchem = pytest.mark.skipif(
    shutil.which("nwchem") is None or shutil.which("mpirun.openmpi") is None,
    reason="Debian's nwchem (and its Open MPI mpirun) is not installed: `make apps` as root "
    "(deploy/install-apps.sh) installs it",
)


def _nwchem() -> CommandWorkload:
    wl = load_workload_file(NWCHEM_TOML)
    assert isinstance(wl, CommandWorkload)
    return wl


def _space(wl: CommandWorkload) -> ConfigSpace:
    return ConfigSpace.for_cpus(2, wl.tiles, 0, knobs=wl.knobs, constraints=wl.constraints)


def test_the_example_file_parses_with_its_knobs_input_and_package() -> None:
    wl = _nwchem()
    assert (wl.name, wl.launcher, wl.package, wl.timeout_s) == ("nwchem", "openmpi", "nwchem", 600)
    assert [k.name for k in wl.knobs] == ["mapping", "minimizer"]
    assert [n for n, _ in wl.inputs] == ["water.nw"] and wl.output == ""
    assert {c.threads for c in _space(wl).configs()} == {1}
    config = Config(ranks=2, threads=1, tile=1, knobs={"mapping": 1, "minimizer": "cg"})
    values = wl.values(config, 6)
    text = wl.input_files(values)["water.nw"]
    assert "  cutoff 6\n  mapping 1\n  cg\n" in text
    env = command_env(wl, values)
    assert env["OMPI_MCA_mpi_yield_when_idle"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert not [k for k in env if k.startswith(("MPICH_", "HYDRA_", "PMI_"))]
    argv = command_argv(wl, values, env={"PATH": "/usr/bin:/bin"})
    if shutil.which("mpirun.openmpi", path="/usr/bin:/bin"):
        assert argv[-7:] == ["--oversubscribe", "-np", "2", "--bind-to", "none", "nwchem",
                             "water.nw"]  # fmt: skip


def test_workloads_check_names_the_missing_package(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(tmp_path / "home"), PATH=str(tmp_path))  # no nwchem, no mpirun
    bare = subprocess.run(
        [HPC_DS1, "workloads", "--check", str(NWCHEM_TOML)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bare.returncode == 1, bare.stdout + bare.stderr
    assert "missing here: nwchem is not installed (not on PATH): install nwchem" in bare.stdout


@needs_nwchem
def test_nwchem_runs_under_two_ranks_with_its_own_mpirun() -> None:
    wl = _nwchem()
    config = Config(ranks=2, threads=1, tile=1, knobs={"mapping": 1, "minimizer": "lmbfgs"})
    started = time.monotonic()
    result = run(wl, 4, config, repeats=1, space=_space(wl))
    took = time.monotonic() - started
    assert result.status is Status.OK, result.error
    assert re.search(r"mpirun\.openmpi .*-np 2 --bind-to none nwchem water\.nw$", result.command)
    # NWChem's own wall time (under the whole run's), its SCF's convergence read back
    assert result.runtime_s is not None and 0 < result.runtime_s < took
    assert result.check_ok and "tolerance ok" in result.check_detail


@needs_nwchem
@pytest.mark.slow
def test_setup_decide_and_tune_nwchem_for_real(settings: Settings) -> None:
    folder = settings.home / "workloads"
    (folder / "nwchem").mkdir(parents=True)
    shutil.copy(NWCHEM_TOML.parent / "nwchem" / "water.nw", folder / "nwchem" / "water.nw")
    text = NWCHEM_TOML.read_text().replace("sizes = [4, 6, 8]", "sizes = [4, 6]")
    (folder / "nwchem.toml").write_text(text.replace("held_out = [5, 7]", "held_out = [5]"))
    timings = {}

    def hpc(*args: str) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        done = run_hpc(settings, *args, timeout=400)
        timings[args[0]] = round(time.monotonic() - started, 1)
        assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
        return done

    setup = hpc("setup", "--workload", "nwchem", "--budget", "6", "--repeats", "1")
    assert "measured 6 runs" in setup.stdout and "trained model" in setup.stdout, setup.stdout
    decided = hpc(
        "decide", "--workload", "nwchem", "--size", "5", "--ranks", "1", "--threads", "1",
        "--knob", "mapping=2", "--knob", "minimizer=lmbfgs",
    )  # fmt: skip
    assert "ran for real" in decided.stdout and "choice" in decided.stdout, decided.stdout
    tuned = hpc("tune", "--workload", "nwchem", "--size", "5", "--no-wait",
                "--start", "ranks=1,threads=1,mapping=2,minimizer=lmbfgs")  # fmt: skip
    assert re.search(
        r"^0 +\(start\) +ranks=1 threads=1 tile=1 mapping=2 minimizer=lmbfgs +[0-9.]+ s +ok",
        tuned.stdout,
        re.M,
    ), tuned.stdout
    print("timings (s):", timings)
