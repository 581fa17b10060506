"""The grid application (data/gridapp.py, Python under our MPICH) with knobs of its own: a
block size, a P x Q process grid constrained to the ranks, and an algorithm switch."""

from __future__ import annotations

from pathlib import Path

APP = Path(__file__).with_name("data")

GRID_TOML = """\
[workload]
name = "{name}"
description = "block-cyclic sums over a P x Q grid"
command = "{{python}} gridapp.py --n {{size}} --nb {{nb}} --p {{p}} --q {{q}} --algo {{algo}}"
launcher = "mpi"
workdir = "{workdir}"
sizes = [256, 512]
held_out = [384]
warmup = false
constraints = ["p * q == ranks", "p <= q"]

[knobs]
nb = [8, 32]
p = [1, 2]
q = [1, 2]
algo = {{ values = ["pairwise", "sequential"] }}

[check]
regex = "error=([0-9.eE+-]+)"
max_error = 1e-12

[runtime]
regex = "time=([0-9.eE+-]+)"
"""


def write_grid_toml(folder: Path, name: str = "gridapp", text: str = GRID_TOML) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(text.format(name=name, workdir=APP))
    return path
