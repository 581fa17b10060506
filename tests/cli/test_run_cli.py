"""`hpc-ds1 run` holds the device like every other real run: it waits while another job of the
same home holds `device.lock`, then runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from hpc_ds1.machine.devicelock import device_lock
from tests.support.commands import HPC_DS1


def test_run_waits_for_the_device_lock(tmp_path: Path) -> None:
    home = tmp_path / "home"
    marker = tmp_path / "ran"
    body = f"import pathlib; pathlib.Path({str(marker)!r}).touch(); print('runtime_s=0.01')"
    command = f"{sys.executable} -c {body!r}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env["HPC_DS1_HOME"] = str(home)
    argv = [HPC_DS1, "run", "--workload", "probe", "--size", "1", "--repeats", "1"]
    with device_lock(home):
        job = subprocess.Popen(
            [*argv, "--command", command],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # While another job holds the device, the run must not start (whatever the load:
        # a run that ignored the lock could only be later, never earlier, than this check).
        time.sleep(3)
        held_out = not marker.exists()
        still_waiting = job.poll() is None
    out, err = job.communicate(timeout=120)
    assert held_out and still_waiting, (out, err)
    assert job.returncode == 0, (out, err)
    assert marker.exists()
