"""Each application's own MPI: the environment and the `mpirun` of a launch, with nothing of
the other MPI implementation in it (issue 44).

Our MPI is MPICH (the pip wheel next to this Python, or a site's through HPC_DS1_MPIEXEC); a
Debian application (hpcc, cp2k, ...) is built against Open MPI and must be started by Open
MPI's own `mpirun`. Mixing them fails in confusing ways: MPICH's `mpiexec` found first on PATH,
its libmpi.so first on LD_LIBRARY_PATH, or a PMI_/HYDRA_ variable of an MPICH launch read by
the other runtime. `mpi_env` is the one pure function that takes them out; `ours` says which
folders are ours, and `openmpi_argv` builds Open MPI's launch."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

Implementation = Literal["openmpi", "mpich"]
# Variables each implementation's launcher and runtime set or read.
MPICH_PREFIXES = ("MPIR_", "MPICH_", "HYDRA_", "PMI_")
OPENMPI_PREFIXES = ("OMPI_", "PMIX_", "OPAL_", "ORTE_", "PRTE_")
# Folders never taken off PATH: the system's own (an implementation there is the system's).
SYSTEM_DIRS = frozenset({"/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin"})
# Open MPI's launcher by the names it has beside another MPI: Debian's alternative first.
OPENMPI_NAMES = ("mpirun.openmpi", "orterun", "mpirun")
OPENMPI_PACKAGE = "openmpi-bin"


def _norm(entry: str) -> str:
    return os.path.normpath(entry) if entry else entry


def _under(entry: str, folders: Sequence[str]) -> bool:
    path = _norm(entry)
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def mpi_env(
    env: Mapping[str, str], implementation: Implementation, foreign: Sequence[str] = ()
) -> dict[str, str]:
    """`env` for a launch by `implementation`, without the other implementation's variables
    (MPICH/Hydra's MPIR_ MPICH_ HYDRA_ PMI_ for Open MPI; Open MPI's OMPI_ PMIX_ OPAL_ ORTE_
    PRTE_ for MPICH) and without the PATH and LD_LIBRARY_PATH entries in or under the other
    implementation's folders `foreign` (system folders such as /usr/bin stay on PATH)."""
    drop = MPICH_PREFIXES if implementation == "openmpi" else OPENMPI_PREFIXES
    folders = [_norm(f) for f in foreign if f]
    out = {k: v for k, v in env.items() if not k.startswith(drop)}
    for var, keep_system in (("PATH", True), ("LD_LIBRARY_PATH", False)):
        if var not in out:
            continue
        kept = [
            e
            for e in out[var].split(os.pathsep)
            if e and ((keep_system and _norm(e) in SYSTEM_DIRS) or not _under(e, folders))
        ]
        if kept:
            out[var] = os.pathsep.join(kept)
        else:
            del out[var]
    return out


def ours(mpiexec: str | None = None) -> list[str]:
    """The folders of our MPICH: its mpiexec's folder and that folder's ../lib and ../lib64
    (the wheel's libmpi.so lives in the venv's lib/). A system folder is not ours alone:
    /usr/bin is left out (mpi_env keeps it on PATH), and then so are /usr/lib*."""
    if mpiexec is None:
        from hpc_ds1.runner.launch import mpiexec_path

        mpiexec = mpiexec_path()
    found = shutil.which(mpiexec) if os.sep not in mpiexec else mpiexec
    local = Path(sys.executable).with_name("mpiexec")
    folders = {str(local.parent)} if local.exists() else set()
    if found:
        folders.add(os.path.dirname(os.path.abspath(found)))
    out: list[str] = []
    for folder in sorted(folders):
        if _norm(folder) in SYSTEM_DIRS:
            continue
        prefix = os.path.dirname(folder)
        out += [folder, os.path.join(prefix, "lib"), os.path.join(prefix, "lib64")]
    return out


def openmpi_mpirun(path: str | None) -> str | None:
    """Open MPI's mpirun on `path` (a PATH already without our MPICH), or None."""
    for name in OPENMPI_NAMES:
        found = shutil.which(name, path=path or os.defpath)
        if found:
            return found
    return None


def openmpi_argv(
    mpirun: str, ranks: int, bind_to: str = "none", root: bool | None = None
) -> list[str]:
    """Open MPI's launch of `ranks` copies: oversubscribed (the tuner tries more ranks than
    CPUs), allowed to run as root when this is root, binding off unless a knob says so. A
    binding is allowed to overload a core: Open MPI refuses to bind more ranks than cores
    otherwise ("more processes than cpus to bind", measured with 3 ranks on 2 cores)."""
    if root is None:
        root = os.geteuid() == 0
    argv = [mpirun, *(["--allow-run-as-root"] if root else [])]
    bind = bind_to if bind_to == "none" else f"{bind_to}:overload-allowed"
    return [*argv, "--oversubscribe", "-np", str(ranks), "--bind-to", bind]
