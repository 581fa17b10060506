"""Run jobs for real: `run(workload, size, config)` and `run_many(jobs)` (one launch per ranks).

from hpc_ds1.runner import run, run_many, RunResult, Job

The names are imported on first use: every rank of every launch imports this package for the
rank program's protocol, and importing the runner's API with it took 0.13 s of each rank's
start (measured, `python -X importtime`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpc_ds1.runner.api import run, run_many, run_repeats, run_timeout
    from hpc_ds1.runner.checks import InvalidJob, validate
    from hpc_ds1.runner.noise import is_faster, noise_threshold, relative_spread
    from hpc_ds1.runner.result import Job, RunResult, Status

# No submodule may share a name with what it exports here: importing a submodule binds its
# name on the package, which would then shadow the lazy name (hence checks.py, not validate.py).
_MODULE_OF = {
    "InvalidJob": "checks",
    "Job": "result",
    "RunResult": "result",
    "Status": "result",
    "is_faster": "noise",
    "noise_threshold": "noise",
    "relative_spread": "noise",
    "run": "api",
    "run_many": "api",
    "run_repeats": "api",
    "run_timeout": "api",
    "validate": "checks",
}

__all__ = [
    "InvalidJob",
    "Job",
    "RunResult",
    "Status",
    "is_faster",
    "noise_threshold",
    "relative_spread",
    "run",
    "run_many",
    "run_repeats",
    "run_timeout",
    "validate",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
