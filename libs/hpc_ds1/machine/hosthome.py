"""A per-host home when `$HPC_DS1_HOME` lies on a filesystem several nodes share.

On a cluster, `~/.hpc_ds1` is usually on NFS, Lustre or GPFS, seen by every node. A home holds
what belongs to one host: the owner lock and `owner.json` (where *this host's* servers listen,
on 127.0.0.1), `device.lock` (one job at a time on *these* cores), and the embedded NATS store
and Postgres directory, which one server process may open at a time. Two nodes sharing them
collide: node B reads node A's loopback addresses, waits on node A's device lock, or opens the
same database directory. So on a shared filesystem each host gets a home of its own,
`$HPC_DS1_HOME/hosts/<hostname>/`, and everything of the home goes there.

Measurements and models go there too, deliberately: a measurement describes one machine, and
the product already pools the measurements of identical machines where that is sound, through
the fleet (one `serve` as coordinator, the other nodes join it as devices; identical hardware
gets the same device id, so their runs train one model). Sharing a database directory between
nodes instead is not possible for the embedded Postgres and NATS, and would hide which node
measured what.

`HPC_DS1_HOME_PER_HOST`: `auto` (the default: per host on a network or cluster filesystem),
`always`, or `never` (one home, as before: for a shared home that only one node ever uses).
A home that an earlier version already filled at its top level keeps being used as it is (with
a warning when it is on a shared filesystem), so nothing it holds disappears. A home named
`.../hosts/<name>` is used as it is, from any host: to work in another host's home on purpose
(e.g. `srun -p compute hpc-ds1 setup` into a partition agent's home on the login node), give its
path."""

from __future__ import annotations

import os
import re
import socket
import warnings
from pathlib import Path

MODES = ("auto", "always", "never")
MODE_VARIABLE = "HPC_DS1_HOME_PER_HOST"
HOSTS_DIR = "hosts"
# Filesystems that several machines mount at once (network, cluster and parallel filesystems).
SHARED_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "ceph",
        "fuse.cephfs", "glusterfs", "fuse.glusterfs", "panfs", "afs", "ocfs2", "gfs2",
        "wekafs", "orangefs", "pvfs2", "fuse.sshfs", "9p", "virtiofs", "cvfs", "quobyte",
    }
)  # fmt: skip
# What an earlier version (one home for the machine) wrote at the home's top level.
LEGACY_ENTRIES = ("owner.lock", "device.lock", "nats", "postgres", "models", "credentials")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class SharedHomeWarning(UserWarning):
    """A home on a shared filesystem still laid out for one host."""


def host_key(hostname: str) -> str:
    """A directory name for `hostname` (its characters outside [A-Za-z0-9._-] become '_')."""
    cleaned = _UNSAFE.sub("_", hostname.strip()) or "localhost"
    return cleaned.lstrip(".") or "localhost"


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_type(path: Path, mountinfo: str) -> str | None:
    """The filesystem type of the mount holding `path` (absolute), from the text of
    /proc/self/mountinfo: the longest mount point that contains it."""
    best: tuple[int, str] | None = None
    target = str(path)
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if not sep or len(fields) < 5 or not after:
            continue
        mount = _unescape(fields[4])
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) >= best[0]):
            best = (len(mount), after[0])
    return best[1] if best else None


def is_legacy(home: Path) -> bool:
    """Whether an earlier, single-host version already keeps its files at `home`'s top."""
    return any((home / name).exists() for name in LEGACY_ENTRIES)


def per_host_home(home: Path, *, mode: str, fstype: str | None, hostname: str) -> Path:
    """Where the home of `hostname` is: `home` itself, or `home/hosts/<hostname>` (see the
    module's docstring for when). Pure apart from looking for a legacy layout."""
    if mode not in MODES:
        raise ValueError(
            f"{MODE_VARIABLE}={mode!r} is not accepted; use one of: {', '.join(MODES)}"
        )
    if home.parent.name == HOSTS_DIR:
        # Already a host's home: this host's, handed on resolved to a child process, or another
        # host's named on purpose (a Slurm partition agent's home, measured from a node).
        return home
    key = host_key(hostname)
    shared = fstype is not None and fstype in SHARED_FILESYSTEMS
    if mode == "never" or (mode == "auto" and not shared):
        return home
    if is_legacy(home):
        if shared:
            warnings.warn(
                f"{home} is on a shared filesystem ({fstype}) but holds a single-host home of an "
                f"earlier version: it is used as it is, so only one node may use it. To give each "
                f"node its own, move it to {home / HOSTS_DIR / key} (while nothing serves it), or "
                f"set {MODE_VARIABLE}=never to silence this.",
                SharedHomeWarning,
                stacklevel=3,
            )
        return home
    return home / HOSTS_DIR / key


def resolve_home(home: Path) -> Path:
    """This host's home for the configured `home` (absolute), from the environment's mode, the
    filesystem it is on and this host's name."""
    mode = os.environ.get(MODE_VARIABLE, "auto").strip().lower() or "auto"
    if mode == "never":
        return home
    fstype = None
    if mode == "auto":
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            mountinfo = ""
        fstype = filesystem_type(home, mountinfo)
    return per_host_home(home, mode=mode, fstype=fstype, hostname=socket.gethostname())
