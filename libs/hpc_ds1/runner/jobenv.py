"""The environment a job runs in: what it may see of this process's, its thread counts, and
how long past its timeout its guard and ranks wait before killing themselves. Shared by the
runner's kernels and command workloads, and by the Slurm launcher."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

# Past the runner's own timeout, the guard and the ranks wait this long before killing themselves
# (the runner normally kills first and reports the timeout).
GRACE_S = 15.0

# What a job may see of this process's environment: these names and prefixes only...
ENV_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "PWD",
        "TMPDIR", "TMP", "TEMP", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX",
        "LD_LIBRARY_PATH", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR", "HOSTNAME",
    }
)  # fmt: skip
ENV_PREFIXES = (
    "LC_", "OMP_", "KMP_", "GOMP_", "NUMBA_", "MKL_", "OPENBLAS_", "BLIS_", "MPI", "HYDRA_",
    "PMI_", "PMIX_", "OMPI_", "I_MPI_", "FI_", "UCX_", "CUDA_", "NVIDIA_", "ROCR_", "HIP_",
    "SLURM_", "PBS_", "PALS_", "HPCDS1_",
)  # fmt: skip
# ...and never one named like a credential, nor a setting of this service (HPC_DS1_*).
ENV_DENY = re.compile(r"URL|PASSWORD|PASSWD|TOKEN|SECRET|CREDENTIAL|^HPC_DS1_", re.IGNORECASE)


def job_env(
    threads: int,
    base: Mapping[str, str] | None = None,
    ranks: int = 1,
    cpus: int | None = None,
) -> dict[str, str]:
    """The environment of a job: allowlisted variables of `base` (default: this process's),
    thread counts for `threads`, and a PYTHONPATH that finds this package and its plug-ins.
    When `ranks` x `threads` workers exceed the `cpus` usable here (default: the allocation's),
    OpenMP threads wait passively at barriers (OMP_WAIT_POLICY=PASSIVE) unless `base` says
    otherwise: numba's OpenMP layer spins by default, and a spinning thread holds a core that
    another rank's thread needs (docs/kernels.md: 20-130x slower on 2 CPUs)."""
    source = os.environ if base is None else base
    env = {
        k: v
        for k, v in source.items()
        if (k in ENV_NAMES or k.startswith(ENV_PREFIXES)) and not ENV_DENY.search(k)
    }
    if threads > 1:  # ranks of one thread have no OpenMP team to wait at a barrier
        if cpus is None:
            from hpc_ds1.machine.allocation import detect

            cpus = detect().usable
        if ranks * threads > cpus:
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["NUMBA_NUM_THREADS"] = str(max(threads, 1))
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        env[var] = "1"
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env
