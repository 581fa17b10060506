"""The GPU check's smoke run in numba's CUDA simulator (CI has no GPU): every step of the
script (device report, in-process kernels, the runner's CPU/GPU pair, the CLI line) runs at
tiny sizes and each kernel's own correctness check passes. The figures are the real GPU's to
give (docs/gpu.md); here only that the path works.

The default run takes each kind of step once, on the kernels the simulator runs fastest (its
functions called as the script calls them; tests/workloads/test_gpu_sim.py runs all four
kernels in process); the whole script, four runner pairs and the stencil's CLI line, is the
`slow` tier (`make test-slow`): about 115 s against 20 s on the 2-CPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIMULATOR = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}

# One of each step of benchmarks/gpu_check.py, through its own functions, in a fresh interpreter
# (the simulator's variable must be set before numba is imported).
ONE_OF_EACH = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("gpu_check", sys.argv[1])
gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gc)
report = {}
gc._step(report, "device", gc.device_report)
small = {name: gc.TINY[name] for name in ("nbody", "montecarlo")}
gc._step(report, "in_process_small", lambda: gc.in_process(small))
cpus = int(report["device"].get("result", {}).get("cpus") or 1)
gc._step(report, "runner_nbody", lambda: gc.runner_pair("nbody", gc.TINY["nbody"], 1, cpus))
print(json.dumps({"report": report}, default=str))
"""


def _check_device(device: dict) -> None:
    assert device["space_has_gpu"] and device["fingerprint_gpus"][0]["simulated"]
    # one GPU configuration per threads value: the GPU kernels have no tile nor block
    assert len(device["gpu_configs"]) == len({c.split(" tile=")[0] for c in device["gpu_configs"]})


def _check_pair(pair: dict) -> None:
    assert pair["cpu"]["check_ok"] and pair["gpu"]["check_ok"], pair
    assert "gpu=True" in pair["gpu"]["config"] and "gpu=False" in pair["cpu"]["config"]


def test_each_step_of_the_gpu_check_runs_in_the_simulator(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", ONE_OF_EACH, str(ROOT / "benchmarks" / "gpu_check.py")],
        env=SIMULATOR, capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])["report"]
    assert all(step["ok"] for step in report.values()), report
    _check_device(report["device"]["result"])
    for name, verdict in report["in_process_small"]["result"].items():
        assert verdict["check_ok"], (name, verdict)
    _check_pair(report["runner_nbody"]["result"])
    # the CLI line, as the script's cli_line() runs it, on the kernel the simulator runs fastest
    argv = ["run", "--workload", "nbody", "--size", "24", "--gpu", "--json"]
    cli = subprocess.run(
        [sys.executable, "-c", "import sys; from hpc_ds1.cli import main; sys.exit(main())", *argv],
        env=SIMULATOR, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-3000:]
    result = json.loads(cli.stdout)
    assert result["config"]["gpu"] is True and result["check_ok"] is True


@pytest.mark.slow
def test_the_gpu_check_runs_every_step_in_the_simulator(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--tiny", "--repeats", "1",
         "--out", str(out)],
        env=SIMULATOR, capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    _check_device(report["device"]["result"])
    for name, verdict in report["in_process_small"]["result"].items():
        assert verdict["check_ok"], (name, verdict)
    pairs = [v["result"] for k, v in report.items() if k.startswith("runner_")]
    assert len(pairs) == 4
    for pair in pairs:
        _check_pair(pair)
    assert report["cli_stencil"]["result"]["config"]["gpu"] is True
    assert report["cli_stencil"]["result"]["check_ok"] is True
