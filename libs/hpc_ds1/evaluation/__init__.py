"""How good the model is, measured on held-out sizes: sessions replayed on a real landscape
against baselines, System 1, the familiarity guard on never-seen kernels, calibration."""

from hpc_ds1.model.replay import Cell, Point

from .landscape import EvaluationError, build_cells
from .plan import EVAL_PROFILES, EvalProfile, plan_held_out
from .run import Evaluation, evaluate

__all__ = [
    "EVAL_PROFILES",
    "Cell",
    "EvalProfile",
    "Evaluation",
    "EvaluationError",
    "Point",
    "build_cells",
    "evaluate",
    "plan_held_out",
]
