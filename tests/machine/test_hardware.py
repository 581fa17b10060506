from __future__ import annotations

import json
import subprocess
import sys

from hpc_ds1.machine.hardware import device_id_of, fingerprint


def test_fingerprint_describes_this_machine() -> None:
    fp = fingerprint()
    assert fp.logical_cpus >= 1 and fp.physical_cores >= 1 and fp.sockets >= 1
    assert fp.memory_bytes > 0
    assert fp.cpu_model
    assert "MPICH" in fp.mpi_library
    assert fp.numba_version
    assert len(fp.device_id) == 16
    json.loads(fp.model_dump_json())


def test_device_id_is_stable_across_calls_and_processes() -> None:
    fingerprint.cache_clear()
    first = fingerprint()
    fingerprint.cache_clear()
    second = fingerprint()
    assert first.device_id == second.device_id
    code = "from hpc_ds1.machine.hardware import fingerprint; print(fingerprint().device_id)"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == first.device_id


def test_device_id_ignores_nothing_but_changes_with_hardware() -> None:
    base = {"cpu_model": "x", "memory_gib": 24}
    assert device_id_of(base) == device_id_of(dict(base))
    assert device_id_of(base) != device_id_of({**base, "memory_gib": 48})


def test_the_mpi_library_line_keeps_no_control_character() -> None:
    """Open MPI 4.1's version string ends in a NUL, which Postgres cannot keep in JSON text."""
    from hpc_ds1.machine.hardware import printable

    line = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, May 26, 2022\x00\n"
    assert printable(line) == "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, May 26, 2022"
    assert printable("MPICH Version:\t5.0.2\n") == "MPICH Version:\t5.0.2"  # tabs are kept
