"""A user's own C/OpenMP application, declared in the home's workloads/heat.toml, goes through
the commands as a built-in does: `run` under 2 MPI ranks, a tiny `setup` (one size, every
configuration) that trains a model including it, `decide` on it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from hpc_ds1.settings import Settings
from hpc_ds1.space import ALL_ACTIONS
from tests.commands import HPC_DS1, cli_env
from tests.workloads.heatapp import build_heat, write_heat_toml


def hpc(settings: Settings, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPC_DS1, *args],
        env=cli_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_toml_workload_is_run_set_up_and_decided(settings: Settings, tmp_path: Path) -> None:
    folder = settings.home / "workloads"
    folder.mkdir(parents=True)
    build_heat(folder)
    write_heat_toml(folder)

    ran = hpc(settings, "run", "--workload", "heat", "--size", "64", "--ranks", "2",
              "--threads", "1", "--tile", "64", "--repeats", "1", "--json")  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout)
    assert result["status"] == "ok" and result["check_ok"] is True
    assert " -n 2 ./heat --n 64 --block 64" in result["command"]

    setup = hpc(settings, "setup", "--workload", "heat", "--sizes", "64", "--repeats", "1")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "measured 10 runs" in setup.stdout and "trained model" in setup.stdout, setup.stdout

    decided = hpc(settings, "decide", "--workload", "heat", "--size", "96", "--ranks", "1",
                  "--threads", "1", "--json")  # fmt: skip
    assert decided.returncode == 0, decided.stdout + decided.stderr
    decision = json.loads(decided.stdout)
    assert decision["workload"] == "heat" and decision["ran"] is True
    assert decision["choice"] in ALL_ACTIONS
    assert decision["config"]["tile"] == 16  # the knob's default
