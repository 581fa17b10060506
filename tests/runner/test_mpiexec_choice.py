"""Which mpiexec starts the ranks (issue 44): HPC_DS1_MPIEXEC, then an MPICH-compatible
mpiexec ahead of this environment's bin/ on PATH (a loaded module's), then the MPICH wheel's;
a foreign one (Open MPI's) is passed over while the wheel is there, since the wheel's mpi4py
cannot initialise under it. `choose_mpiexec` is pure in PATH, the setting and the Python it is
given: these tests build folders of fake mpiexecs and never ask the machine's MPI."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hpc_ds1.runner import launch

HYDRA = 'echo "HYDRA build details:"; echo "    Version:                  4.2.0"'
OPENRTE = 'echo "mpiexec (OpenRTE) 4.1.4"'
INTEL = 'echo "Intel(R) MPI Library for Linux* OS, Version 2021.13 Build 20240701"'


def fake(folder: Path, says: str = HYDRA, name: str = "mpiexec") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{says}\n")
    path.chmod(0o755)
    return str(path)


def pathvar(*folders: Path | str) -> str:
    return os.pathsep.join(str(f) for f in folders)


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A venv's bin/ holding the wheel's mpiexec; its python need not exist."""
    bindir = tmp_path / "venv" / "bin"
    fake(bindir)
    return bindir


def mpich_if_hydra(path: str) -> bool:
    """The probe without running anything: MPICH-compatible when its script says HYDRA."""
    return "HYDRA" in Path(path).read_text()


def choose(path: str, setting: str | None, bindir: Path) -> str:
    return launch.choose_mpiexec(path, setting, str(bindir / "python"), mpich_if_hydra)


def test_the_setting_wins_as_named(tmp_path: Path, venv: Path) -> None:
    module = tmp_path / "module" / "bin"
    fake(module)
    site = str(tmp_path / "not-even-there" / "mpiexec")
    assert choose(pathvar(module, venv), site, venv) == site
    assert choose(pathvar(module, venv), f"  {site}\n", venv) == site
    assert choose(pathvar(venv), "   ", venv) == str(venv / "mpiexec")  # blank: unset


def test_the_venv_first_on_path_wins_over_a_later_module(tmp_path: Path, venv: Path) -> None:
    module = tmp_path / "module" / "bin"
    fake(module)
    assert choose(pathvar(venv, module, "/usr/bin"), None, venv) == str(venv / "mpiexec")


def test_a_module_ahead_of_the_venv_wins(tmp_path: Path, venv: Path) -> None:
    module = tmp_path / "module" / "bin"
    site = fake(module)
    assert choose(pathvar(tmp_path / "empty", module, venv), None, venv) == site
    # the venv's bin not on PATH at all (hpc-ds1 run by its full path): the module still wins
    assert choose(pathvar(module), None, venv) == site


def test_an_intel_mpi_banner_is_mpich_compatible(tmp_path: Path, venv: Path) -> None:
    intel = fake(tmp_path / "intel" / "bin", INTEL)
    assert launch.mpich_compatible(intel)
    assert launch.choose_mpiexec(pathvar(Path(intel).parent), None, str(venv / "python")) == intel


def test_a_foreign_mpiexec_ahead_is_passed_over_for_the_wheel(tmp_path: Path, venv: Path) -> None:
    ompi = tmp_path / "openmpi" / "bin"
    fake(ompi, OPENRTE)
    assert choose(pathvar(ompi, venv), None, venv) == str(venv / "mpiexec")
    assert choose(pathvar(ompi), None, venv) == str(venv / "mpiexec")
    # an MPICH module after the foreign one, still ahead of ours, is taken
    module = tmp_path / "mpich" / "bin"
    site = fake(module)
    assert choose(pathvar(ompi, module, venv), None, venv) == site


def test_without_the_wheel_the_first_on_path_is_taken_whatever_it_is(tmp_path: Path) -> None:
    """HPC_DS1_NO_MPICH=1 installs: mpi4py then loads the site's libmpi, so the site's
    launcher is the right one even if it is Open MPI's; the probe is not even asked."""
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    ompi = tmp_path / "openmpi" / "bin"
    first = fake(ompi, OPENRTE)
    fake(tmp_path / "mpich" / "bin")

    def never(path: str) -> bool:
        raise AssertionError(f"asked about {path}")

    path = pathvar(bindir, ompi, tmp_path / "mpich" / "bin")
    assert launch.choose_mpiexec(path, None, str(bindir / "python"), never) == first
    # no MPI anywhere: the bare name, which check() reports as "no MPI found"
    assert launch.choose_mpiexec(pathvar(bindir), None, str(bindir / "python"), never) == "mpiexec"
    assert launch.choose_mpiexec(None, None, str(bindir / "python"), never) == "mpiexec"


def test_what_is_not_a_runnable_mpiexec_is_skipped(tmp_path: Path, venv: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "mpiexec").write_text("#!/bin/sh\necho HYDRA\n")  # not executable
    folder = tmp_path / "folder" / "mpiexec"
    folder.mkdir(parents=True)  # a folder of that name
    path = os.pathsep.join(["", str(plain), str(folder.parent), "", str(venv)])
    assert choose(path, None, venv) == str(venv / "mpiexec")


def test_the_venv_reached_through_a_link_ends_the_search(tmp_path: Path, venv: Path) -> None:
    link = tmp_path / "linked-bin"
    link.symlink_to(venv, target_is_directory=True)
    module = tmp_path / "module" / "bin"
    fake(module)
    assert choose(pathvar(link, module), None, venv) == str(venv / "mpiexec")


def test_the_probe_reads_mpiexec_version(tmp_path: Path) -> None:
    assert launch.mpich_compatible(fake(tmp_path / "a", HYDRA))
    assert not launch.mpich_compatible(fake(tmp_path / "b", OPENRTE))
    assert not launch.mpich_compatible(fake(tmp_path / "c", "exit 3"))
    assert not launch.mpich_compatible(str(tmp_path / "missing" / "mpiexec"))
    ours = Path(sys.executable).with_name("mpiexec")
    if ours.exists():  # the MPICH wheel of this environment
        assert launch.mpich_compatible(str(ours))


def test_mpiexec_path_reads_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "module" / "bin"
    site = fake(module)
    monkeypatch.delenv("HPC_DS1_MPIEXEC", raising=False)
    monkeypatch.setenv("PATH", pathvar(module, os.path.dirname(sys.executable), "/usr/bin"))
    assert launch.mpiexec_path() == site
    assert launch.prefix("mpiexec", 2, 1) == [site, "-n", "2"]
    named = fake(tmp_path / "named" / "bin")
    monkeypatch.setenv("HPC_DS1_MPIEXEC", named)
    assert launch.mpiexec_path() == named
