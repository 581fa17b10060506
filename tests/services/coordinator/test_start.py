"""A session without an explicit start begins at the model's System 1 recommendation (issue 13,
part 2: transfer from the trained sizes is what the product starts from); with no model, an
answer outside the space, or a model that fails, at the space's default."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hpc_ds1.space import Config, ConfigSpace
from services.coordinator import coordinator as module
from services.coordinator.coordinator import Coordinator

SPACE = ConfigSpace.for_cpus(4, (32, 64))


class FakeModel:
    version = "abc123"

    def __init__(self, config: Config | None) -> None:
        self.config = config
        self.asked: list[tuple[Any, ...]] = []

    def recommend(self, workload: str, size: int, *, space: Any, fingerprint: Any) -> Any:
        self.asked.append((workload, size, space, fingerprint))
        if self.config is None:
            raise ValueError("no feasible configuration")
        return SimpleNamespace(config=self.config)


def coordinator(model: FakeModel | None, monkeypatch: pytest.MonkeyPatch) -> Coordinator:
    monkeypatch.setattr(module, "_device", lambda engine, device_id: None)
    coord = Coordinator(SimpleNamespace(engine=None))  # type: ignore[arg-type]

    async def latest(device_id: str) -> Any:
        return model

    coord._model = latest  # type: ignore[method-assign]
    return coord


async def test_the_start_is_the_models_recommendation(monkeypatch: pytest.MonkeyPatch) -> None:
    picked = Config(ranks=2, threads=2, tile=64)
    model = FakeModel(picked)
    start, source = await coordinator(model, monkeypatch).recommended_start(
        "dev", "gemm", 1280, SPACE
    )
    assert (start, source) == (picked, "model abc123")
    assert model.asked == [("gemm", 1280, SPACE, None)]


@pytest.mark.parametrize(
    "model",
    [None, FakeModel(None), FakeModel(Config(ranks=64, threads=1, tile=32))],
    ids=["no model", "model fails", "outside the space"],
)
async def test_otherwise_the_default(
    model: FakeModel | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    start, source = await coordinator(model, monkeypatch).recommended_start(
        "dev", "gemm", 1280, SPACE
    )
    assert (start, source) == (SPACE.default(), "default")
