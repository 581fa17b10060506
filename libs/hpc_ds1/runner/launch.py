"""How a job's ranks are started: `mpiexec -n R` (the default) or, inside or through Slurm,
`srun -n R --cpus-per-task T` (a job step of the allocation the command runs in, or a new
allocation when there is none).

MPI inside ranks started by srun: MPICH's own PMI client speaks PMI-2 over the socket that
Slurm's `mpi/pmi2` plugin hands each task, so `srun --mpi=pmi2` starts mpi4py on the pip MPICH
wheel as well as on a site MPICH (measured: a 4-rank allreduce under Debian's Slurm 22.05).
`--mpi=pmix` needs a PMIx-enabled MPI (the wheel has none); a site that wants another plugin
sets SLURM_MPI_TYPE, which srun reads itself and which then wins over the default here.

mpiexec: HPC_DS1_MPIEXEC when set (a site MPI), else the one next to this Python (the pip
MPICH), else `mpiexec` on PATH (a site module's). Inside an allocation the pip MPICH's hydra
starts its proxies with srun by itself, so `mpiexec` works there too."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Literal, get_args

Launcher = Literal["mpiexec", "srun"]
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
SRUN_MPI = "pmi2"
JOB_NAME = "hpc-ds1-run"


# The MPICH wheel is the `mpich` extra (a site may have its own MPI): without either, say so.
NO_MPI = (
    "no MPI found ({mpiexec} is not installed): install the `mpich` extra "
    "(pip install 'hpc-ds1[mpich]'), or load your site's MPI module (e.g. `module load mpich`) "
    "or set HPC_DS1_MPIEXEC to its mpiexec, or use --launcher srun inside Slurm"
)


class LauncherError(ValueError):
    """A launcher that cannot be used here (unknown, or its program is not installed)."""


def mpiexec_path() -> str:
    """HPC_DS1_MPIEXEC (a site MPI), else this environment's mpiexec, else the one on PATH."""
    from hpc_ds1.settings import Settings

    site = (Settings().mpiexec or "").strip()
    if site:
        return site
    local = Path(sys.executable).with_name("mpiexec")
    return str(local) if local.exists() else "mpiexec"


def default_launcher() -> Launcher:
    """HPC_DS1_LAUNCHER (validated by Settings), else mpiexec."""
    from hpc_ds1.settings import Settings

    return Settings().launcher


def check(launcher: str) -> Launcher:
    """`launcher` if it can be used here; LauncherError saying what is accepted otherwise."""
    if launcher not in LAUNCHERS:
        raise LauncherError(f"launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if launcher == "srun" and shutil.which("srun") is None:
        raise LauncherError("launcher srun: srun is not on PATH (is this a Slurm login node?)")
    if launcher == "mpiexec" and shutil.which(mpiexec_path()) is None:
        raise LauncherError(NO_MPI.format(mpiexec=mpiexec_path()))
    return launcher  # type: ignore[return-value]


def allocated_cpus() -> int:
    """CPUs a step may use: the allocation's on all its nodes inside one
    (SLURM_JOB_CPUS_PER_NODE, e.g. "4(x2),2"), else this node's."""
    total = 0
    for part in os.environ.get("SLURM_JOB_CPUS_PER_NODE", "").split(","):
        count, _, times = part.partition("(x")
        try:
            total += int(count) * (int(times.rstrip(")")) if times else 1)
        except ValueError:
            continue
    return total if total > 0 else os.cpu_count() or 1


def prefix(launcher: str, ranks: int, threads: int) -> list[str]:
    """The argv that starts `ranks` copies of what follows it, each with `threads` CPUs."""
    if check(launcher) == "mpiexec":
        return [mpiexec_path(), "-n", str(ranks)]
    argv = ["srun", "-n", str(ranks), "--cpus-per-task", str(max(threads, 1))]
    argv.append(f"--job-name={JOB_NAME}")  # the step (or the job srun creates) says whose it is
    if "SLURM_MPI_TYPE" not in os.environ:
        argv.append(f"--mpi={SRUN_MPI}")
    # An oversubscribed configuration (more ranks x threads than CPUs, which the tuner may
    # try) would wait for resources forever: srun is told it may overcommit.
    if ranks * max(threads, 1) > allocated_cpus():
        argv.append("--overcommit")
    # One failed rank ends the step (as mpiexec ends the job), not a hang in a collective.
    argv.append("--kill-on-bad-exit=1")
    return argv
