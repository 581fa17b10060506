"""Real faults under load, each repeated: `kill -9` of nats-server (sync always) mid-stream, of
the Postgres postmaster mid-projection, of the projector mid-backlog, of the coordinator during a
tuning session's step and of an agent while its job's ranks run, and a cut network link.
Run: `make bench-faults` (or `python benchmarks/bench_faults.py [--repeat N] [--only NAME]`).

Every server and service is a real process (nats-server, Postgres, `hpc-ds1 service NAME`) on
free loopback ports under a temporary directory. Per scenario it prints the faults injected,
how many the system survived, the events acknowledged against those found afterwards, and
what was lost, duplicated, left as a gap or left running; it exits 1 if anything was."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.faults import FULL, SCENARIOS, SMALL, run_scenario, shared_cluster
from benchmarks.faults.outcome import HEADER, report, row
from hpc_ds1 import log


async def main(args: argparse.Namespace) -> int:
    names = args.only or list(SCENARIOS)
    load = SMALL if args.small else FULL
    print(f"fault scenarios: {', '.join(names)}; {args.repeat} repetitions each", flush=True)
    print(HEADER, flush=True)
    outcomes = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        shared = shared_cluster(Path(tmp))
        with shared.running():
            for name in names:
                outcome = await run_scenario(name, args.repeat, load, args.seed, shared)
                outcomes.append(outcome)
                print(row(outcome), flush=True)
    print(flush=True)
    print(report(outcomes))
    print(f"total {time.monotonic() - started:.0f} s")
    return 0 if all(o.ok for o in outcomes) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="faults per scenario (10)")
    parser.add_argument(
        "--only",
        action="append",
        choices=list(SCENARIOS),
        help="run only this scenario (repeatable)",
    )
    parser.add_argument("--small", action="store_true", help="the small loads CI uses")
    parser.add_argument("--seed", type=int, default=0, help="where in the load each fault hits")
    arguments = parser.parse_args(argv)
    if arguments.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {arguments.repeat}")
    return arguments


if __name__ == "__main__":
    arguments = parse_args()
    log.configure("error", json=True)  # the faults make the services warn on purpose
    # nats-py logs every failed reconnect with a traceback; the faults here cause them on purpose.
    logging.getLogger("nats.aio.client").setLevel(logging.CRITICAL)
    sys.exit(asyncio.run(main(arguments)))
