"""The trainer service's model states what the settings ask its confidence to state, and was
chosen as the settings ask."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hpc_ds1.model import Model
from hpc_ds1.settings import Settings


def test_the_trainer_calibrates_on_the_settings_target(
    trained: dict, e2e_settings: Settings
) -> None:
    model = Model.from_file(e2e_settings.models_dir / f"{trained['version']}.onnx")
    assert model.calibration_target == e2e_settings.calibration_target == "unattended"
    assert model.metrics["move_model"]["not_slower"]["target"] == "unattended"
    runtime = model.metrics["runtime_model"]
    assert runtime["selection"] == e2e_settings.runtime_selection == "order"
    best = max(runtime["candidates"].values(), key=lambda s: s["pairwise_order"])
    assert runtime["candidates"][runtime["chosen"]]["pairwise_order"] == best["pairwise_order"]


def test_an_unknown_calibration_target_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="calibration_target"):
        Settings(calibration_target="right")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="runtime_selection"):
        Settings(runtime_selection="r2")  # type: ignore[arg-type]
