"""The public Python entry: `hpc_ds1.load()` returns this machine's model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import Model


class NoModelError(FileNotFoundError):
    """This home has no trained model yet."""


def load(home: str | Path | None = None, *, log_decisions: bool = True) -> Model:
    """This machine's model, from `$HPC_DS1_HOME/models/latest.onnx` (or `home`'s).

    The model is tied to the machine it runs on: the hardware guard compares it with the one the
    model was trained on (a model copied from elsewhere escalates, saying what differs) and the
    configuration space is this allocation's CPUs. `observe()` queues on this home's device
    lock. Each `decide()` is appended to the home's log and audit trail when `hpc-ds1 serve` runs
    for it (the Decision then carries its `decision_id`); when none runs, the decision is still
    returned and a warning (DecisionNotLogged, once) says it was not logged. `log_decisions=False`
    keeps decisions out of the log on purpose."""
    from .decision_log import DecisionLog
    from .machine.hardware import fingerprint
    from .model import Model
    from .models_store import latest_path
    from .settings import Settings
    from .workloads import use_home

    settings = Settings(home=Path(home)) if home is not None else Settings()
    use_home(settings.home)  # the home's own workloads (workloads/*.toml), as --home does
    path = latest_path(settings.models_dir)
    if path is None:
        raise NoModelError(
            f"no model for this machine in {settings.models_dir}: run `hpc-ds1 setup --quick` "
            "(measures this machine, then trains) first"
        )
    model = Model.from_onnx(path.read_bytes())
    log = DecisionLog(settings) if log_decisions else None
    return model.bind(fingerprint(), home=settings.home, log=log)
