"""Real faults under load for `benchmarks/bench_faults.py` and tests/faults: `kill -9` of
nats-server, Postgres, the projector, the coordinator and an agent, and a cut connection."""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

from .cluster import Cluster
from .loads import FULL, SMALL, Load
from .netcut import cut_connection
from .outcome import Outcome, report
from .scenarios import Scenario, agent, coordinator, nats_server, postgres, projector

# name: (scenario, does it need Postgres). Those that need Postgres can share one cluster:
# NATS there uses its periodic sync, as nothing kills it (cheap to load); those that kill or
# cut NATS get their own, `sync_interval: always`.
SCENARIOS: dict[str, tuple[Scenario, bool]] = {
    "nats-server": (nats_server, False),
    "postgres": (postgres, True),
    "projector": (projector, True),
    "coordinator": (coordinator, True),
    "agent": (agent, True),
    "cut-link": (cut_connection, False),
}


def shared_cluster(root: Path) -> Cluster:
    """The cluster the Postgres scenarios can share (start it with `.running()`)."""
    return Cluster(root, postgres=True, nats_sync="default")


__all__ = [
    "FULL",
    "SCENARIOS",
    "SMALL",
    "Cluster",
    "Load",
    "Outcome",
    "report",
    "run_scenario",
    "shared_cluster",
]


async def run_scenario(
    name: str, repeat: int, load: Load = FULL, seed: int = 0, shared: Cluster | None = None
) -> Outcome:
    """Run one scenario `repeat` times: on `shared` (a running `shared_cluster`) when it needs
    Postgres and one is given, else on its own freshly started NATS (and Postgres)."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; the scenarios are: {', '.join(SCENARIOS)}")
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    scenario, needs_postgres = SCENARIOS[name]
    started = time.monotonic()
    rng = random.Random(f"{seed}-{name}")
    if needs_postgres and shared is not None:
        outcome = await scenario(shared, load, repeat, rng)
    else:
        with tempfile.TemporaryDirectory(prefix=f"faults-{name}-") as tmp:
            cluster = Cluster(Path(tmp), postgres=needs_postgres, nats_sync="always")
            with cluster.running():
                outcome = await scenario(cluster, load, repeat, rng)
    outcome.seconds = time.monotonic() - started
    return outcome
