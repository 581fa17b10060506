"""The soak benchmark's small mode: `hpc-ds1 serve` under the mixed load for 10 seconds (two
samples). Only what holds on any machine is asserted (no error, every event projected at the
end, memory sampled); the speed and memory verdicts are the benchmark's to print, not a test's."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_soak import SoakConfig, soak, summary


async def test_a_short_soak_has_no_error_and_projects_every_event(tmp_path: Path) -> None:
    config = SoakConfig(
        minutes=1 / 6, sample_s=5, decide_rate=10, read_rate=4, home=tmp_path / "home", quiet=True
    )
    result = await soak(config)
    print(summary(result))
    assert result.counters.errors == []
    assert result.serve_exit == 0
    assert result.all_projected
    assert result.last_seq == result.checkpoint == result.stream_messages
    counts = result.counters
    assert counts.decisions > 0 and counts.reads > 0 and counts.sessions_started >= 1
    assert result.samples and all(s.serve_rss > 0 and s.nats_rss > 0 for s in result.samples)
    assert result.lags  # the projection lag was probed
