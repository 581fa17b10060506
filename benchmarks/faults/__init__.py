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

# name: (scenario, does it need Postgres)
SCENARIOS: dict[str, tuple[Scenario, bool]] = {
    "nats-server": (nats_server, False),
    "postgres": (postgres, True),
    "projector": (projector, True),
    "coordinator": (coordinator, True),
    "agent": (agent, True),
    "cut-link": (cut_connection, False),
}

__all__ = ["FULL", "SCENARIOS", "SMALL", "Load", "Outcome", "report", "run_scenario"]


async def run_scenario(
    name: str, repeat: int, load: Load = FULL, seed: int = 0, root: Path | None = None
) -> Outcome:
    """Run one scenario `repeat` times on its own freshly started NATS (and Postgres)."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; the scenarios are: {', '.join(SCENARIOS)}")
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    scenario, needs_postgres = SCENARIOS[name]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"faults-{name}-", dir=root) as tmp:
        cluster = Cluster(Path(tmp), postgres=needs_postgres)
        with cluster.running():
            outcome = await scenario(cluster, load, repeat, random.Random(f"{seed}-{name}"))
    outcome.seconds = time.monotonic() - started
    return outcome
