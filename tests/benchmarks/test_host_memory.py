"""The host-memory benchmark's small mode: two fresh processes, a small buffer, a tiny gemm.
How the launches differ is the benchmark's to print; here only what holds anywhere."""

from __future__ import annotations

import math

from benchmarks.host_memory import measure, rank_correlation


def test_every_launch_times_each_step() -> None:
    rows = measure(processes=2, mb=8, size=64)
    assert len(rows) == 2
    for row in rows:
        assert min(row.first_touch_s, row.gather_s, row.stream_s, row.gemm_s) > 0


def test_rank_correlation_of_an_order_and_its_reverse() -> None:
    assert math.isclose(rank_correlation([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]), 1.0)
    assert math.isclose(rank_correlation([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]), -1.0)


def _transparent_hugepage_mode() -> str | None:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else None


def test_without_numpys_advice_no_gemm_matrix_gets_huge_pages() -> None:
    # 8 MiB matrices: past numpy's 4 MiB threshold for the advice, so only the setting keeps
    # them on 4 KiB pages (unless the kernel gives huge pages to every mapping: `always`)
    rows = measure(processes=1, mb=8, size=1024, hugepage=False)
    assert rows[0].gemm_huge_mb >= 0
    if _transparent_hugepage_mode() in ("madvise", "never"):
        assert rows[0].gemm_huge_mb == 0
