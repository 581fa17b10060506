"""Running the `hpc-ds1` command of this environment against a test's own servers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from hpc_ds1.settings import Settings

HPC_DS1 = str(Path(sys.executable).parent / "hpc-ds1")


def cli_env(settings: Settings) -> dict[str, str]:
    """This process's environment without its HPC_DS1_* settings, then the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    assert settings.nats_url and settings.database_url
    env.update(
        HPC_DS1_NATS_URL=settings.nats_url,
        HPC_DS1_DATABASE_URL=settings.database_url,
        HPC_DS1_STREAM=settings.stream,
        HPC_DS1_SUBJECT_PREFIX=settings.subject_prefix,
        HPC_DS1_HOME=str(settings.home),
        HPC_DS1_LOG_JSON="true",
    )
    return env


async def hpc(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """`hpc-ds1 ARGS` with the test's settings, off the event loop."""
    return await asyncio.to_thread(
        subprocess.run,
        [HPC_DS1, *args],
        env=cli_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_hpc(
    settings: Settings, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`hpc-ds1 ARGS` with the test's settings (and `env` on top), blocking."""
    return subprocess.run(
        [HPC_DS1, *args],
        env={**cli_env(settings), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
