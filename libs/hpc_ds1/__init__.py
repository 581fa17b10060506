"""HPC-DS1: learns each machine from real measurements and tunes HPC jobs one change at a time.

import hpc_ds1
model = hpc_ds1.load()                       # this machine's model
state = model.observe("gemm", 2048, {"ranks": 2, "threads": 2})
d = model.decide(state)                      # d.choice, d.confidence, d.mode, d.reasons
"""

from .api import NoModelError, load

__version__ = "0.1.0"
__all__ = ["NoModelError", "__version__", "load"]
