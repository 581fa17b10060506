"""Checks made before anything is launched: each failure is an InvalidJob with a clear message."""

from __future__ import annotations

import psutil

from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import CommandWorkload, Workload, get_workload

RANK_OVERHEAD_BYTES = 300 * 2**20  # python + numba + MPI per rank
MEMORY_FRACTION = 0.8


class InvalidJob(ValueError):
    """A job the runner refuses to launch: unknown workload, bad size, config outside the space,
    or a problem too large for this machine's memory."""


def check_size(size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        try:
            if isinstance(size, str) and size.strip().lstrip("+").isdigit():
                size = int(size)
            else:
                raise TypeError
        except TypeError:
            raise InvalidJob(f"size must be a positive integer, not {size!r}") from None
    assert isinstance(size, int)
    if size <= 0:
        raise InvalidJob(f"size must be a positive integer, not {size}")
    return size


def validate(
    workload: str | Workload, size: object, config: Config, space: ConfigSpace | None = None
) -> tuple[Workload, int]:
    """The workload and size to run, or InvalidJob saying what is wrong and what is accepted."""
    try:
        wl = workload if isinstance(workload, Workload) else get_workload(str(workload))
    except KeyError as error:
        raise InvalidJob(str(error)) from None
    n = check_size(size)
    if space is None:
        space = ConfigSpace.for_device(workload=wl)
    reason = space.problem(config)
    if reason is not None:
        raise InvalidJob(f"{wl.name}: {reason}")
    if config.gpu and not wl.gpu_capable:
        raise InvalidJob(f"{wl.name} has no GPU kernel; use gpu=False")
    if isinstance(wl, CommandWorkload):
        return wl, n
    least = wl.min_size(config.ranks)
    if n < least:
        raise InvalidJob(f"{wl.name} size {n} is too small for {config.ranks} ranks (>= {least})")
    need = wl.memory(n, config.ranks) + config.ranks * RANK_OVERHEAD_BYTES
    available = psutil.virtual_memory().available
    if need > MEMORY_FRACTION * available:
        raise InvalidJob(
            f"{wl.name} size {n} with {config.ranks} ranks needs about {need / 2**30:.1f} GiB; "
            f"only {available / 2**30:.1f} GiB is available (limit {MEMORY_FRACTION:.0%} of it)"
        )
    return wl, n
