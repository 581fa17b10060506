"""A real single-node Slurm for the tests, started as root in a temp dir: its own munge key and
munged (own socket), a slurm.conf with the controller and the node on 127.0.0.1 on free
non-default ports, and slurmctld and slurmd in the foreground (-D) in their own sessions.
Debian's packages (deploy/install-slurm.sh); the setup that works on these machines is in
DESIGN.md §5. Nothing of the packages' own configuration or services is used."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from hpc_ds1.infra.ports import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "squeue", "scancel")
PARTITION = "debug"
START_TIMEOUT_S = 60.0


def missing() -> str | None:
    """Why a Slurm cannot be started here (not root, a binary absent), or None."""
    if os.geteuid() != 0:
        return "a real Slurm needs root here (slurmd runs jobs as their user)"
    absent = [b for b in BINARIES if find(b) is None]
    if absent:
        return f"{', '.join(absent)} not installed (as root: deploy/install-slurm.sh)"
    return None


def find(binary: str) -> str | None:
    return shutil.which(binary) or next(
        (str(p) for p in (Path("/usr/sbin") / binary,) if p.exists()), None
    )


def node_line(hostname: str) -> str:
    """NodeName=... with the sockets, cores and threads slurmd itself detects (`slurmd -C`), so
    the node is not drained for a mismatch; no RealMemory (the default, 1 MB, always fits)."""
    out = subprocess.run(
        [find("slurmd") or "slurmd", "-C"], capture_output=True, text=True, check=True
    ).stdout
    first = next(line for line in out.splitlines() if line.startswith("NodeName="))
    keep = [f for f in first.split() if f.split("=")[0] not in ("NodeName", "RealMemory", "UpTime")]
    return " ".join([f"NodeName={hostname}", "NodeAddr=127.0.0.1", *keep, "State=UNKNOWN"])


@dataclass
class SlurmCluster:
    """One controller and one node; `env` is what a client command needs (SLURM_CONF)."""

    root: Path
    hostname: str = field(default_factory=socket.gethostname)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def partition(self) -> str:
        return PARTITION

    @property
    def ctld_log(self) -> Path:
        return self.root / "slurmctld.log"

    @property
    def slurmd_log(self) -> Path:
        return self.root / "slurmd.log"

    def _write(self) -> None:
        for sub in ("munge", "state", "spool", "run"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)  # job steps (root here) read slurm.conf from it
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        ctld_port, node_port = free_port(), free_port()
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=hpcds1test",
                    "SlurmctldHost=localhost(127.0.0.1)",
                    f"SlurmctldPort={ctld_port}",
                    f"SlurmdPort={node_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={r / 'munge' / 'munge.socket'}",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'run' / 'slurmd.pid'}",
                    f"SlurmctldLogFile={self.ctld_log}",
                    f"SlurmdLogFile={self.slurmd_log}",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SchedulerType=sched/builtin",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "InactiveLimit=0",
                    "KillWait=5",
                    "MinJobAge=300",
                    node_line(self.hostname),
                    f"PartitionName={PARTITION} Nodes={self.hostname} Default=YES "
                    "MaxTime=INFINITE State=UP OverSubscribe=NO",
                    "",
                ]
            )
        )

    def _spawn(self, argv: list[str], name: str) -> None:
        log = open(self.root / f"{name}.out", "wb")
        self.procs.append(
            subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        )
        log.close()

    def start(self) -> SlurmCluster:
        self._write()
        m = self.root / "munge"
        self._spawn(
            [
                find("munged") or "munged",
                "-F",
                "--force",
                f"--key-file={m / 'munge.key'}",
                f"--socket={m / 'munge.socket'}",
                f"--pid-file={m / 'munged.pid'}",
                f"--log-file={m / 'munged.log'}",
                f"--seed-file={m / 'munged.seed'}",
            ],
            "munged",
        )
        self._wait(lambda: (m / "munge.socket").exists(), "munged's socket")
        self._spawn([find("slurmctld") or "slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
        self._spawn(
            [find("slurmd") or "slurmd", "-D", "-f", str(self.conf), "-N", self.hostname],
            "slurmd",
        )
        self._wait(self.idle, "the node to be idle in sinfo")
        return self

    def _wait(self, ready: object, what: str) -> None:
        assert callable(ready)
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a Slurm daemon exited while waiting for {what}: {self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}: {self.logs()}")

    def idle(self) -> bool:
        out = subprocess.run(
            [find("sinfo") or "sinfo", "-h", "-N", "-o", "%N %t"],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=10,
        )
        return out.returncode == 0 and f"{self.hostname} idle" in out.stdout

    def logs(self, chars: int = 3000) -> str:
        parts = []
        for name in ("munged.out", "slurmctld.out", "slurmd.out", "slurmctld.log", "slurmd.log"):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def own_processes(self) -> list[psutil.Process]:
        """Processes of this cluster that left the daemons' sessions: job tasks carry its
        SLURM_CONF in their environment; a slurmstepd (which clears its environment) holds
        its log file, in this cluster's folder, open."""
        found = []
        root = str(self.root) + os.sep
        for proc in psutil.process_iter():
            if proc.pid == os.getpid():
                continue
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("SLURM_CONF") == str(self.conf) or any(
                    f.path.startswith(root) for f in proc.open_files()
                ):
                    found.append(proc)
        return found

    def stop(self) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [find("scancel") or "scancel", "--full", "--partition", PARTITION],
                env=self.env,
                capture_output=True,
                timeout=10,
            )
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        left = [p for p in self.own_processes() if p.pid not in {q.pid for q in self.procs}]
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(left, timeout=5)
        self.procs.clear()

    def __enter__(self) -> SlurmCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
