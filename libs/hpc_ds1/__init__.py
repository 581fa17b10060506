"""HPC-DS1: learns each machine from real measurements and tunes HPC jobs one change at a time.

import hpc_ds1
model = hpc_ds1.load()                       # this machine's model
state = model.observe("gemm", 2048, {"ranks": 2, "threads": 2})
d = model.decide(state)                      # d.choice, d.confidence, d.mode, d.reasons
r = model.recommend("gemm", 2048)            # r.config, r.predicted_runtime_s, r.confidence

`Model`, `State`, `Decision`, `Recommendation` and `Config` are importable from here; each has
its own docstring (help(hpc_ds1.Model)). The model types load on first use, so `import hpc_ds1`
stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .api import NoModelError, load

if TYPE_CHECKING:
    from .decision_log import DecisionNotLogged
    from .model import Decision, Model, ObservationFailed, Recommendation, State
    from .space import Config

from .version import __version__

__all__ = [
    "Config",
    "Decision",
    "DecisionNotLogged",
    "Model",
    "NoModelError",
    "ObservationFailed",
    "Recommendation",
    "State",
    "__version__",
    "load",
]

_LAZY = {
    "Config": "hpc_ds1.space",
    "Decision": "hpc_ds1.model.schema",
    "DecisionNotLogged": "hpc_ds1.decision_log",
    "Model": "hpc_ds1.model.inference",
    "ObservationFailed": "hpc_ds1.model.inference",
    "Recommendation": "hpc_ds1.model.schema",
    "State": "hpc_ds1.model.schema",
}


def __getattr__(name: str) -> Any:
    # The model stack (onnxruntime, numpy) loads only when a program asks for it.
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hpc_ds1' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
