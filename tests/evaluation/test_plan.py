"""Which held-out sizes an evaluation measures, and the --sizes syntax."""

from __future__ import annotations

import pytest

from hpc_ds1.evaluation import EVAL_PROFILES, plan_held_out
from hpc_ds1.evaluation.plan import parse_sizes
from hpc_ds1.setup import PROFILES
from hpc_ds1.space import ConfigSpace
from hpc_ds1.workloads import get_workload, list_workloads


def test_held_out_sizes_are_never_training_sizes_and_quick_stays_in_the_quick_range() -> None:
    for name in list_workloads():
        wl = get_workload(name)
        quick_trained = PROFILES["quick"].sizes(wl)
        for profile in EVAL_PROFILES.values():
            sizes = profile.sizes(wl)
            assert sizes and not set(sizes) & set(wl.sizes)
        assert all(
            min(quick_trained) < s < max(quick_trained) for s in EVAL_PROFILES["quick"].sizes(wl)
        )


def test_every_configuration_of_the_space_at_every_held_out_size() -> None:
    wl = get_workload("gemm")
    space = ConfigSpace.for_cpus(2, wl.tiles)
    chunks = plan_held_out([wl], {"gemm": space}, EVAL_PROFILES["quick"])
    assert [c[0].size for c in chunks] == list(EVAL_PROFILES["quick"].sizes(wl))
    assert all({j.config for j in c} == set(space.configs()) for c in chunks)
    assert all(j.repeats >= 2 for c in chunks for j in c)  # a spread needs repeats
    assert [
        c[0].size
        for c in plan_held_out([wl], {"gemm": space}, EVAL_PROFILES["quick"], {"gemm": [240]})
    ] == [240]


def test_sizes_for_every_workload_or_by_name() -> None:
    names = ["gemm", "montecarlo"]
    assert parse_sizes("240,300", names) == {"gemm": [240, 300], "montecarlo": [240, 300]}
    assert parse_sizes("gemm=240,288,montecarlo=300000", names) == {
        "gemm": [240, 288],
        "montecarlo": [300000],
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("nbody=100", "the workloads evaluated are"),
        ("gemm=big", "is not a size"),
        ("0", "positive integer"),
        (",", "no size given"),
    ],
)
def test_bad_sizes_say_what_is_accepted(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_sizes(text, ["gemm", "montecarlo"])
