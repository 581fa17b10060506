"""The model of one machine: move model, runtime model and familiarity guard in one ONNX file.

from hpc_ds1.model import train, Model, State, Decision, Thresholds
"""

from hpc_ds1.model.inference import Model, ObservationFailed
from hpc_ds1.model.labels import aggregate, label_moves, measured_space
from hpc_ds1.model.schema import Decision, Measurement, Recommendation, State, Thresholds
from hpc_ds1.model.train import TrainedModel, content_version, train

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
