"""A one-process stand-in for an mpi4py communicator, so kernels run without MPI."""

from __future__ import annotations

from typing import Any

import numpy as np


class SelfComm:
    """The subset of mpi4py's Comm the workloads use, for a single rank."""

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def Barrier(self) -> None:
        return None

    def allreduce(self, value: Any, op: Any = None) -> Any:
        return value

    def bcast(self, value: Any, root: int = 0) -> Any:
        return value

    def Allgatherv(self, send: Any, recv: Any) -> None:
        buffer = recv[0] if isinstance(recv, list | tuple) else recv
        np.copyto(buffer, send)

    def Sendrecv(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("SelfComm has no neighbours to exchange with")


def split_range(total: int, parts: int, index: int) -> tuple[int, int]:
    """Contiguous block `index` of `parts` nearly equal blocks of range(total)."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def counts_and_displs(total: int, parts: int) -> tuple[list[int], list[int]]:
    blocks = [split_range(total, parts, i) for i in range(parts)]
    return [hi - lo for lo, hi in blocks], [lo for lo, _ in blocks]


def reduce_max(comm: Any, value: float) -> float:
    """The maximum of `value` over all ranks, on every rank."""
    if isinstance(comm, SelfComm):
        return value
    from mpi4py import MPI

    return float(comm.allreduce(value, op=MPI.MAX))


def reduce_sum(comm: Any, value: Any) -> Any:
    """The sum of `value` (a number or numpy array) over all ranks, on every rank."""
    if isinstance(comm, SelfComm):
        return value
    from mpi4py import MPI

    return comm.allreduce(value, op=MPI.SUM)


def neighbour(comm: Any, offset: int) -> int:
    """Rank `offset` away, or MPI.PROC_NULL past either end."""
    other = int(comm.Get_rank()) + offset
    if 0 <= other < int(comm.Get_size()):
        return other
    from mpi4py import MPI

    return int(MPI.PROC_NULL)
