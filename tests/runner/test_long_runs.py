"""Long runs are first-class (issue 44, item 4): a workload file's own `timeout` and `repeats`
are what a run gets; a cancelled run, and a Ctrl-C'd `hpc-ds1 run`, leave no rank of its
real MPI launch alive (read from /proc); a run in flight shows what runs and for how long.

The workload is a tiny command that records each rank's pid, then sleeps: real ranks under
our mpiexec (MPICH's Hydra) and, where Debian's Open MPI is installed, its own mpirun."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpc_ds1.machine.devicelock import Cancelled
from hpc_ds1.measure import while_in_flight
from hpc_ds1.runner import Job, Status, run, run_repeats, run_timeout
from hpc_ds1.runner.inflight import InFlight, Running, elapsed_words, job_words
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import CommandWorkload, WorkloadFileError
from tests.support.commands import HPC_DS1
from tests.support.sleeper import alive, rank_pids, sleeper

OPENMPI = shutil.which("mpirun.openmpi") is not None
CONFIG = Config(ranks=2, threads=1, tile=1)


def space(wl: CommandWorkload) -> ConfigSpace:
    return ConfigSpace.for_cpus(2, wl.tiles, 0, knobs=wl.knobs, constraints=wl.constraints)


def test_timeout_and_repeats_are_read_from_the_file_with_clear_errors(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    wl = sleeper(tmp_path, pids, 'timeout = "1.5m"\nrepeats = 2')
    assert (wl.timeout_s, wl.repeats) == (90.0, 2)
    assert run_timeout(wl) == 90.0 and run_repeats(wl) == 2
    assert run_timeout(wl, 5.0) == 5.0 and run_repeats(wl, 4) == 4  # a caller's own wins
    assert run_timeout(wl, cap=60.0) == 60.0  # never past a site's cap (an agent's)
    plain = sleeper(tmp_path, pids)
    assert (plain.timeout_s, plain.repeats) == (None, None)
    assert run_timeout(plain) == 300.0 and run_repeats(plain) == 3
    assert run_timeout(plain, cap=600.0, default=600.0) == 600.0  # an agent: its cap
    for bad, field, words in (
        ("timeout = 0", "[workload] timeout", "more than 0"),
        ('timeout = "ten minutes"', "[workload] timeout", '"10m"'),
        ("timeout = true", "[workload] timeout", "in seconds"),
        ("repeats = 0", "[workload] repeats", "1 to 50"),
        ("repeats = 2.5", "[workload] repeats", "whole number"),
    ):
        with pytest.raises(WorkloadFileError) as error:
            sleeper(tmp_path, pids, bad)
        message = str(error.value)
        assert str(tmp_path / "sleeper.toml") in message and field in message, message
        assert words in message, message


def test_a_run_past_its_declared_timeout_is_a_clear_timeout_and_leaves_no_rank(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    wl = sleeper(tmp_path, pids, "timeout = 2\nrepeats = 1")
    started = time.monotonic()
    result = run(wl, 60, CONFIG, space=space(wl))  # no timeout given: the file's 2 s
    took = time.monotonic() - started
    assert result.status is Status.TIMED_OUT, result
    assert "did not finish within 2 s" in result.error and "killed" in result.error
    assert took < 20, took  # not the default 300 s, nor the 60 s it would sleep
    left = [pid for pid in rank_pids(pids, 2, timeout=1) if alive(pid)]
    assert not left, f"processes of the launch left alive: {left}"


@pytest.mark.parametrize(
    "launcher",
    [
        "mpi",
        pytest.param(
            "openmpi",
            marks=pytest.mark.skipif(
                not OPENMPI, reason="Debian's Open MPI is not installed (make apps)"
            ),
        ),
    ],
)
def test_cancel_kills_the_whole_process_group_of_real_ranks(tmp_path: Path, launcher: str) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    wl = sleeper(tmp_path, pids, launcher=launcher)
    cancel = threading.Event()
    raised: list[BaseException] = []

    def go() -> None:
        try:
            run(wl, 120, CONFIG, repeats=1, space=space(wl), cancel=cancel)
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=go)
    thread.start()
    try:
        every = rank_pids(pids, 2)  # two ranks and their launcher's proxies, all running
        assert all(alive(pid) for pid in every)
        cancelled = time.monotonic()
        cancel.set()
        thread.join(30)
        took = time.monotonic() - cancelled
    finally:
        cancel.set()
        thread.join(30)
    assert raised and isinstance(raised[0], Cancelled), raised
    assert took < 10, took
    left = [pid for pid in every if alive(pid)]
    assert not left, f"processes of the launch left alive after cancel: {left}"


def test_ctrl_c_of_hpc_ds1_run_kills_every_rank(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    sleeper(tmp_path, pids)
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env["HPC_DS1_HOME"] = str(home)
    argv = [HPC_DS1, "run", "--workload-file", str(tmp_path / "sleeper.toml"), "--size", "120"]
    proc = subprocess.Popen(
        [*argv, "--ranks", "2", "--threads", "1", "--repeats", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as a terminal's foreground group: Ctrl-C reaches it alone
    )
    try:
        every = rank_pids(pids, 2)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground group
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "cancelled" in err and "killed" in err, err
    left = [pid for pid in every if alive(pid)]
    assert not left, f"processes of the launch left alive after Ctrl-C: {left}"


def test_the_run_in_flight_is_shown_and_beats_past_the_interval() -> None:
    inflight = InFlight()
    job = Job(
        workload="hpcc",
        size=800,
        config=Config(ranks=2, threads=1, tile=1, knobs={"nb": 64, "p": 1, "q": 2}),
        repeats=1,
    )
    shown: list[str] = []
    beats: list[tuple[int, int, float]] = []

    def measure() -> str:
        time.sleep(0.1)
        inflight.start(job)  # a run of 1.3 s: two heartbeats at 0.5 s intervals
        time.sleep(1.3)
        inflight.start(job.model_copy(update={"size": 1200}))  # a short one: none
        time.sleep(0.3)
        return "done"

    async def beat(now: Running, n: int) -> None:
        beats.append((now.number, n, now.elapsed_s))

    async def main() -> str:
        return await while_in_flight(
            asyncio.to_thread(measure),
            inflight,
            heartbeat_s=0.5,
            beat=beat,
            show=lambda now: shown.append(job_words(now.job)),
            tick_s=0.1,
        )

    assert asyncio.run(main()) == "done"
    assert [(number, n) for number, n, _ in beats] == [(1, 1), (1, 2)], beats
    assert all(elapsed >= 0.5 * n for _, n, elapsed in beats)
    assert "hpcc 800 · 2x1 nb=64 p=1 q=2" in shown and "hpcc 1200 · 2x1 nb=64 p=1 q=2" in shown
    assert [elapsed_words(s) for s in (3.2, 65, 3720)] == ["3 s", "1m05s", "1h02m"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
