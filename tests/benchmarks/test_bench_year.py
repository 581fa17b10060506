"""The year benchmark's small mode (issue 46): a few thousand events of the generated year
through the real publisher, rebuilt from scratch and checked row for row against what was
generated; then all but its last month archived and rebuilt again from the archive and the
stream, row for row the same. The figures are the benchmark's to print
(`python benchmarks/bench_year.py`)."""

from __future__ import annotations

from sqlalchemy import Engine

from benchmarks.bench_year import run_year
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.settings import Settings


async def test_a_small_year_rebuilds_row_for_row_with_and_without_its_archive(
    settings: Settings, bus: EventBus, engine: Engine
) -> None:
    result = await run_year(settings, engine, events=3_000, devices=20)
    assert result["events"] >= 3_000 and result["rebuilt_to"] == result["last_seq"]
    for name, row in result["rows"].items():
        if name == "set_aside":
            assert row == 0
            continue
        assert row["expected"] > 0, name
        assert row["missing"] == row["unexpected"] == 0, (name, row)
    assert 0 < result["archived_events"] < result["events"]
    assert result["rebuild_with_archive_to"] == result["rebuilt_to"]
    assert result["rows_after_archive"] == result["rows"]
    assert all(t["p99_ms"] >= t["p50_ms"] > 0 for t in result["reads"].values())
