"""A device's prediction comes from its own model's System 1 (the tiny real model of
tests/support/measured.py): its configuration and runtime; a job in its measured range on its own
hardware is accepted, the familiarity guard's reasons (size range, other hardware) reject one."""

from __future__ import annotations

from hpc_ds1.fleet.placement import Estimate
from hpc_ds1.machine.hardware import Fingerprint
from hpc_ds1.model import Model
from hpc_ds1.services.placement import predict


def test_a_prediction_is_system_1_and_only_the_guard_rejects(model: Model, fp: Fingerprint) -> None:
    own = fp.model_dump(mode="json")
    inside = predict(model, "dev:v1", "gemm", 64, own)
    assert isinstance(inside, Estimate)
    rec = model.recommend("gemm", 64, fingerprint=fp)
    assert inside.config == rec.config.model_dump()
    assert inside.runtime_s == rec.predicted_runtime_s and inside.basis == "predicted"
    assert inside.accepted and inside.reasons == () and inside.source == "dev:v1"

    outside = predict(model, "dev:v1", "gemm", 4096, own)
    assert isinstance(outside, Estimate) and not outside.accepted
    assert any("outside the measured range" in r for r in outside.reasons)

    other = predict(
        model, "dev:v1", "gemm", 64, {**own, "device_id": "elsewhere", "logical_cpus": 64}
    )
    assert isinstance(other, Estimate) and not other.accepted
    assert any("differs from the one the model was trained on" in r for r in other.reasons)

    assert isinstance(predict(model, "dev:v1", "gemm", 0, own), str)  # an error, in words
