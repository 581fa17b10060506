"""A per-host home on a shared filesystem; single-host homes of earlier versions keep working."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hpc_ds1.machine.devicelock import device_lock
from hpc_ds1.machine.hosthome import (
    SharedHomeWarning,
    filesystem_type,
    host_key,
    per_host_home,
    resolve_home,
)
from hpc_ds1.settings import Settings

MOUNTINFO = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "40 22 0:50 / /home rw,relatime shared:20 - nfs4 fs:/export/home rw,vers=4.2\n"
    "41 22 0:51 / /lustre/scratch rw - lustre 10.0.0.1@o2ib:/scratch rw\n"
    "42 22 0:52 / /mnt/my\\040disk rw - xfs /dev/sdb1 rw\n"
)


def test_the_filesystem_of_a_path_is_its_longest_mount() -> None:
    assert filesystem_type(Path("/home/ana/.hpc_ds1"), MOUNTINFO) == "nfs4"
    assert filesystem_type(Path("/lustre/scratch/ana/.hpc_ds1"), MOUNTINFO) == "lustre"
    assert filesystem_type(Path("/homework"), MOUNTINFO) == "ext4"  # not under /home
    assert filesystem_type(Path("/mnt/my disk/h"), MOUNTINFO) == "xfs"
    assert filesystem_type(Path("/x"), "") is None


def test_shared_filesystems_get_a_home_per_host(tmp_path: Path) -> None:
    home = tmp_path / "home"
    a = per_host_home(home, mode="auto", fstype="nfs4", hostname="node01.cluster")
    b = per_host_home(home, mode="auto", fstype="lustre", hostname="node02.cluster")
    assert a == home / "hosts" / "node01.cluster" and b == home / "hosts" / "node02.cluster"
    # Handed on resolved (a child process's environment), it stays where it is.
    assert per_host_home(a, mode="auto", fstype="nfs4", hostname="node01.cluster") == a
    # Another host's home, named on purpose (a partition agent's, from a compute node), too.
    assert per_host_home(a, mode="auto", fstype="nfs4", hostname="node17") == a
    assert per_host_home(home, mode="auto", fstype="ext4", hostname="n1") == home
    assert per_host_home(home, mode="auto", fstype=None, hostname="n1") == home
    assert per_host_home(home, mode="always", fstype="ext4", hostname="n1") == home / "hosts/n1"
    assert per_host_home(home, mode="never", fstype="nfs", hostname="n1") == home
    assert host_key("weird/host name") == "weird_host_name" and host_key("") == "localhost"
    with pytest.raises(ValueError, match="HPC_DS1_HOME_PER_HOST='sometimes' is not accepted"):
        per_host_home(home, mode="sometimes", fstype="nfs", hostname="n1")


def test_a_home_of_an_earlier_version_is_used_as_it_is(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "postgres").mkdir(parents=True)
    (home / "owner.lock").touch()
    with pytest.warns(SharedHomeWarning, match="single-host home of an earlier version"):
        assert per_host_home(home, mode="auto", fstype="nfs", hostname="n1") == home
    assert per_host_home(home, mode="always", fstype="ext4", hostname="n1") == home


def test_settings_resolve_the_home_per_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPC_DS1_HOME_PER_HOST", "always")
    settings = Settings(home=tmp_path / "shared")
    mine = resolve_home(tmp_path / "shared")
    assert settings.home == mine and mine.parent == tmp_path / "shared" / "hosts"
    assert settings.models_dir == mine / "models" and settings.audit_path == mine / "audit.jsonl"
    assert Settings(home=settings.home).home == settings.home
    monkeypatch.setenv("HPC_DS1_HOME_PER_HOST", "never")
    assert Settings(home=tmp_path / "shared").home == tmp_path / "shared"
    monkeypatch.delenv("HPC_DS1_HOME_PER_HOST")
    assert Settings(home=tmp_path / "local").home == tmp_path / "local"  # tmp is not shared


def test_two_hosts_of_a_shared_home_hold_their_device_locks_at_once(tmp_path: Path) -> None:
    home = tmp_path / "shared"
    first = per_host_home(home, mode="always", fstype=None, hostname="node01")
    second = per_host_home(home, mode="always", fstype=None, hostname="node02")
    held = threading.Event()
    with device_lock(first):
        # The other node's lock is free (timeout=0 would raise TimeoutError if it were not).
        with device_lock(second, timeout=0):
            held.set()
        # ... while this node's own lock is taken.
        with pytest.raises(TimeoutError), device_lock(first, timeout=0):
            pass
    assert held.is_set()
