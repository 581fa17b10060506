"""Run jobs for real: `run(workload, size, config)` and `run_many(jobs)` (one launch per ranks).

from hpc_ds1.runner import run, run_many, RunResult, Job
"""

from hpc_ds1.runner.api import run, run_many
from hpc_ds1.runner.noise import is_faster, noise_threshold, relative_spread
from hpc_ds1.runner.result import Job, RunResult, Status
from hpc_ds1.runner.validate import InvalidJob, validate

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
    "validate",
]
