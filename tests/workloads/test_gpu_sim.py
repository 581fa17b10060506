"""The numba-cuda kernels in numba's CUDA simulator (a subprocess: the variable must be set
before numba is imported), tiny sizes, through the same prepare/run/check as on a real GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
import json
from hpc_ds1.workloads import RankContext, get_workload
from hpc_ds1.workloads.comm import SelfComm
out = {}
for name, n in (("gemm", 20), ("stencil", 7), ("nbody", 24), ("montecarlo", 300)):
    wl = get_workload(name)
    job = wl.prepare(RankContext(SelfComm(), threads=1, gpu=True), n, wl.default_tile)
    job.run()
    c = job.check()
    out[name] = [c.ok, c.error]
print(json.dumps(out))
"""


def test_gpu_kernels_in_the_cuda_simulator() -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(verdicts) == {"gemm", "stencil", "nbody", "montecarlo"}
    for name, (ok, error) in verdicts.items():
        assert ok, (name, error)


def test_gpu_knob_appears_with_a_gpu_only() -> None:
    code = (
        "from hpc_ds1.space import ConfigSpace\n"
        "s = ConfigSpace.for_device(workload='gemm')\n"
        "print(s.has_gpu, any(c.gpu for c in s.configs()))"
    )
    sim = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sim.stdout.split() == ["True", "True"], sim.stderr[-2000:]
    plain = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    real = subprocess.run(
        [sys.executable, "-c", code], env=plain, capture_output=True, text=True, timeout=120
    )
    from numba import cuda

    want = "True" if cuda.is_available() else "False"
    assert real.stdout.split() == [want, want], real.stderr[-2000:]
    json.dumps(real.stdout)
