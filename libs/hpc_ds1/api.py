"""The public Python entry: `hpc_ds1.load()` returns this machine's model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import Model


class NoModelError(FileNotFoundError):
    """This home has no trained model yet."""


def load(home: str | Path | None = None) -> Model:
    """This machine's model, from `$HPC_DS1_HOME/models/latest.onnx` (or `home`)."""
    from .model import Model
    from .models_store import latest_path
    from .settings import Settings

    settings = Settings(home=Path(home)) if home is not None else Settings()
    path = latest_path(settings.models_dir)
    if path is None:
        raise NoModelError(
            f"no model for this machine in {settings.models_dir}: run `hpc-ds1 setup --quick` "
            "(measures this machine, then trains) first"
        )
    return Model.from_onnx(path.read_bytes())
