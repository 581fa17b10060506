"""The two 36-configuration recorded GPU fixtures (tests/tuning/data: a cut of the benchmark
hub's convolution on the A100 and the A6000) as workload files in a home."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "tuning" / "data"
KERNEL = DATA / "convolution_milo_cut.json"


def write_recorded(home: Path, name: str, gpu: str) -> Path:
    """`home`/workloads/`name`.toml replaying the fixture of `gpu` (A100 or A6000)."""
    folder = home / "workloads"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(
        "[workload]\n"
        f'name = "{name}"\n'
        f'recorded = "{DATA / f"convolution_milo_{gpu}_cut.json"}"\n'
        f'kernel = "{KERNEL}"\n'
    )
    return path
