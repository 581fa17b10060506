"""Every move-model and runtime-model candidate converts to ONNX exactly, and a move model whose
conversion would compute another model never reaches a model file (the next one is used)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from sklearn.calibration import CalibratedClassifierCV
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from hpc_ds1.machine.hardware import Fingerprint
from hpc_ds1.model import Measurement, Model, train, training
from hpc_ds1.model import estimators as est
from hpc_ds1.model import features as ft
from hpc_ds1.model.guard import DistanceGuard
from hpc_ds1.model.onnx_graph import (
    CONFIGS,
    CONVERSION_TOLERANCE,
    INPUT,
    RUNTIME,
    build,
    classifier_conversion_error,
)
from tests.model.states import training_states


def rows(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Four classes a linear model separates only in part, with features of unequal scales
    (as the state rows have: log sizes beside shares), in six groups for the calibration."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(240, 5)) * np.array([1.0, 10.0, 0.1, 3.0, 1.0])
    score = X[:, 0] + 0.1 * X[:, 1] - 8.0 * X[:, 2] + rng.normal(scale=0.8, size=len(X))
    y = np.digitize(score, np.quantile(score, [0.25, 0.5, 0.75]))
    return X.astype(np.float32), y, np.arange(len(X)) % 6


@pytest.mark.parametrize("name", sorted(est.classifier_candidates(0)))
def test_every_candidate_converts_to_the_same_probabilities(name: str) -> None:
    X, y, groups = rows()
    fitted = est.fit_quietly(est.classifier_candidates(0)[name](groups), X, y)
    assert classifier_conversion_error(fitted, X) < CONVERSION_TOLERANCE


def test_the_check_catches_a_calibrated_pipeline_that_converts_to_another_model() -> None:
    """skl2onnx calibrates the pipeline's probabilities, scikit-learn its decision function:
    this is what shipped a wrong logistic+sigmoid file before the scaler was moved outside."""
    X, y, groups = rows()
    splits = est.group_splits(groups % 3)
    wrapped = CalibratedClassifierCV(
        make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000)),
        method="sigmoid",
        cv=splits,
        ensemble=False,
    )
    fitted = est.fit_quietly(wrapped, X, y)
    assert classifier_conversion_error(fitted, X) > 0.05


def test_a_candidate_that_does_not_convert_is_set_aside_for_the_next(
    measurements: list[Measurement], fp: Fingerprint, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = training.classifier_conversion_error
    checked: list[object] = []

    def the_first_does_not_convert(estimator: object, X: np.ndarray) -> float:
        checked.append(estimator)
        return 0.5 if len(checked) == 1 else real(estimator, X)

    monkeypatch.setattr(training, "classifier_conversion_error", the_first_does_not_convert)
    # raw candidates: a calibrated one can fail its fit on some measurements (an inner fold
    # without a move), which would leave no second candidate to fall back to
    candidates = ["logistic", "random_forest"]
    trained = train(measurements, fp, seed=0, candidates=candidates)
    moves = trained.metrics["move_model"]
    ((refused, why),) = moves["final_fit_failed"].items()
    assert "ONNX conversion differs from scikit-learn by 0.5" in why
    assert moves["chosen"] in candidates and moves["chosen"] != refused
    model = Model.from_onnx(trained.to_onnx())
    assert model.metadata["estimators"]["move"] == moves["chosen"]
    X = np.vstack([model.state_features(s) for s in training_states(measurements)])
    proba = model.raw(X)[0]
    assert np.abs(proba - trained.sklearn_outputs(X)[0]).max() < CONVERSION_TOLERANCE


def runtime_rows(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Six sizes (equal work columns within a size) of twenty configurations each; a log
    runtime that grows with the work and depends on the configuration columns non-linearly."""
    rng = np.random.default_rng(seed)
    work = np.repeat(rng.uniform(4.0, 12.0, size=(6, ft.N_WORK)), 20, axis=0)
    configs = np.tile(rng.integers(0, 4, size=(20, ft.N_BASE - ft.N_WORK)), (6, 1))
    X = np.hstack([work, configs]).astype(np.float32)
    y = 0.3 * work[:, 0] + 0.2 * (configs[:, 0] - 1.5) ** 2 - 0.1 * configs[:, 1] * work[:, 1]
    return X, y + rng.normal(scale=0.02, size=len(y))


@pytest.mark.parametrize("name", sorted(est.regressor_candidates(0)))
def test_every_runtime_candidate_converts_to_the_same_runtimes(name: str) -> None:
    X, y = runtime_rows()
    regressor = est.regressor_candidates(0)[name]().fit(X, y)
    classes = np.arange(len(X)) % 3
    classifier = est.fit_quietly(est.classifier_candidates(0)["logistic"](classes), X, classes)
    data = build(classifier, regressor, DistanceGuard.fit(X), X.shape[1], X.shape[1], {})
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    (runtime,) = session.run([RUNTIME], {INPUT: X, CONFIGS: X})
    assert np.abs(runtime[:, 0] - regressor.predict(X)).max() < 1e-4  # log10 seconds
