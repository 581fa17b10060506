"""How a job's ranks are started: `mpiexec -n R` (the default) or, inside or through Slurm,
`srun -n R --cpus-per-task T` (a job step of the allocation the command runs in, or a new
allocation when there is none).

MPI inside ranks started by srun: MPICH's own PMI client speaks PMI-2 over the socket that
Slurm's `mpi/pmi2` plugin hands each task, so `srun --mpi=pmi2` starts mpi4py on the pip MPICH
wheel as well as on a site MPICH (measured: a 4-rank allreduce under Debian's Slurm 22.05).
`--mpi=pmix` needs a PMIx-enabled MPI (the wheel has none); a site that wants another plugin
sets SLURM_MPI_TYPE, which srun reads itself and which then wins over the default here.

mpiexec (`choose_mpiexec`, a pure function of PATH, HPC_DS1_MPIEXEC and this Python): in order
HPC_DS1_MPIEXEC (a site MPI, taken as named); then an MPICH-compatible `mpiexec` (Hydra: MPICH,
Intel MPI, MVAPICH) found on PATH ahead of this environment's bin/ (a loaded module's); then
the MPICH wheel's, next to this Python; with no wheel, the first `mpiexec` on PATH. A foreign
`mpiexec` on PATH (Open MPI's, e.g. Debian's /usr/bin/mpiexec) is passed over while the wheel
is installed: mpi4py then loads the wheel's libmpi, which cannot initialise under another
implementation's launcher ("unsupported PMI version PMIx", measured with Debian's Open MPI
4.1.4), so the built-in kernels would fail; a site that wants it anyway names it in
HPC_DS1_MPIEXEC (docs/slurm.md, "A site's MPI"). Inside an allocation the pip MPICH's hydra
starts its proxies with srun by itself, so `mpiexec` works there too."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Literal, get_args

Launcher = Literal["mpiexec", "srun"]
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
SRUN_MPI = "pmi2"
# Debian's Open MPI (4.1) initialises from PMIx: an Open MPI application as a job step is
# `srun --mpi=pmix` (Slurm's mpi/pmix plugin, which loads libpmix.so: Debian's libpmix-dev;
# measured: hpcc under 2 ranks as a step of Debian's Slurm 22.05).
SRUN_OPENMPI = "pmix"
JOB_NAME = "hpc-ds1-run"


# The MPICH wheel is a default dependency, left out by HPC_DS1_NO_MPICH=1 at install time (a
# site with its own MPI): without either, say so.
NO_MPI = (
    "no MPI found ({mpiexec} is not installed): install the `mpich` extra "
    "(pip install 'hpc-ds1[mpich]'), or load your site's MPI module (e.g. `module load mpich`) "
    "or set HPC_DS1_MPIEXEC to its mpiexec, or use --launcher srun inside Slurm"
)
# What an MPICH-compatible launcher says in `mpiexec --version`: Hydra's build details (MPICH,
# MVAPICH), or Intel MPI's banner (Hydra too). Open MPI's says "mpiexec (OpenRTE) 4.1.4" or
# "mpiexec (Open MPI) 5.0".
MPICH_MARKERS = ("HYDRA", "MPICH", "INTEL(R) MPI")
VERSION_TIMEOUT_S = 10.0


class LauncherError(ValueError):
    """A launcher that cannot be used here (unknown, or its program is not installed)."""


def _runnable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _same_dir(a: str, b: str) -> bool:
    if os.path.normpath(a) == os.path.normpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def mpich_compatible(mpiexec: str) -> bool:
    """Whether `mpiexec --version` is an MPICH-compatible launcher's (Hydra): it can start
    ranks whose mpi4py runs on the MPICH wheel. Asked once per file version."""
    try:
        st = os.stat(mpiexec)
    except OSError:
        return False
    return _version_is_mpich(os.path.realpath(mpiexec), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=32)
def _version_is_mpich(mpiexec: str, _mtime_ns: int, _size: int) -> bool:
    try:
        done = subprocess.run(
            [mpiexec, "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    said = (done.stdout + done.stderr).upper()
    return any(marker in said for marker in MPICH_MARKERS)


def choose_mpiexec(
    path: str | None,
    setting: str | None,
    executable: str,
    is_mpich: Callable[[str], bool] = mpich_compatible,
) -> str:
    """The mpiexec that starts ranks, from PATH, the HPC_DS1_MPIEXEC setting and this Python:

    1. `setting` when set (a site MPI, taken as named);
    2. the first `mpiexec` on `path` that comes before `executable`'s folder (this
       environment's bin/) and `is_mpich` (a loaded module's MPICH-compatible MPI); an
       entry that is this environment's bin/ ends the search: the wheel's wins from there;
    3. the wheel's `mpiexec` next to `executable`;
    4. without the wheel, the first `mpiexec` on `path` of any implementation (mpi4py then
       runs on the site's libmpi), else "mpiexec", which `check` reports as missing.
    """
    site = (setting or "").strip()
    if site:
        return site
    bindir = os.path.dirname(executable)
    local = os.path.join(bindir, "mpiexec")
    wheel = bool(executable) and _runnable(local)
    for entry in (path or "").split(os.pathsep):
        if not entry:
            continue
        if wheel and _same_dir(entry, bindir):
            break
        candidate = os.path.join(entry, "mpiexec")
        if not _runnable(candidate):
            continue
        if not wheel or is_mpich(candidate):
            return candidate
    return local if wheel else "mpiexec"


def mpiexec_path() -> str:
    """The mpiexec of this process (`choose_mpiexec` of its PATH, settings and Python)."""
    from hpc_ds1.settings import Settings

    return choose_mpiexec(os.environ.get("PATH"), Settings().mpiexec, sys.executable)


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


# A rank binding (a workload knob's value, workloads/tomlfile.py BIND_VALUES) in srun's words;
# Hydra's -bind-to and Open MPI's --bind-to take the value as it is.
SRUN_BIND = {"none": "none", "core": "cores", "socket": "sockets", "hwthread": "threads",
             "numa": "ldoms"}  # fmt: skip


def binding_words(launcher: str, bind: str) -> list[str]:
    """The launcher's words for binding each rank to a `bind` (none, core, socket, hwthread,
    numa): MPICH Hydra's `-bind-to core`, srun's `--cpu-bind=cores`; ValueError otherwise."""
    if bind not in SRUN_BIND:
        raise ValueError(f"rank binding {bind!r}; accepted: {', '.join(SRUN_BIND)}")
    if launcher == "srun":
        return [f"--cpu-bind={SRUN_BIND[bind]}"]
    return ["-bind-to", bind]


def prefix(
    launcher: str, ranks: int, threads: int, bind: str | None = None, mpi: str = SRUN_MPI
) -> list[str]:
    """The argv that starts `ranks` copies of what follows it, each with `threads` CPUs (and
    bound to `bind`, a rank binding: binding_words; None: the launcher's default). `mpi`:
    srun's MPI plugin unless SLURM_MPI_TYPE says (pmi2 for MPICH; SRUN_OPENMPI for an
    application built against Open MPI)."""
    if check(launcher) == "mpiexec":
        argv = [mpiexec_path(), "-n", str(ranks)]
        return [*argv, *binding_words("mpiexec", bind)] if bind is not None else argv
    argv = ["srun", "-n", str(ranks), "--cpus-per-task", str(max(threads, 1))]
    if bind is not None:
        argv += binding_words("srun", bind)
    argv.append(f"--job-name={JOB_NAME}")  # the step (or the job srun creates) says whose it is
    if "SLURM_MPI_TYPE" not in os.environ:
        argv.append(f"--mpi={mpi}")
    # An oversubscribed configuration (more ranks x threads than CPUs, which the tuner may
    # try) would wait for resources forever: srun is told it may overcommit.
    if ranks * max(threads, 1) > allocated_cpus():
        argv.append("--overcommit")
    # One failed rank ends the step (as mpiexec ends the job), not a hang in a collective.
    argv.append("--kill-on-bad-exit=1")
    return argv
