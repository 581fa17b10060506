"""The long-poll benchmark's small mode: a real gateway process, a few agents, a few items.
Only what holds on any machine is asserted (every item reached its own device's agent once,
no error, the gateway stopped cleanly, CPU and latency were sampled); the figures are the
benchmark's to print, not a test's."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_longpoll import LongpollConfig, longpoll, summary


async def test_every_item_reaches_its_own_device_once(tmp_path: Path) -> None:
    config = LongpollConfig(
        agents=12, items=30, rate=30.0, wait_s=5.0, idle_s=1.0, home=tmp_path / "home", quiet=True
    )
    result = await longpoll(config)
    print(summary(result))
    assert result.errors == []
    assert result.received == result.placed_on  # each item went to the device it was queued for
    assert len(result.latencies) == config.items
    assert result.gateway_exit == 0
    assert result.idle_cpu >= 0 and result.dispatch_cpu > 0 and result.gateway_rss_mib > 0
