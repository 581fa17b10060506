"""The model of one machine: move model, runtime model and familiarity guard in one ONNX file.

from hpc_ds1.model import train, Model, State, Decision, Thresholds

Training (`train`, `TrainedModel`, `content_version`, in `training`) is imported on first use:
it pulls in scikit-learn, about a second of start-up that commands which only run a model
(recommend, status, decide) do not need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hpc_ds1.model.inference import Model, ObservationFailed
from hpc_ds1.model.labels import aggregate, label_moves, measured_space
from hpc_ds1.model.schema import Decision, Measurement, Recommendation, State, Thresholds

if TYPE_CHECKING:
    from hpc_ds1.model.training import TrainedModel, content_version, train

_TRAINING = ("TrainedModel", "content_version", "train")

__all__ = [
    "Decision",
    "Measurement",
    "Model",
    "ObservationFailed",
    "Recommendation",
    "State",
    "Thresholds",
    "TrainedModel",
    "aggregate",
    "content_version",
    "label_moves",
    "measured_space",
    "train",
]


def __getattr__(name: str) -> Any:
    if name in _TRAINING:
        value = getattr(importlib.import_module("hpc_ds1.model.training"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
