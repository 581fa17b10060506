"""Agent and submit through a real coordinator (`hpc-ds1 serve`, one process, on the test's
NATS and Postgres): a device with its own home (its own log and database, as `hpc-ds1 setup`
leaves them) joins with the join token, uploads what it measured, gets the task placement sends
it, runs it for real and reports it; submit waits and returns the task with its placement
reason and result; the CLI prints the same; a restarted agent keeps its identity."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import ModelPublished, envelope
from hpc_ds1.fleet import Agent, submit
from hpc_ds1.fleet.client import device_file, load_identity
from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.models_store import save_local
from hpc_ds1.settings import Settings
from tests.fleet.coordinator import SIZE, Coordinator, bearer, stop_agent
from tests.support.commands import HPC_DS1, cli_env
from tests.support.waiting import until


def nats_url_of(settings: Settings) -> str:
    assert settings.nats_url
    return settings.nats_url


def device(server: str, token: str, device_id: str) -> dict[str, Any] | None:
    reply = httpx.get(f"{server}/v1/devices/{device_id}", headers=bearer(token), timeout=10)
    return reply.json() if reply.status_code == 200 else None


async def wait_task(coordinator: Coordinator, task_id: str, ok: Any) -> dict[str, Any]:
    url = f"{coordinator.server}/v1/tasks/{task_id}"
    async with httpx.AsyncClient(headers=bearer(coordinator.cli_token)) as http:

        async def task() -> dict[str, Any] | None:
            found: dict[str, Any] = (await http.get(url)).json()
            return found if ok(found) else None

        reached: dict[str, Any] = await until(f"task {task_id}", task, 60, every_s=0.1)
        return reached


async def start_agent(coordinator: Coordinator, home: Settings) -> tuple[Agent, asyncio.Task[None]]:
    agent = Agent(coordinator.server, coordinator.join_token, home=home.home, name="dev-b")
    agent.settings = home  # its own log and database (as hpc-ds1 setup left them)
    ready = asyncio.Event()
    agent.on_ready = lambda _: ready.set()
    task = asyncio.create_task(agent.serve())
    waiting = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiting}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if task.done():
        task.result()  # raise its error
    assert ready.is_set(), "the agent did not get its identity"
    return agent, task


async def test_an_agent_joins_uploads_and_runs_what_is_submitted(
    coordinator: Coordinator, device_home: Settings, tmp_path: Path
) -> None:
    agent, task = await start_agent(coordinator, device_home)
    try:
        assert agent.device_id == "dev-b"
        identity = load_identity(device_home.home, coordinator.server)
        assert identity is not None and identity.device_id == "dev-b"
        assert device_file(device_home.home).stat().st_mode & 0o777 == 0o600

        # Its measurement reaches the coordinator under its identity.
        deadline = time.monotonic() + 60
        found: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            found = await asyncio.to_thread(
                device, coordinator.server, coordinator.cli_token, "dev-b"
            )
            if found and found.get("measured") and found.get("status") in ("online", "busy"):
                break
            await asyncio.sleep(0.2)
        assert found is not None and found["local"] is False, found
        measured = {m["workload"]: m for m in found["measured"]}
        assert SIZE in measured["montecarlo"]["sizes"], found

        # The coordinator's own machine is a device too: drained, so the task goes to dev-b.
        # Its agent registers on its own time: wait until it is listed, or it is not drained.
        async with httpx.AsyncClient(headers=bearer(coordinator.cli_token)) as http:
            locals_: list[str] = []
            deadline = time.monotonic() + 60
            while not locals_ and time.monotonic() < deadline:
                listed = (await http.get(f"{coordinator.server}/v1/devices")).json()["devices"]
                locals_ = [d["device_id"] for d in listed if d["local"]]
                await asyncio.sleep(0.2)
            assert locals_, "the coordinator's own device never registered"
            for local in locals_:
                drained = await http.post(
                    f"{coordinator.server}/v1/devices/{local}/drain", json={"draining": True}
                )
                assert drained.status_code == 200, drained.text

        t = await asyncio.to_thread(
            submit, coordinator.server, coordinator.cli_token, "montecarlo", SIZE, timeout=120
        )
        assert t["status"] == "finished", t
        assert t["placement"]["device_id"] == "dev-b", t["placement"]
        assert "dev-b" in t["placement"]["reason"]
        assert t["result"]["device_id"] == "dev-b"
        assert t["result"]["runtime_s"] > 0
        assert agent.completed == 1

        # The CLI, the same way (with this home's own server and token found for it).
        cli = await asyncio.to_thread(
            subprocess.run,
            [
                *(HPC_DS1, "submit", "--server", coordinator.server),
                *("--token", coordinator.cli_token, "--workload", "montecarlo"),
                *("--size", str(SIZE), "--timeout", "120"),
            ],
            env=cli_env(coordinator.settings),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert cli.returncode == 0, cli.stderr
        assert "finished on dev-b in " in cli.stdout and "ranks=1 threads=1" in cli.stdout
        assert coordinator.cli_token not in cli.stdout + cli.stderr

        # A stop kills a running task at once, and says so to the coordinator.
        long = await asyncio.to_thread(
            submit,
            coordinator.server,
            coordinator.cli_token,
            "montecarlo",
            SIZE * 20_000,  # about 40 s here, by the measurement
            wait=False,
        )
        await wait_task(coordinator, long["task_id"], lambda t: t["status"] == "running")
        snapshot = await wait_task(coordinator, long["task_id"], lambda t: True)
        assert agent.running is not None and agent.running[0] == long["task_id"], snapshot
    finally:
        took = await stop_agent(agent, task)
    assert took < 15
    stopped = await wait_task(coordinator, long["task_id"], lambda t: bool(t["failures"]))
    assert "dev-b" in stopped["failures"][0] and "stopped during the run" in stopped["failures"][0]

    # A restart keeps the identity: no second device.
    agent, task = await start_agent(coordinator, device_home)
    try:
        assert agent.device_id == "dev-b"
        async with httpx.AsyncClient(headers=bearer(coordinator.cli_token)) as http:
            listed = (await http.get(f"{coordinator.server}/v1/devices")).json()["devices"]
        assert [d["device_id"] for d in listed if not d["local"]] == ["dev-b"]
    finally:
        await stop_agent(agent, task)

    serve_log = (tmp_path / "serve.err").read_text()
    assert coordinator.join_token not in serve_log
    assert identity.token not in serve_log


async def test_the_devices_model_is_uploaded_at_start_and_again_when_it_changes(
    coordinator: Coordinator, device_home: Settings, trained: Any
) -> None:
    data = trained.to_onnx()
    hw = await asyncio.to_thread(fingerprint)
    # As the trainer of the device's home leaves it: the file, latest.json, the published row.
    await asyncio.to_thread(save_local, device_home.models_dir, trained.version, hw.device_id, data)
    bus = await EventBus.connect(device_home, nats_url_of(device_home), "device-trainer")
    try:
        published = ModelPublished(
            model_version=trained.version,
            device_id=hw.device_id,
            artifact=f"{hw.device_id}/{trained.version}.onnx",
            sha256=hashlib.sha256(data).hexdigest(),
            metrics={"r2": 0.5},
            trained_on=17,
        )
        await bus.publish(envelope(published, actor="trainer", source="test", prefix=bus.prefix))
    finally:
        await bus.close()

    def model_of_dev_b() -> dict[str, Any] | None:
        found = device(coordinator.server, coordinator.cli_token, "dev-b")
        return (found or {}).get("model")

    async def wait_model(version: str) -> dict[str, Any]:
        async def model() -> dict[str, Any] | None:
            found = await asyncio.to_thread(model_of_dev_b)
            return found if found and found["model_version"] == f"dev-b:{version}" else None

        reached: dict[str, Any] = await until(f"dev-b's model {version}", model, 60, every_s=0.2)
        return reached

    agent, task = await start_agent(coordinator, device_home)
    try:
        first = await wait_model(trained.version)
        assert first["trained_on"] == 17
        # A new model in the home (here the same bytes under a new version) is sent too.
        await asyncio.to_thread(
            save_local, device_home.models_dir, "retrained1", hw.device_id, data
        )
        await wait_model("retrained1")
        assert agent.synced_version == "retrained1"
    finally:
        await stop_agent(agent, task)
