"""The allocation, not the box: affinity mask, cgroup quota and Slurm, the smallest wins."""

from __future__ import annotations

from pathlib import Path

from hpc_ds1.machine.allocation import (
    Allocation,
    affinity_cpus,
    cgroup_quota_cpus,
    detect,
    slurm_cpus,
    usable_cpus,
)
from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.space import ConfigSpace


def cgroup_v2(root: Path, path: str, cpu_max: dict[str, str]) -> str:
    for folder, value in cpu_max.items():
        target = root / folder.strip("/")
        target.mkdir(parents=True, exist_ok=True)
        (target / "cpu.max").write_text(value + "\n")
    (root / path.strip("/")).mkdir(parents=True, exist_ok=True)
    return f"0::{path}\n"


def test_cgroup_v2_quota_is_the_tightest_of_the_cgroup_and_its_parents(tmp_path: Path) -> None:
    text = cgroup_v2(
        tmp_path,
        "/system.slice/job_42/step_0",
        {"/system.slice/job_42": "400000 100000", "/system.slice/job_42/step_0": "max 100000"},
    )
    assert cgroup_quota_cpus(text, tmp_path) == 4.0
    unlimited = cgroup_v2(tmp_path / "other", "/user.slice", {"/user.slice": "max 100000"})
    assert cgroup_quota_cpus(unlimited, tmp_path / "other") is None


def test_cgroup_v2_inside_a_container_reads_the_root(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    # The host's path is not visible in the container's own cgroup namespace.
    assert cgroup_quota_cpus("0::/kubepods/pod1/abc\n", tmp_path) == 1.5


def test_cgroup_v1_quota_and_no_quota(tmp_path: Path) -> None:
    folder = tmp_path / "cpu,cpuacct" / "slurm" / "uid_0" / "job_7"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("300000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    text = "12:memory:/slurm/uid_0/job_7\n4:cpu,cpuacct:/slurm/uid_0/job_7\n"
    assert cgroup_quota_cpus(text, tmp_path) == 3.0
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_quota_cpus(text, tmp_path) is None
    assert cgroup_quota_cpus("", tmp_path) is None


def test_slurm_cpus_per_task_times_tasks_and_the_node_share() -> None:
    assert slurm_cpus({}) is None  # not in an allocation
    assert slurm_cpus({"SLURM_CPUS_PER_TASK": "4", "SLURM_NTASKS": "2"}) is None
    job = {"SLURM_JOB_ID": "17"}
    assert slurm_cpus({**job, "SLURM_CPUS_PER_TASK": "4", "SLURM_NTASKS": "2"}) == 8
    assert slurm_cpus({**job, "SLURM_CPUS_ON_NODE": "12"}) == 12
    assert slurm_cpus({**job, "SLURM_JOB_CPUS_PER_NODE": "72(x2)"}) == 72
    # Two nodes: SLURM_NTASKS counts both, so the node's share comes from the per-node counts.
    two_nodes = {**job, "SLURM_NNODES": "2", "SLURM_NTASKS": "8", "SLURM_CPUS_PER_TASK": "6"}
    assert slurm_cpus({**two_nodes, "SLURM_CPUS_ON_NODE": "24"}) == 24
    assert slurm_cpus({**two_nodes, "SLURM_NTASKS_PER_NODE": "2"}) == 12
    assert slurm_cpus({**job, "SLURM_CPUS_PER_TASK": "48", "SLURM_NTASKS": "2",
                       "SLURM_CPUS_ON_NODE": "64"}) == 64  # fmt: skip


def test_the_smallest_limit_wins() -> None:
    assert usable_cpus(128, None, None, None) == 128
    assert usable_cpus(128, 96, None, None) == 96
    assert usable_cpus(128, 96, 40.5, None) == 40  # a fractional quota rounds down
    assert usable_cpus(128, 96, 40.0, 8) == 8
    assert usable_cpus(4, None, 0.5, None) == 1
    assert affinity_cpus([0, 1, 2, 2]) == 3 and affinity_cpus(None) is None
    assert Allocation(128, 96, None, 24).limited_by() == "the Slurm allocation"
    assert Allocation(128, 96, None, None).limited_by() == "the CPU affinity mask"
    assert Allocation(8, 8, 2.0, None).limited_by() == "the cgroup CPU quota"
    assert Allocation(8, 8, None, None).limited_by() == "the machine"


def test_this_process_and_its_fingerprint() -> None:
    found = detect(env={}, proc_self_cgroup=Path("/nonexistent"))
    assert found.usable == found.affinity == len(__import__("os").sched_getaffinity(0))
    fp = fingerprint()
    assert fp.usable_cpus is not None and 1 <= fp.cpus <= fp.logical_cpus
    # The allocation does not change the device id: a smaller job is the same device.
    same = fp.model_copy(update={"usable_cpus": 1})
    assert same.device_id == fp.device_id and same.cpus == 1
    assert ConfigSpace.for_device(same, "gemm").threads == (1,)
    # A fingerprint recorded before the allocation existed uses the box's CPUs.
    old = fp.model_dump()
    old.pop("usable_cpus")
    assert type(fp).model_validate(old).cpus == fp.logical_cpus
