"""The launch-cost benchmark's small mode: one launch of each of 1 and 2 ranks and their floor.
What a launch costs is the benchmark's to print; here only what holds anywhere."""

from __future__ import annotations

from benchmarks.launch_cost import measure


def test_each_launch_reports_its_phases_in_order_and_its_floor() -> None:
    rows = measure([1, 2], launches=1)
    assert [r.ranks for r in rows] == [1, 2]
    for row in rows:
        # rank_launch raises unless the launch exited 0 after its "ready" and result lines
        assert 0 < row.ready_s <= row.result_s <= row.total_s
