"""The rank program: `mpiexec -n R python -m hpc_ds1.runner.rank --job ... [--job ...]`.

Every rank runs the jobs in turn. Per job: prepare (collective), one untimed warm-up (JIT and
thread-pool start), `repeats` timed runs between barriers (a run's time is the slowest rank's),
the check, then resident memory. Rank 0 reports one `@@HPCDS1 {json}` line per event on stdout.
A job that raises aborts the whole MPI job (the launcher relaunches for the jobs after it).

A rank never outlives its launcher nor its deadline, even inside a kernel that holds the GIL:
the kernel sends it SIGKILL when its parent (the MPI launcher's proxy) dies, and SIGALRM (whose
default action ends the process) at `--launch-deadline` before the first job and
`--job-timeout-s` after each job's start; a watchdog thread also exits when it is reparented."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

from hpc_ds1.runner import protocol
from hpc_ds1.runner.jobspec import knob_values

PR_SET_PDEATHSIG = 1
WATCH_S = 0.5


def die_with_parent() -> None:
    """SIGKILL from the kernel when the parent dies; a thread that exits once reparented."""
    parent = os.getppid()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(137)

    def watch() -> None:
        while True:
            time.sleep(WATCH_S)
            if os.getppid() != parent:
                os._exit(137)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def alarm_in(seconds: float) -> None:
    """End this process (SIGALRM, default action) `seconds` from now, replacing any alarm."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))


def skip_blas_probe() -> None:
    """Numba's first compile or cache load imports `numba.np.arraymath`, which probes for BLAS
    by importing `scipy.linalg`: 0.2 s of CPU in every rank of every launch (measured), for a
    library no built-in kernel calls from jitted code. Marking the module absent makes the probe
    answer "no BLAS" at once. Only for built-in workloads: a plug-in's kernel may call np.dot."""
    sys.modules.setdefault("scipy.linalg", None)  # type: ignore[arg-type]


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(protocol.encode(event))
    sys.stdout.flush()


def _select_gpu(rank: int) -> None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return
    from numba import cuda

    cuda.select_device(rank % len(cuda.list_devices()))


def run_job(comm: Any, spec: Any) -> dict[str, Any]:
    import numba
    import psutil
    from mpi4py import MPI

    from hpc_ds1.workloads import RankContext, resolve

    workload = resolve(spec.workload, spec.module)
    numba.set_num_threads(spec.threads)
    if spec.gpu:
        _select_gpu(comm.Get_rank())
    ctx = RankContext(comm, spec.threads, spec.gpu)
    knobs = knob_values(spec, workload.knobs) if workload.knobs else None
    prepared = workload.prepare_job(ctx, spec.size, spec.tile, spec.block, knobs)
    comm.Barrier()
    start = time.perf_counter()
    prepared.run()
    warmup = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
    times = []
    for _ in range(spec.repeats):
        comm.Barrier()
        start = time.perf_counter()
        prepared.run()
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    check = prepared.check()
    rss = comm.allreduce(psutil.Process().memory_info().rss, op=MPI.SUM)
    del prepared
    gc.collect()
    return {
        "warmup_s": warmup,
        "times": times,
        "check_ok": bool(check.ok),
        "check_error": float(check.error),
        "check_detail": check.detail,
        "peak_memory_bytes": int(rss),
    }


def main(argv: Sequence[str] | None = None) -> int:
    from hpc_ds1.runner.jobspec import JobSpec

    parser = argparse.ArgumentParser(prog="python -m hpc_ds1.runner.rank")
    parser.add_argument("--job", action="append", default=[], type=JobSpec.decode)
    parser.add_argument("--launched-at", type=float, default=None)
    parser.add_argument("--launch-deadline", type=float, default=None, help="epoch seconds")
    parser.add_argument("--job-timeout-s", type=float, default=None)
    parser.add_argument("--report-file", default=None, help="where a failing job's error goes")
    args = parser.parse_args(argv)
    die_with_parent()
    if all(not spec.module for spec in args.job):
        skip_blas_probe()
    if args.launch_deadline is not None:
        alarm_in(args.launch_deadline - time.time())

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    import hpc_ds1.workloads  # noqa: F401  (imports numba and the built-ins before timing)

    launched = args.launched_at if args.launched_at is not None else time.time()
    startup = comm.allreduce(time.time() - launched, op=MPI.MAX)
    if rank == 0:
        emit({"event": "ready", "startup_s": startup, "ranks": comm.Get_size()})
    for index, spec in enumerate(args.job):
        if args.job_timeout_s is not None:
            alarm_in(args.job_timeout_s)
        if rank == 0:
            emit({"event": "start", "index": index})
        try:
            outcome = run_job(comm, spec)
        except Exception as error:
            failed = {
                "event": "error",
                "index": index,
                "rank": rank,
                "error": f"{type(error).__name__}: {error}",
            }
            protocol.report(args.report_file, failed)
            traceback.print_exc()
            sys.stderr.flush()
            emit(failed)
            comm.Abort(3)
            return 3
        if rank == 0:
            emit({"event": "result", "index": index, **outcome})
    comm.Barrier()
    # Python's teardown collects every object numba and LLVM made: 0.1-0.3 s of CPU a rank,
    # paid by every launch after its last result (measured). Frozen, they are left to the
    # exit; atexit still runs (mpi4py's MPI_Finalize), so the launcher sees a clean end.
    gc.freeze()
    return 0


if __name__ == "__main__":
    sys.exit(main())
