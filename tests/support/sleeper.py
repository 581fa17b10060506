"""A job that runs for as long as asked under real MPI ranks and says who its ranks are: for the
tests of long runs and their cancel (the ranks' pids read back, then looked for in /proc)."""

from __future__ import annotations

from pathlib import Path

from hpc_ds1.workloads import CommandWorkload, load_workload_file
from tests.support.waiting import wait_for

# Each rank writes its pid (and its parent's: the launcher's proxy) into PID_DIR, says so on
# stdout, then sleeps {size} seconds and prints its runtime.
SLEEPER = """\
import os, sys, time
folder = os.environ["PID_DIR"]
rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
with open(os.path.join(folder, f"rank-{rank}.pid"), "w") as out:
    out.write(f"{os.getpid()} {os.getppid()}")
print("started", flush=True)
time.sleep(float(sys.argv[1]))
print("runtime_s=%s" % sys.argv[1], flush=True)
"""


def sleeper(folder: Path, pids: Path, extra: str = "", launcher: str = "mpi") -> CommandWorkload:
    """The sleeper's workload file in `folder`, its ranks' pids in `pids`."""
    (folder / "sleeper.py").write_text(SLEEPER)
    (folder / "sleeper.toml").write_text(
        f"""
[workload]
name = "sleeper-{launcher}"
command = "{{python}} sleeper.py {{size}}"
launcher = "{launcher}"
env = {{ OMP_NUM_THREADS = "{{threads}}", PID_DIR = "{pids}" }}
sizes = [1, 2]
warmup = false
{extra}
[check]
exit_code = true
"""
    )
    wl = load_workload_file(folder / "sleeper.toml")
    assert isinstance(wl, CommandWorkload)
    return wl


def alive(pid: int) -> bool:
    """Whether /proc holds `pid` as a live process (a zombie is dead, waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def rank_pids(pids: Path, ranks: int, timeout: float = 60.0) -> list[int]:
    """The ranks' pids and their parents' (the launcher's proxies), once every rank wrote."""

    def written() -> list[int] | None:
        texts = [f.read_text() for f in sorted(pids.glob("rank-*.pid"))]
        if len(texts) == ranks and all(len(t.split()) == 2 for t in texts):
            return sorted({int(p) for t in texts for p in t.split()})
        return None

    found: list[int] = wait_for(
        f"{ranks} ranks started",
        written,
        timeout,
        every_s=0.05,
        context=lambda: f" (in {pids}: {sorted(f.name for f in pids.glob('*'))})",
    )
    return found
