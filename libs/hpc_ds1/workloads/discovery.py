"""Where TOML workload files are found, in this order (the first file to use a name keeps it):

1. `$HPC_DS1_HOME/workloads/*.toml` (default `~/.hpc_ds1/workloads/`), or the home a command
   is given with --home: every process of a home (setup, a served home's agent and trainer,
   decide, tune, evaluate) finds the same files there;
2. `HPC_DS1_WORKLOAD_PATH`: colon-separated files and folders (a folder's `*.toml`, not its
   subfolders), like PATH.

`--workload-file PATH` on `run` and `setup` loads one more file for that command only."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

HOME_VAR = "HPC_DS1_HOME"
PATH_VAR = "HPC_DS1_WORKLOAD_PATH"
HOME_FOLDER = "workloads"


def default_home() -> Path:
    """The home of this process's settings (read without them: a rank program imports this)."""
    return Path(os.environ.get(HOME_VAR) or "~/.hpc_ds1").expanduser().resolve()


def _tomls(folder: Path) -> list[Path]:
    try:
        return sorted(p.resolve() for p in folder.glob("*.toml") if p.is_file())
    except OSError:
        return []


def home_files(home: Path) -> list[Path]:
    return _tomls(home / HOME_FOLDER)


def path_files(value: str | None = None) -> list[Path]:
    """The files HPC_DS1_WORKLOAD_PATH names (an entry that does not exist is kept, so that
    loading it says so)."""
    text = os.environ.get(PATH_VAR, "") if value is None else value
    out: list[Path] = []
    for entry in (e for e in text.split(os.pathsep) if e.strip()):
        path = Path(entry).expanduser()
        out.extend(_tomls(path) if path.is_dir() else [path.resolve()])
    return out


def workload_files(home: Path, path_value: str | None = None) -> list[Path]:
    return _unique([*home_files(home), *path_files(path_value)])


def _unique(paths: Iterable[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))
