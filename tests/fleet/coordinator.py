"""A real coordinator (`hpc-ds1 serve`) as the fleet's tests see it: its address and tokens, the
job the device's home has measured, a bearer header, and stopping an agent that served it. The
`coordinator` and `device_home` fixtures (tests/conftest.py) start it and a device's own home;
shared by tests/fleet and tests/slurm."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpc_ds1.settings import Settings
from hpc_ds1.workloads import get_workload

if TYPE_CHECKING:  # tests/conftest.py imports this module: the fleet only when a test uses it
    from hpc_ds1.fleet import Agent

SIZE = 100_000
CONFIG = {"ranks": 1, "threads": 1, "tile": get_workload("montecarlo").default_tile}
START_S = 120.0


@dataclass
class Coordinator:
    server: str
    join_token: str
    cli_token: str
    settings: Settings


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def stop_agent(agent: Agent, task: asyncio.Task[None]) -> float:
    started = time.monotonic()
    agent.stop()
    await asyncio.wait_for(task, 30)
    return time.monotonic() - started
