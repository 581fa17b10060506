"""Workloads: numba kernels with a correctness check, work per size and sizes; plug-ins welcome
(a Python `Workload` under the `hpc_ds1.workloads` entry point, or a TOML command: see
docs/plugins.md).

from hpc_ds1.workloads import Workload, register, get_workload, list_workloads
"""

from hpc_ds1.workloads.base import CheckResult, Prepared, RankContext, Work, Workload
from hpc_ds1.workloads.command import CommandWorkload, command_workload
from hpc_ds1.workloads.registry import (
    ENTRY_POINT_GROUP,
    UnknownWorkload,
    get_workload,
    list_workloads,
    load_errors,
    load_file,
    preserved,
    register,
    resolve,
    source_of,
    unregister,
    use_home,
)
from hpc_ds1.workloads.tomlfile import WorkloadFileError, load_workload_file

__all__ = [
    "ENTRY_POINT_GROUP",
    "CheckResult",
    "CommandWorkload",
    "Prepared",
    "RankContext",
    "UnknownWorkload",
    "Work",
    "Workload",
    "WorkloadFileError",
    "command_workload",
    "get_workload",
    "list_workloads",
    "load_errors",
    "load_file",
    "load_workload_file",
    "preserved",
    "register",
    "resolve",
    "source_of",
    "unregister",
    "use_home",
]
