"""Workloads: numba kernels with a correctness check, work per size and sizes; plug-ins welcome.

from hpc_ds1.workloads import Workload, register, get_workload, list_workloads
"""

from hpc_ds1.workloads.base import CheckResult, Prepared, RankContext, Work, Workload
from hpc_ds1.workloads.command import CommandWorkload, command_workload
from hpc_ds1.workloads.registry import (
    ENTRY_POINT_GROUP,
    UnknownWorkload,
    get_workload,
    list_workloads,
    register,
    resolve,
    unregister,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "CheckResult",
    "CommandWorkload",
    "Prepared",
    "RankContext",
    "UnknownWorkload",
    "Work",
    "Workload",
    "command_workload",
    "get_workload",
    "list_workloads",
    "register",
    "resolve",
    "unregister",
]
