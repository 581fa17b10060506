"""The client of the cut-connection scenario, run as its own process (inside its own network
namespace when the scenario can make one): publishes `--count` events through the project's
EventBus, retrying each with its envelope id until acknowledged, appends every acknowledged id
to `--acked` as it arrives, and prints a JSON summary line at the end.

It connects with a 1 s ping interval, so a link that silently stops carrying packets is noticed
within a few seconds and the client reconnects (nats-py's default interval is 2 minutes)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import nats

from benchmarks.faults.publisher import measurement, publish_through_faults
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.settings import Settings


async def main(args: argparse.Namespace) -> dict[str, object]:
    counts = {"disconnects": 0, "reconnects": 0}

    async def disconnected() -> None:
        counts["disconnects"] += 1

    async def reconnected() -> None:
        counts["reconnects"] += 1

    nc = await nats.connect(
        args.url,
        name="hpc-ds1-faults-netclient",
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=1,
        ping_interval=1,
        max_outstanding_pings=2,
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
    )
    settings = Settings(
        stream=args.stream, subject_prefix=args.prefix, nats_url=args.url, database_url="unused"
    )
    bus = EventBus(nc, settings)
    events = [measurement(args.prefix, i, tag="cut") for i in range(args.count)]
    with Path(args.acked).open("a") as acked:  # noqa: ASYNC230 (one open, at start)

        def on_ack(event_id: str) -> None:
            acked.write(event_id + "\n")
            acked.flush()

        published = await publish_through_faults(
            bus, events, window=4, within_s=args.within, on_ack=on_ack
        )
    await nc.close()
    return {
        "acked": len(published.acked),
        "unacked": len(published.unacked),
        "retries": published.retries,
        "errors": published.errors,
        **counts,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--acked", required=True)
    parser.add_argument("--within", type=float, default=120.0)
    summary = asyncio.run(main(parser.parse_args()))
    print(json.dumps(summary), flush=True)
