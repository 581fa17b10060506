"""The placement benchmark's small mode: a few placements on small fleets. The speed verdict is
the benchmark's to print, not a test's; here only what holds anywhere is asserted."""

from __future__ import annotations

from benchmarks.bench_placement import bench, report


def test_a_small_placement_benchmark_reports_each_fleet() -> None:
    rows = [bench(n, tasks=50) for n in (5, 40)]
    text = report(rows)
    print(text)
    for row, n in zip(rows, (5, 40), strict=True):
        assert row.devices == n and row.tasks == 50
        assert 0 < row.p50_ms <= row.p99_ms <= row.max_ms
        assert 0 < row.cpu_p50_ms <= row.cpu_p99_ms
        assert row.measured + row.predicted + row.none == 50
        assert row.measured > 0 and row.predicted > 0  # both kinds of estimate were used
    assert len(text.splitlines()) == 3 + len(rows) + 1  # header, one row per fleet, machine
    assert "target" not in text  # no 1,000-device fleet, no verdict
