"""A new device of a fleet sets up warm from its coordinator (issue 42, item 5): the
coordinator (`hpc-ds1 serve`) holds a sibling GPU's measurements; the new device, on its own
home, runs `setup --budget --warm-from SIBLING --server URL`, which reads them over
GET /v1/measurements and runs the sibling's fastest configuration first."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.infra.ports import free_port
from hpc_ds1.settings import Settings
from tests.support.commands import HPC_DS1, run_hpc
from tests.support.recorded import write_recorded
from tests.support.serving import cli_headers, start_serve, stop, wait_ready


def _own_home(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`hpc-ds1 ARGS` on `home` with its embedded servers, as a new device runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(home), HPC_DS1_REPLAY_SEED="3")
    return subprocess.run([HPC_DS1, *args], env=env, capture_output=True, text=True, timeout=600)


def test_a_new_device_sets_up_warm_from_its_coordinator(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    write_recorded(settings.home, "conv-a6000", "A6000")
    sibling = run_hpc(
        settings, "setup", "--workload", "conv-a6000", "--no-train",
        env={"HPC_DS1_REPLAY_SEED": "3"},
    )  # fmt: skip
    assert sibling.returncode == 0, sibling.stdout + sibling.stderr
    t = tables.measurements
    with engine.connect() as conn:
        runs = conn.execute(
            select(t.c.config, t.c.runtime_s).where(
                t.c.workload == "conv-a6000", t.c.runtime_s.is_not(None)
            )
        ).all()
    fastest = min(runs, key=lambda r: r.runtime_s).config

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    assert settings.nats_url and settings.database_url
    coordinator = start_serve(
        settings.home,
        port,
        HPC_DS1_NATS_URL=settings.nats_url,
        HPC_DS1_DATABASE_URL=settings.database_url,
        HPC_DS1_STREAM=settings.stream,
        HPC_DS1_SUBJECT_PREFIX=settings.subject_prefix,
    )
    try:
        wait_ready(url, coordinator)
        token = cli_headers(settings.home)["Authorization"].removeprefix("Bearer ")
        device = tmp_path / "new-device"
        write_recorded(device, "conv-a100", "A100")
        warm = _own_home(
            device, "setup", "--workload", "conv-a100", "--budget", "6", "--warm-from",
            "conv-a6000", "--server", url, "--token", token, "--no-train", "--json",
        )  # fmt: skip
        assert warm.returncode == 0, warm.stdout + warm.stderr
        found = json.loads(warm.stdout)
        assert found["siblings"] == {"conv-a100": 1} and found["measured"] == 6, found
        ran = [
            record["data"]["config"]
            for line in (device / "audit.jsonl").read_text().splitlines()
            if (record := json.loads(line)).get("data", {}).get("workload") == "conv-a100"
        ]
        assert len(ran) == 6
        assert ran[0]["knobs"] == fastest["knobs"], (ran[0], fastest)
    finally:
        stop(coordinator)

    # the coordinator gone: the setup says where it could not read the fleet from
    gone = _own_home(
        device, "setup", "--workload", "conv-a100", "--budget", "8", "--warm", "--server", url,
        "--token", token, "--no-train",
    )  # fmt: skip
    assert gone.returncode == 3, gone.stdout + gone.stderr
    assert f"cannot reach {url} for the fleet's measurements" in gone.stderr
