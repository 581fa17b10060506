"""The heat application (data/heat.c) built with this machine's gcc, and its workload file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("data") / "heat.c"

HEAT_TOML = """\
[workload]
name = "{name}"
description = "2-D heat equation, C/OpenMP"
command = "./heat --n {{size}} --block {{block}} --steps 5"
launcher = "mpi"
env = {{ OMP_NUM_THREADS = "{{threads}}" }}
sizes = [64, 128]
held_out = [96]
warmup = false

[knobs.block]
values = [16, 64]
default = 16

[check]
regex = "error=([0-9.eE+-]+)"
max_error = 1e-12

[runtime]
regex = "time=([0-9.eE+-]+)"
"""


def build_heat(folder: Path) -> Path:
    """Compile heat.c into `folder` (skip when the machine has no gcc)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed: the C/OpenMP workload cannot be built")
    binary = folder / "heat"
    subprocess.run(
        [gcc, "-O2", "-fopenmp", "-o", str(binary), str(SOURCE), "-lm"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return binary


def write_heat_toml(folder: Path, name: str = "heat", text: str = HEAT_TOML) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(text.format(name=name))
    return path
