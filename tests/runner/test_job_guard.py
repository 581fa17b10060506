"""A job never outlives the process that runs it, nor its deadline, and never holds the device
unnoticed: the runner dies (kill -9) → its guard kills the job, then lets the device lock go;
the guard dies too → the next holder of the lock kills what is left; a rank alone kills itself
past its deadline; a cancelled run is killed at once. Jobs see a scrubbed environment."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from hpc_ds1.machine.devicelock import Cancelled, device_lock
from hpc_ds1.runner import Status, run
from hpc_ds1.runner.api import job_env, mpiexec_path
from hpc_ds1.runner.jobspec import JobSpec
from hpc_ds1.runner.procs import MARKER_VAR, kill_marked
from hpc_ds1.space import Config
from hpc_ds1.workloads import command_workload, register, unregister
from tests.runner import plugins
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Config(ranks=2, threads=1, tile=1)
WAIT_S = 90.0  # generous bound on conditions that normally hold within a second or two

# A runner in a process of its own: holds the device lock and runs a job that never ends.
RUNNER = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from hpc_ds1.machine.devicelock import device_lock
from hpc_ds1.runner import run
from hpc_ds1.space import Config
from hpc_ds1.workloads import register
from tests.runner import plugins

register(plugins.HANG, replace=True)
with device_lock(Path({home!r})):
    run("test-hang", 4, Config(ranks=2, threads=1, tile=1), repeats=1, timeout_s=3600)
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def rank_pids(pid_dir: Path, count: int = 2) -> list[int]:
    wait_for(
        "the ranks started", lambda: len(list(pid_dir.glob("*.pid"))) >= count, within_s=WAIT_S
    )
    return [int(p.read_text()) for p in pid_dir.glob("*.pid")]


def lock_is_free(home: Path) -> bool:
    try:
        with device_lock(home, timeout=0.2):
            return True
    except TimeoutError:
        return False


def start_runner(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    home, pid_dir = tmp_path / "home", tmp_path / "pids"
    pid_dir.mkdir()
    env = {**os.environ, "HPCDS1_TEST_PID_DIR": str(pid_dir)}
    code = RUNNER.format(root=str(ROOT), home=str(home))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT)
    return proc, home, pid_dir


def test_runner_killed_mid_job_takes_the_job_with_it_and_then_frees_the_device(
    tmp_path: Path,
) -> None:
    runner, home, pid_dir = start_runner(tmp_path)
    job: list[psutil.Process] = []
    try:
        ranks = rank_pids(pid_dir)
        job = psutil.Process(runner.pid).children(recursive=True)
        assert len(job) >= 4  # guard, mpiexec, proxy, ranks
        assert not lock_is_free(home)
        runner.kill()
        runner.wait()
        wait_for(
            "every job process died", lambda: not any(alive(p.pid) for p in job), within_s=WAIT_S
        )
        assert not [pid for pid in ranks if alive(pid)]
        wait_for("the device lock was freed", lambda: lock_is_free(home), within_s=WAIT_S)
    finally:
        runner.kill()
        for proc in job:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def test_leftovers_of_a_dead_runner_and_guard_are_killed_by_the_next_holder(
    tmp_path: Path,
) -> None:
    runner, home, pid_dir = start_runner(tmp_path)
    marker = ""
    try:
        ranks = rank_pids(pid_dir)
        guard = psutil.Process(runner.pid).children()[0]
        marker = guard.environ()[MARKER_VAR]
        assert marker in (home / "device.lock").read_text()  # the running job is on record
        guard.kill()  # the guard first, so nothing is left to clean up after the runner
        wait_for("the guard died", lambda: not alive(guard.pid), within_s=WAIT_S)
        runner.kill()
        runner.wait()
        assert [pid for pid in ranks if alive(pid)]  # orphans: they would run on for an hour
        with device_lock(home, timeout=WAIT_S):  # the next job finds them on record, kills them
            assert not [pid for pid in ranks if alive(pid)]
            assert (home / "device.lock").read_text() == ""
    finally:
        runner.kill()
        if marker:
            kill_marked(marker)


def test_a_rank_kills_itself_past_its_deadline(tmp_path: Path) -> None:
    """No runner, no guard: mpiexec and the rank program alone, the job hanging for an hour;
    the ranks end themselves (SIGALRM) past their deadline, and mpiexec with them."""
    spec = JobSpec("test-hang", 4, 1, 1, 1, module="tests.runner.plugins")
    argv = [mpiexec_path(), "-n", "2", sys.executable, "-m", "hpc_ds1.runner.rank"]
    argv += ["--job", spec.encode(), "--job-timeout-s", "5"]
    proc = subprocess.Popen(argv, env=job_env(1), stdout=subprocess.PIPE, text=True, cwd=ROOT)
    ranks: list[psutil.Process] = []

    def ranks_seen() -> bool:
        nonlocal ranks
        with contextlib.suppress(psutil.Error):
            ranks = [
                p
                for p in psutil.Process(proc.pid).children(recursive=True)
                if "hpc_ds1.runner.rank" in " ".join(p.cmdline())
            ]
        return len(ranks) == 2 or proc.poll() is not None

    try:
        wait_for("the ranks started", ranks_seen, within_s=WAIT_S)
        out, _ = proc.communicate(timeout=WAIT_S)  # an hour without the deadline
        assert proc.returncode != 0
        assert "Alarm clock" in out or "signal 14" in out
        assert not [p.pid for p in ranks if alive(p.pid)]
    finally:
        proc.kill()
        for rank in ranks:
            with contextlib.suppress(psutil.Error):
                rank.kill()


def test_a_cancelled_run_is_killed_and_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCDS1_TEST_PID_DIR", str(tmp_path))
    register(plugins.HANG, replace=True)
    cancel = threading.Event()
    outcome: list[BaseException] = []

    def target() -> None:
        try:
            with device_lock(tmp_path / "home"):
                run("test-hang", 4, CONFIG, repeats=1, timeout_s=3600, cancel=cancel)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    try:
        ranks = rank_pids(tmp_path)
        cancel.set()
        thread.join(WAIT_S)
        assert not thread.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], Cancelled)
        assert not [pid for pid in ranks if alive(pid)]
        assert lock_is_free(tmp_path / "home")
    finally:
        cancel.set()
        unregister(plugins.HANG.name)


def test_waiting_for_the_device_can_be_cancelled(tmp_path: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    with device_lock(tmp_path), pytest.raises(Cancelled), device_lock(tmp_path, cancel=cancel):
        pass


SECRETS = {
    "HPC_DS1_DATABASE_URL": "postgresql://hpc:s3cret@db/hpc",
    "HPC_DS1_NATS_URL": "nats://svc:s3cret@127.0.0.1:4222",
    "HPC_DS1_HOME": "/srv/hpc",
    "PGPASSWORD": "s3cret",
    "GITHUB_TOKEN": "s3cret",
    "AWS_SECRET_ACCESS_KEY": "s3cret",
    "DATABASE_URL": "postgresql://x:s3cret@db/x",
    "OMP_SECRET": "s3cret",  # an allowed prefix does not let a secret's name through
    "RANDOM_UNLISTED": "x",
}


def test_a_job_sees_none_of_the_services_settings_nor_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_PLACES", "cores")
    out = tmp_path / "env.json"
    body = (
        "import json, os; "
        f"open({str(out)!r}, 'w').write(json.dumps(dict(os.environ))); "
        "print('runtime_s=0.01')"
    )
    wl = command_workload("test-cmd-env", f"{sys.executable} -c {body!r}")
    result = run(wl, 1, CONFIG, repeats=1)
    assert result.status is Status.OK, result.error
    seen = json.loads(out.read_text())
    assert not set(SECRETS) & set(seen)
    assert "s3cret" not in json.dumps(seen)
    assert not [k for k in seen if k.startswith("HPC_DS1_")]
    assert seen["PATH"] and seen["OMP_PLACES"] == "cores" and seen["OMP_NUM_THREADS"] == "1"
    assert MARKER_VAR in seen


def test_a_signal_to_the_guard_kills_the_job(tmp_path: Path) -> None:
    """A guard asked to stop (SIGTERM) kills the whole job before it exits."""
    marker = tmp_path / "child.pid"
    body = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(3600)"
    from hpc_ds1.runner.procs import Process

    with Process([sys.executable, "-c", body], job_env(1)) as proc:
        wait_for("the command started", marker.exists, within_s=WAIT_S)
        wait_for("the command wrote its pid", lambda: marker.read_text() != "", within_s=WAIT_S)
        child = int(marker.read_text())
        os.kill(proc.popen.pid, signal.SIGTERM)
        assert proc.wait(WAIT_S) is not None
        wait_for("the command died with its guard", lambda: not alive(child), within_s=WAIT_S)
