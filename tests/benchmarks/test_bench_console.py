"""The console benchmark's small mode: a few hundred events, `hpc-ds1 serve`, the first view
over HTTP. The speed verdict is the benchmark's to print; here only what holds anywhere."""

from __future__ import annotations

from benchmarks.bench_console import LOAD_CALLS, bench, history, report
from hpc_ds1.settings import Settings


def test_the_history_is_what_the_projector_folds() -> None:
    events = history(2000)
    assert len(events) >= 2000
    kinds = {type(e).__name__ for e, _ in events}
    assert {"MeasurementRecorded", "SessionStarted", "TaskFinished", "DecisionMade"} <= kinds
    assert {"ApprovalRequested", "ApprovalDecided"} <= kinds


def test_a_small_console_benchmark_reports_the_first_view(settings: Settings) -> None:
    result = bench(settings, 400, repeats=2, browser=False, say=lambda *_: None)
    text = report(result)
    print(text)
    assert result.events >= 400
    assert len(result.http) == 2
    for view in result.http:
        assert view.calls["/"][0] == 200 and view.page_bytes > 1000
        assert set(view.calls) == {"/", *LOAD_CALLS}
        assert view.wall_s >= max(took for _, took in view.calls.values()) > 0
    assert "console first view" in text and "browser  skipped: not asked" in text
