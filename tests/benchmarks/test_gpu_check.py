"""The GPU check's smoke run in numba's CUDA simulator (CI has no GPU): every step of the
script (device report, in-process kernels, the runner's CPU/GPU pair, the CLI line) runs at
tiny sizes and each kernel's own correctness check passes. The figures are the real GPU's to
give (docs/gpu.md); here only that the path works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_every_step_in_the_simulator(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--tiny", "--repeats", "1",
         "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    device = report["device"]["result"]
    assert device["space_has_gpu"] and device["fingerprint_gpus"][0]["simulated"]
    # one GPU configuration per threads value: the GPU kernels have no tile nor block
    assert len(device["gpu_configs"]) == len({c.split(" tile=")[0] for c in device["gpu_configs"]})
    for name, verdict in report["in_process_small"]["result"].items():
        assert verdict["check_ok"], (name, verdict)
    pairs = [v["result"] for k, v in report.items() if k.startswith("runner_")]
    assert len(pairs) == 4
    for pair in pairs:
        assert pair["cpu"]["check_ok"] and pair["gpu"]["check_ok"], pair
        assert "gpu=True" in pair["gpu"]["config"] and "gpu=False" in pair["cpu"]["config"]
    assert report["cli_stencil"]["result"]["config"]["gpu"] is True
    assert report["cli_stencil"]["result"]["check_ok"] is True
