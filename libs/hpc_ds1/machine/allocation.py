"""The CPUs this process may use: the allocation, not the box.

A job on a cluster node rarely owns the whole node. Three limits can apply, and the smallest wins:
the affinity mask (taskset, cpusets, Slurm's task binding), the cgroup CPU quota (a container's
or a Slurm job's `cpu.max`, or cgroup v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`), and a Slurm
allocation's CPUs on this node (`SLURM_CPUS_PER_TASK` x the tasks on this node,
`SLURM_CPUS_ON_NODE`, `SLURM_JOB_CPUS_PER_NODE`).

Each reader is a pure function of its inputs (file text, a directory, an environment mapping), so
tests give fake cgroup trees and environments; `detect()` feeds them this process's own."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_INT = re.compile(r"\d+")


@dataclass(frozen=True)
class Allocation:
    """How many CPUs each source allows (None: that source sets no limit) and the result."""

    logical: int
    affinity: int | None
    quota: float | None
    slurm: int | None

    @property
    def usable(self) -> int:
        return usable_cpus(self.logical, self.affinity, self.quota, self.slurm)

    def limited_by(self) -> str:
        """Which source sets the usable count, in words ("the machine" when none limits it)."""
        usable = self.usable
        if self.slurm is not None and self.slurm == usable and usable < self.logical:
            return "the Slurm allocation"
        if self.quota is not None and math.floor(self.quota) == usable < self.logical:
            return "the cgroup CPU quota"
        if self.affinity is not None and self.affinity == usable < self.logical:
            return "the CPU affinity mask"
        return "the machine"


def usable_cpus(logical: int, affinity: int | None, quota: float | None, slurm: int | None) -> int:
    """The smallest limit, at least one CPU. A fractional quota (1.5 CPUs) rounds down: a job
    sized for 2 would be throttled."""
    limits = [max(int(logical), 1)]
    limits += [int(v) for v in (affinity, slurm) if v is not None and v > 0]
    if quota is not None and quota > 0:
        limits.append(max(math.floor(quota), 1))
    return max(min(limits), 1)


def affinity_cpus(mask: Iterable[int] | None) -> int | None:
    """The number of CPUs in the affinity mask; None when the platform has none."""
    if mask is None:
        return None
    count = len(set(mask))
    return count or None


def _quota_v2(text: str) -> float | None:
    """`cpu.max`: "max 100000" (no limit) or "<quota> <period>" in microseconds."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    period = int(parts[1]) if len(parts) > 1 else 100_000
    quota = int(parts[0])
    return quota / period if quota > 0 and period > 0 else None


def _quota_v1(quota_text: str, period_text: str) -> float | None:
    quota, period = int(quota_text.strip()), int(period_text.strip())
    return quota / period if quota > 0 and period > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _ancestors(root: Path, relative: str) -> list[Path]:
    """`root/relative` and each of its parents up to `root`: a limit set on any of them applies.
    When the process's path is not visible under `root` (a container with its own cgroup
    namespace mounts its cgroup at the root), the root alone."""
    parts = [p for p in relative.strip("/").split("/") if p]
    found = [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return [p for p in found if p.is_dir()] or [root]


def cgroup_quota_cpus(proc_self_cgroup: str, root: Path = CGROUP_ROOT) -> float | None:
    """The tightest CPU quota (in CPUs) of this process's cgroup and its ancestors, from the
    text of /proc/self/cgroup and the cgroup filesystem mounted at `root` (v2 unified, or v1
    with a `cpu` controller directory such as `cpu,cpuacct`); None when there is none."""
    quotas: list[float] = []
    for line in proc_self_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2
            for folder in _ancestors(root, relative):
                text = _read(folder / "cpu.max")
                quota = _quota_v2(text) if text else None
                if quota is not None:
                    quotas.append(quota)
        elif "cpu" in controllers.split(","):  # cgroup v1
            for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                if not mount.is_dir():
                    continue
                for folder in _ancestors(mount, relative):
                    q = _read(folder / "cpu.cfs_quota_us")
                    p = _read(folder / "cpu.cfs_period_us")
                    quota = _quota_v1(q, p) if q and p else None
                    if quota is not None:
                        quotas.append(quota)
                break
    return min(quotas) if quotas else None


def _first_count(value: str) -> int | None:
    """The first number of a Slurm CPU list such as "72(x2),36": this node's share when the
    allocation is uniform, an upper bound otherwise."""
    match = _INT.search(value)
    return int(match.group()) if match else None


def slurm_cpus(env: Mapping[str, str]) -> int | None:
    """CPUs of the Slurm allocation on this node; None outside one (no SLURM_JOB_ID)."""
    if not env.get("SLURM_JOB_ID"):
        return None
    limits: list[int] = []
    per_task = _first_count(env.get("SLURM_CPUS_PER_TASK", ""))
    tasks = _first_count(env.get("SLURM_NTASKS_PER_NODE", ""))
    if tasks is None and (_first_count(env.get("SLURM_NNODES", "1")) or 1) <= 1:
        # One node: every task of the job is here.
        tasks = _first_count(env.get("SLURM_NTASKS", ""))
    if per_task and tasks:
        limits.append(per_task * tasks)
    for name in ("SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE"):
        found = _first_count(env.get(name, ""))
        if found:
            limits.append(found)
    return min(limits) if limits else None


def detect(
    env: Mapping[str, str] | None = None,
    proc_self_cgroup: Path = Path("/proc/self/cgroup"),
    root: Path = CGROUP_ROOT,
) -> Allocation:
    """This process's allocation."""
    logical = os.cpu_count() or 1
    try:
        affinity = affinity_cpus(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        affinity = None
    text = _read(proc_self_cgroup) or ""
    return Allocation(
        logical=logical,
        affinity=affinity,
        quota=cgroup_quota_cpus(text, root),
        slurm=slurm_cpus(os.environ if env is None else env),
    )
