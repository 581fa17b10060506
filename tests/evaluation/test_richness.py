"""What a knob adds to a space, on a hand-made truth pass (pure: no runs)."""

from __future__ import annotations

import pytest

from hpc_ds1.evaluation.richness import richness
from hpc_ds1.model import Measurement
from hpc_ds1.space import Config, ConfigSpace

SPACE = ConfigSpace.for_cpus(2, (8, 16), blocks=(0, 2, 4), default_block=0)


def truth(runtime: dict[Config, float], spread: float = 0.0) -> list[Measurement]:
    return [
        Measurement(
            workload="stencil",
            size=256,
            config=c.model_dump(),
            status="ok",
            runtime_s=t,
            spread=spread,
            held_out=True,
            purpose="truth",
        )
        for c, t in runtime.items()
    ]


def test_a_knob_that_wins_by_more_than_the_noise() -> None:
    # block 4 halves every runtime; tile 16 costs 10 %: one best in the whole space
    runtime = {
        c: (0.5 if c.block == 4 else 1.0) * (1.1 if c.tile == 16 else 1.0) * c.ranks
        for c in SPACE.configs()
    }
    result = richness(truth(runtime))
    (row,) = result["per_size"]
    assert row["configurations"] == len(SPACE.configs()) == 30
    assert row["subspace_configurations"] == 10
    assert row["within_noise_share"] == pytest.approx(round(2 / 30, 4))  # 1 or 2 threads
    assert row["subspace_within_noise_share"] == pytest.approx(0.2)
    assert row["speedup_over_subspace"] == pytest.approx(2.0)
    assert row["best_beyond_noise_of_subspace"] is True
    assert row["best"].endswith("block=4 gpu=False") and "block" not in row["subspace_best"]
    assert result["per_workload"]["stencil"]["sizes_best_beyond_noise_of_subspace"] == 1


def test_a_knob_inside_the_noise_adds_nothing() -> None:
    runtime = {c: 1.0 + 0.001 * c.block for c in SPACE.configs()}
    (row,) = richness(truth(runtime, spread=0.05))["per_size"]
    assert row["within_noise_share"] == 1.0 and row["subspace_within_noise_share"] == 1.0
    assert row["speedup_over_subspace"] == pytest.approx(1.0)
    assert row["best_beyond_noise_of_subspace"] is False


def test_a_truth_pass_without_the_subspace_or_only_it_is_left_out() -> None:
    only_old = {c: 1.0 for c in SPACE.configs() if c.block == 0}
    only_new = {c: 1.0 for c in SPACE.configs() if c.block == 4}
    assert richness(truth(only_old))["per_size"] == []
    assert richness(truth(only_new))["per_size"] == []
