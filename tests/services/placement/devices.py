"""The hardware fingerprint the placement tests register their devices with (its values do not
matter to placement: only the device ids and estimates do)."""

from __future__ import annotations

FP = {
    "device_id": "hw",
    "hostname": "node",
    "cpu_model": "x",
    "architecture": "x86_64",
    "sockets": 1,
    "physical_cores": 2,
    "logical_cpus": 4,
    "simd": [],
    "memory_bytes": 8 * 2**30,
    "caches": {},
    "gpus": [],
    "mpi_library": "MPICH",
    "numba_version": "0.60",
    "python_version": "3.11",
}
