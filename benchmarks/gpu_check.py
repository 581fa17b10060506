"""The numba-cuda kernels on a real GPU: what CI cannot check (it has none; the suite runs them
in numba's CUDA simulator at tiny sizes). Prints one JSON object and writes it to --out:

1. what this device reports: CUDA devices, the fingerprint's GPUs, the configuration space's
   GPU configurations;
2. each kernel on the GPU in this process at small sizes, through the same prepare/run/check
   as a rank (no MPI needed);
3. each workload through the real runner (mpiexec, a rank process, warm-up then timed repeats,
   the workload's correctness check) at its largest training size, GPU against the CPU at all
   its cores (one rank, numba threads = CPUs), same launch path, same repeats;
4. the CLI line `hpc-ds1 run --workload stencil --size N --gpu --json`.

A step that fails records its error and the next one runs. Run (a machine with a CUDA GPU):

    .venv/bin/python benchmarks/gpu_check.py [--out gpu_check.json] [--repeats 3]

The GPU kernels copy their operands to the device and results back in every timed run (the
runner times what a job costs end to end), so a GPU/CPU ratio here includes PCIe/NVLink
transfers; it is not a kernel-only speed-up."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

SMALL = {"gemm": 200, "stencil": 40, "nbody": 512, "montecarlo": 100_000}
# --tiny: what numba's CUDA simulator runs in seconds (CI has no GPU; tests/benchmarks)
TINY = {"gemm": 20, "stencil": 7, "nbody": 24, "montecarlo": 300}


def _step(report: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    start = time.perf_counter()
    try:
        report[name] = {"ok": True, "result": fn()}
    except Exception as error:  # a failed step is reported and the next one runs
        report[name] = {"ok": False, "error": repr(error), "trace": traceback.format_exc()[-3000:]}
    report[name]["seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps({name: report[name]}, default=str), flush=True)


def device_report() -> dict[str, Any]:
    from numba import cuda

    from hpc_ds1.machine.hardware import fingerprint
    from hpc_ds1.space import ConfigSpace

    out: dict[str, Any] = {"cuda_available": bool(cuda.is_available())}
    names = [getattr(d, "name", d) for d in cuda.list_devices()]
    out["cuda_devices"] = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    fp = fingerprint()
    out["fingerprint_gpus"] = [g.model_dump() for g in fp.gpus]
    out["device_id"] = fp.device_id
    out["cpus"] = fp.cpus
    space = ConfigSpace.for_device(workload="gemm")
    configs = space.configs()
    out["space_has_gpu"] = space.has_gpu
    out["gpu_configs"] = [c.label() for c in configs if c.gpu]
    out["configs"] = len(configs)
    return out


def in_process(sizes: dict[str, int]) -> dict[str, Any]:
    from hpc_ds1.workloads import RankContext, get_workload
    from hpc_ds1.workloads.comm import SelfComm

    out = {}
    for name, n in sizes.items():
        wl = get_workload(name)
        job = wl.prepare(RankContext(SelfComm(), threads=1, gpu=True), n, wl.default_tile)
        start = time.perf_counter()
        job.run()
        first = time.perf_counter() - start
        start = time.perf_counter()
        job.run()
        second = time.perf_counter() - start
        check = job.check()
        out[name] = {
            "size": n,
            "check_ok": check.ok,
            "check_error": check.error,
            "first_run_s": round(first, 4),
            "second_run_s": round(second, 4),
        }
    return out


STENCIL_SHAPES = ((8, 8, 4), (32, 4, 2), (32, 8, 1), (64, 4, 1), (128, 2, 1), (32, 4, 4))


def stencil_shapes(n: int, sweeps: int) -> dict[str, Any]:
    """One Jacobi sweep of an n^3 grid, device-resident, timed with CUDA events (mean of
    `sweeps` after a warm-up) for each launch shape; every shape's result must equal the
    current shape's bit for bit (the kernel reads only src, so any shape computes the same)."""
    import numpy as np
    from numba import cuda

    from hpc_ds1.workloads import gpu

    rng = np.random.default_rng(0)
    src = cuda.to_device(rng.random((n, n, n)))
    out: dict[str, Any] = {"n": n, "sweeps": sweeps, "current": list(gpu.STENCIL_BLOCK)}
    reference = None
    for shape in STENCIL_SHAPES:
        dst = cuda.to_device(np.zeros((n, n, n)))
        gpu.stencil_sweep(src, dst, shape)
        start, end = cuda.event(), cuda.event()
        start.record()
        for _ in range(sweeps):
            gpu._stencil_kernel[_grid(src.shape, shape), shape](src, dst)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / sweeps
        host = dst.copy_to_host()
        if reference is None:
            reference = host
        moved = 2 * 8 * n**3  # one read and one write of every point, at best
        out["x".join(map(str, shape))] = {
            "ms_per_sweep": round(ms, 4),
            "GB_per_s": round(moved / ms / 1e6, 1),
            "same_result": bool(np.array_equal(host, reference)),
        }
    return out


def _grid(shape: tuple[int, ...], block: tuple[int, int, int]) -> tuple[int, ...]:
    nz, ny, nx = shape
    return tuple((d + s - 1) // s for d, s in zip((nx, ny, nz), block, strict=True))


def runner_pair(name: str, size: int, repeats: int, cpus: int) -> dict[str, Any]:
    from hpc_ds1.runner import run
    from hpc_ds1.space import Config
    from hpc_ds1.workloads import get_workload

    wl = get_workload(name)
    tile, block = wl.default_tile, wl.default_block
    out: dict[str, Any] = {}
    for label, config in (
        ("cpu", Config(ranks=1, threads=cpus, tile=tile, block=block, gpu=False)),
        ("gpu", Config(ranks=1, threads=1, tile=tile, block=0, gpu=True)),
    ):
        r = run(name, size, config, repeats=repeats, timeout_s=120)
        out[label] = {
            "config": r.config.label(),
            "status": str(r.status),
            "runtime_s": r.runtime_s,
            "runtimes_s": list(r.runtimes_s),
            "spread": r.spread,
            "check_ok": r.check_ok,
            "check_error": r.check_error,
            "check_detail": r.check_detail,
            "warmup_s": r.warmup_s,
            "throughput": r.throughput,
            "throughput_unit": r.throughput_unit,
            "error": r.error,
        }
    cpu_s, gpu_s = out["cpu"]["runtime_s"], out["gpu"]["runtime_s"]
    if cpu_s and gpu_s:
        out["cpu_over_gpu"] = cpu_s / gpu_s
    return out


def cli_line(size: int) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-c",
        "import sys; from hpc_ds1.cli import main; sys.exit(main())",
        "run",
        "--workload",
        "stencil",
        "--size",
        str(size),
        "--gpu",
        "--json",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"rc {done.returncode}: {done.stderr[-2000:]}")
    result = json.loads(done.stdout)
    return {k: result.get(k) for k in ("config", "status", "runtime_s", "check_ok", "spread")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--small",
        action="store_true",
        help="the smallest training size of each workload (default: the largest)",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="tiny sizes everywhere: the CUDA simulator's smoke run (CI)",
    )
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"argv": argv or sys.argv[1:], "python": sys.version.split()[0]}
    _step(report, "device", device_report)
    _step(report, "in_process_small", lambda: in_process(TINY if args.tiny else SMALL))
    from hpc_ds1.workloads import get_workload

    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":  # the simulator has no CUDA events
        _step(report, "stencil_launch_shapes", lambda: stencil_shapes(384, 50))
    cpus = int(report["device"].get("result", {}).get("cpus") or os.cpu_count() or 1)
    for name in ("gemm", "stencil", "nbody", "montecarlo"):
        wl = get_workload(name)
        sizes = (TINY[name],) if args.tiny else wl.sizes[:1] if args.small else wl.sizes[-1:]
        for size in sizes:
            _step(
                report,
                f"runner_{name}_{size}",
                lambda n=name, s=size: runner_pair(n, s, args.repeats, cpus),
            )
    cli_size = TINY["stencil"] if args.tiny else get_workload("stencil").sizes[-1]
    _step(report, "cli_stencil", lambda: cli_line(cli_size))
    args.out.write_text(json.dumps(report, indent=1, default=str))
    failed = [k for k, v in report.items() if isinstance(v, dict) and not v.get("ok", True)]
    print(json.dumps({"failed_steps": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
