"""The event-log benchmark's small mode: the raw ceiling both ways and publish → projected row
through a real projector process, a few hundred events each. Asserted: what holds whatever
the machine (every event lands as a row, the figures are measured and consistent); the
targets are the benchmark's to print (`make bench-eventlog`)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from benchmarks.bench_eventlog import end_to_end, raw_ceiling
from hpc_ds1.db import make_engine, tables

N = 400


async def test_raw_ceiling_one_at_a_time_and_in_atomic_batches(nats_url: str) -> None:
    for batches in (False, True):
        publish_per_s, fetch_per_s = await raw_ceiling(nats_url, N, batches)
        assert publish_per_s > 0 and fetch_per_s > 0


async def test_every_event_published_lands_as_a_row_unpaced_and_paced(
    nats_url: str, postgres_url: str, tmp_path: Path
) -> None:
    for name, rate in (("home-unpaced", None), ("home-paced", 2_000.0)):
        home = tmp_path / name
        result = await end_to_end(nats_url, postgres_url, N, home, batches=True, rate=rate)
        assert result["e2e_per_s"] > 0 and result["publish_per_s"] >= result["e2e_per_s"]
        assert 0 <= result["lag_p50_ms"] <= result["lag_p99_ms"]
        assert result["projector_cpu_us"] > 0
        if rate is not None:
            # Paced: chunks of rate/100 events, the chunk at event i sent no earlier than
            # i / rate, so the last one leaves after (N - chunk) / rate at the soonest.
            chunk = int(rate / 100)
            assert result["publish_per_s"] <= rate * N / (N - chunk)
        database = home.name.replace("-", "_")
        url = make_url(postgres_url).set(database=database)
        engine = make_engine(url.render_as_string(hide_password=False))
        try:
            with engine.connect() as conn:
                rows = conn.execute(select(func.count()).select_from(tables.events)).scalar()
                checkpoint = conn.execute(select(tables.checkpoints.c.last_seq)).scalar()
        finally:
            engine.dispose()
        assert rows is not None and checkpoint is not None
        assert rows >= N and checkpoint >= N  # an audit anchor of its own may follow
