"""A Slurm partition as a device of the fleet: `Agent(..., slurm_partition=P)` on a "login node"
joins with the fingerprint of a partition node (taken there by srun), receives the task that
placement sends it and runs it through `sbatch` on a node of P, with the ranks started by
srun inside that job; Slurm has both jobs on record under their names. Against the session's
real single-node Slurm and a real coordinator (the `coordinator` and `device_home` fixtures
of tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx

from hpc_ds1.fleet import Agent, submit
from hpc_ds1.fleet.slurm import JOB_PREFIX, job_name
from hpc_ds1.runner.launch import JOB_NAME
from hpc_ds1.settings import Settings
from tests.fleet.coordinator import SIZE, Coordinator, bearer, stop_agent
from tests.slurm.cluster import SlurmCluster

NAME = "partition-debug"


def slurm_jobs(slurm: SlurmCluster) -> list[dict[str, str]]:
    """Every job slurmctld still holds (completed ones for MinJobAge), as key=value maps."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o"], capture_output=True, text=True, env=slurm.env
    ).stdout
    return [
        dict(f.split("=", 1) for f in line.split() if "=" in f)
        for line in out.splitlines()
        if line.startswith("JobId=")
    ]


async def drain_local_devices(coord: Coordinator) -> None:
    """The coordinator's own machine is a device too: drained, so the task goes to the
    partition (its agent registers on its own time: wait until it is listed)."""
    async with httpx.AsyncClient(headers=bearer(coord.cli_token)) as http:
        for _ in range(300):
            listed = (await http.get(f"{coord.server}/v1/devices")).json()["devices"]
            locals_ = [d["device_id"] for d in listed if d["local"]]
            if locals_:
                break
            await asyncio.sleep(0.2)
        assert locals_, "the coordinator's own device never registered"
        for local in locals_:
            drained = await http.post(
                f"{coord.server}/v1/devices/{local}/drain", json={"draining": True}
            )
            assert drained.status_code == 200, drained.text


async def test_a_partition_agent_runs_its_task_through_sbatch(
    slurm: SlurmCluster, coordinator: Coordinator, device_home: Settings
) -> None:
    agent = Agent(
        coordinator.server,
        coordinator.join_token,
        home=device_home.home,
        name=NAME,
        slurm_partition=slurm.partition,
    )
    agent.settings = device_home  # its own log and database (as hpc-ds1 setup left them)
    ready = asyncio.Event()
    agent.on_ready = lambda _: ready.set()
    task = asyncio.create_task(agent.serve())
    try:
        waiting = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiting}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if task.done():
            task.result()
        assert agent.device_id == NAME

        # Its fingerprint was taken on a partition node, by srun.
        fingerprints = [j for j in slurm_jobs(slurm) if j["JobName"] == f"{JOB_PREFIX}fingerprint"]
        assert [j["JobState"] for j in fingerprints] == ["COMPLETED"], fingerprints
        async with httpx.AsyncClient(headers=bearer(coordinator.cli_token)) as http:
            dev = (await http.get(f"{coordinator.server}/v1/devices/{NAME}")).json()
        assert dev["hostname"] == slurm.hostname, dev

        await drain_local_devices(coordinator)
        t = await asyncio.to_thread(
            submit, coordinator.server, coordinator.cli_token, "montecarlo", SIZE, timeout=240
        )
        assert t["status"] == "finished", t
        assert t["result"]["device_id"] == NAME and t["result"]["runtime_s"] > 0, t
        assert agent.completed == 1
    finally:
        await stop_agent(agent, task)

    # Slurm ran it: a batch job under the task's name, its ranks a step started by srun.
    batch = [j for j in slurm_jobs(slurm) if j["JobName"] == job_name(t["task_id"])]
    assert len(batch) == 1, slurm_jobs(slurm)
    assert batch[0]["JobState"] == "COMPLETED" and batch[0]["BatchFlag"] == "1", batch
    assert batch[0]["Partition"] == slurm.partition and batch[0]["NodeList"] == slurm.hostname
    (folder,) = (Path(device_home.home) / "slurm").glob(f"{t['task_id']}-*")
    result = json.loads((folder / "result.json").read_text())["result"]
    assert result["status"] == "ok" and result["command"].startswith("srun "), result
    assert f"--job-name={JOB_NAME}" in result["command"]
    assert (folder / f"slurm-{batch[0]['JobId']}.out").exists()
