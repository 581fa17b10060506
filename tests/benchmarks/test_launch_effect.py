"""The launch-effect benchmark's small mode: two launches of each configuration at a tiny gemm.
The size of the effect is the benchmark's to print; here only what holds anywhere."""

from __future__ import annotations

from benchmarks.launch_effect import measure


def test_each_configuration_gets_one_median_per_launch_and_both_spreads() -> None:
    rows = measure(96, launches=2)
    assert [r.config.split(" gpu")[0] for r in rows] == [
        "ranks=1 threads=2 tile=128",
        "ranks=2 threads=1 tile=128",
    ]
    for row in rows:
        assert len(row.launch_medians_s) == 2 and all(t > 0 for t in row.launch_medians_s)
        assert row.between_cv >= 0 and row.within_cv >= 0
