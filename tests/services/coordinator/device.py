"""The device the coordinator's tests start sessions on: its id, fingerprint and start."""

from __future__ import annotations

DEVICE = "dev-c"
FINGERPRINT = {
    "device_id": DEVICE,
    "hostname": "node",
    "cpu_model": "AMD EPYC",
    "architecture": "x86_64",
    "sockets": 1,
    "physical_cores": 2,
    "logical_cpus": 2,
    "simd": ["sse2", "avx2", "fma"],
    "memory_bytes": 8 * 2**30,
    "caches": {"L1d": "32K", "L2": "512K", "L3": "32768K"},
    "gpus": [],
    "mpi_library": "MPICH Version: 4",
    "numba_version": "0.60",
    "python_version": "3.11.7",
}
START = {"ranks": 1, "threads": 1, "tile": 32}
