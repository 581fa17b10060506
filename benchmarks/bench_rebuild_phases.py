"""Where the projection's rebuild spends its time (issue 46, item 2): `python
benchmarks/bench_rebuild_phases.py [--events N] [--devices D] [--repeat R]` appends
bench_year.py's year through the real bus, then, R times: reads the whole stream, folds it,
writes it (truncate and `store.apply` in batches of 2,000, one transaction), each phase timed
alone; then `rebuild()` whole, which overlaps the three. Printed: seconds per phase, their sum,
and `rebuild()`'s seconds and events/s."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from sqlalchemy import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_year import append_year, embedded_stack

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.operations.archive import merged
from hpc_ds1.projection import store
from hpc_ds1.projection.fold import find_gaps, fold
from hpc_ds1.projection.rebuild import rebuild
from hpc_ds1.settings import Settings


async def phases(
    settings: Settings, engine: Engine, events: int, devices: int, repeat: int
) -> None:
    assert settings.nats_url
    bus = await EventBus.connect(settings, settings.nats_url, "bench-rebuild-phases")
    try:
        generated, _ = await append_year(bus, events, devices)
        end = await bus.last_sequence()
        for _ in range(repeat):
            begun = time.perf_counter()
            raw = [chunk async for chunk in merged(bus, None, 1, stop_at=end, batch=2000)]
            read = time.perf_counter()
            chunks = [[fold(e.seq, e.subject, e.data) for e in chunk] for chunk in raw]
            folded = time.perf_counter()
            with engine.begin() as conn:
                store.read_checkpoint(conn, lock=True)
                store.truncate_read_models(conn)
                checkpoint = 0
                for chunk in chunks:
                    store.record_gaps(conn, find_gaps(checkpoint, [f.seq for f in chunk]))
                    checkpoint = store.apply(conn, chunk, checkpoint).checkpoint
            written = time.perf_counter()
            print(
                f"{generated.events:,} events: read {read - begun:.1f} s, "
                f"fold {folded - read:.1f} s, write {written - folded:.1f} s, "
                f"sum {written - begun:.1f} s"
            )
            begun = time.perf_counter()
            await rebuild(engine, bus)
            took = time.perf_counter() - begun
            print(f"  rebuild() {took:.1f} s, {generated.events / took:,.0f} events/s")
    finally:
        await bus.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--devices", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    with embedded_stack("bench-rebuild-") as (settings, engine):
        asyncio.run(phases(settings, engine, args.events, args.devices, args.repeat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
