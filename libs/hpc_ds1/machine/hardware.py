"""Hardware fingerprint of this device and a stable device id derived from its stable parts."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict, Field

SIMD_FLAGS = (
    "sse2", "sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512dq",
    "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile", "neon", "asimd", "sve",
)  # fmt: skip


class GPU(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    memory_bytes: int
    compute_capability: str = ""
    simulated: bool = False


class Fingerprint(BaseModel):
    model_config = ConfigDict(frozen=True)
    device_id: str
    hostname: str
    cpu_model: str
    architecture: str
    sockets: int
    physical_cores: int
    logical_cpus: int
    simd: tuple[str, ...]
    memory_bytes: int
    caches: dict[str, str]
    gpus: tuple[GPU, ...]
    mpi_library: str
    numba_version: str
    python_version: str
    # The allocation's CPUs (hpc_ds1.machine.allocation) when it was taken; None in fingerprints
    # recorded before it existed. Not part of the device id: the same node in a smaller job is the
    # same device, and the model's machine features keep the box's `logical_cpus`.
    usable_cpus: int | None = Field(default=None, ge=1)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def cpus(self) -> int:
        """The CPUs a job may use here: the allocation's, else the box's."""
        return self.usable_cpus or self.logical_cpus


def _cpuinfo() -> tuple[str, int, set[str], int]:
    model, flags, sockets, cores = platform.processor() or platform.machine(), set(), set(), set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    physical = ""
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in ("model name", "Model", "cpu model"):
            model = value
        elif key in ("flags", "Features"):
            flags.update(value.split())
        elif key == "physical id":
            physical = value
            sockets.add(value)
        elif key == "core id":
            cores.add((physical, value))
    logical = os.cpu_count() or 1
    return (
        model,
        max(len(sockets), 1),
        flags,
        len(cores) or psutil.cpu_count(logical=False) or logical,
    )


def _caches() -> dict[str, str]:
    out: dict[str, str] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        out[f"L{level}{suffix}"] = size
    return out


@functools.lru_cache(maxsize=1)
def _mpi_library() -> str:
    code = (
        "import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False\n"
        "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
        )
        return printable(done.stdout) or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def printable(text: str) -> str:
    """`text` without control characters but tabs (MPICH's version line has them), stripped:
    Open MPI 4.1's MPI_Get_library_version ends in a NUL, which Postgres cannot store in a
    JSON text and the gateway refuses (seen with HPC_DS1_NO_MPICH=1 and Debian's Open MPI)."""
    return "".join(c for c in text if c == "\t" or (c >= " " and c != "\x7f")).strip()


@functools.lru_cache(maxsize=1)
def _gpus() -> tuple[GPU, ...]:
    try:
        from numba import cuda

        if not cuda.is_available():
            return ()
        if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
            return (GPU(name="numba CUDA simulator", memory_bytes=0, simulated=True),)
        found = []
        for dev in cuda.list_devices():
            with dev:
                ctx = cuda.current_context()
                _, total = ctx.get_memory_info()
                name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
                cc = ".".join(str(x) for x in dev.compute_capability)
                found.append(GPU(name=name, memory_bytes=int(total), compute_capability=cc))
        return tuple(found)
    except Exception:
        return ()


def device_id_of(stable: dict[str, object]) -> str:
    blob = json.dumps(stable, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def fingerprint() -> Fingerprint:
    """This device. The id hashes hardware only: CPU, topology, SIMD, memory size (GiB), caches,
    GPUs. Software versions and the allocation's CPUs are reported beside it but do not change
    the id."""
    import numba

    from .allocation import detect

    model, sockets, flags, cores = _cpuinfo()
    logical = os.cpu_count() or 1
    simd = tuple(f for f in SIMD_FLAGS if f in flags)
    memory = int(psutil.virtual_memory().total)
    caches = _caches()
    gpus = _gpus()
    stable = {
        "cpu_model": model,
        "architecture": platform.machine(),
        "sockets": sockets,
        "physical_cores": cores,
        "logical_cpus": logical,
        "simd": simd,
        "memory_gib": round(memory / 2**30),
        "caches": caches,
        "gpus": [(g.name, round(g.memory_bytes / 2**30), g.simulated) for g in gpus],
    }
    return Fingerprint(
        device_id=device_id_of(stable),
        hostname=platform.node(),
        cpu_model=model,
        architecture=platform.machine(),
        sockets=sockets,
        physical_cores=cores,
        logical_cpus=logical,
        simd=simd,
        memory_bytes=memory,
        caches=caches,
        gpus=gpus,
        mpi_library=_mpi_library(),
        numba_version=numba.__version__,
        python_version=platform.python_version(),
        usable_cpus=detect().usable,
    )
