"""The remote agent's identity and its behaviour towards the coordinator, in-process: the HTTP
side is an httpx transport answering as the contract says (the real gateway is exercised by
tests/fleet/test_agent_http.py): the device file is 0600 and reused on restart (no second
join), a refused credential ends the agent with a clear error, the token is in no log line, a
change of the home's model is noticed, and a result is posted again until it is accepted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpc_ds1.fleet import Agent
from hpc_ds1.fleet.agent import ModelWatch, measurement_chunks
from hpc_ds1.fleet.client import (
    REFUSED_CREDENTIAL,
    AgentClient,
    CredentialRefused,
    Identity,
    device_file,
    load_identity,
    save_identity,
)
from hpc_ds1.fleet.execute import TaskResult
from hpc_ds1.fleet.work import WorkItem
from hpc_ds1.models_store import save_local
from hpc_ds1.security.credentials import CredentialError

SERVER = "http://coordinator.test:8765"
JOIN_TOKEN = "join_" + "j" * 40
DEVICE_TOKEN = "dev_" + "d" * 40


class Coordinator:
    """Answers the agent endpoints as the contract says; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []  # (method, path, bearer)
        self.joins = 0
        self.busy_joins = 0  # joins answered 429 first (the gateway's limit per address)
        self.revoked = False
        self.beat = asyncio.Event()  # the transport answers on the test's event loop
        self.result_failures: list[Callable[[], httpx.Response]] = []
        self.results: list[dict[str, Any]] = []
        self.beats: list[dict[str, Any]] = []  # heartbeat bodies accepted
        self.refuse_running = False  # 403 a heartbeat naming a task (not this device's now)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
        path = request.url.path
        self.calls.append((request.method, path, bearer))
        if path == "/v1/fleet/join":
            if self.busy_joins:
                self.busy_joins -= 1
                body = {"error": "too many joins from this address"}
                return httpx.Response(429, json=body, headers={"Retry-After": "1"})
            if bearer != JOIN_TOKEN:
                return httpx.Response(401, json={"error": "invalid or revoked token"})
            self.joins += 1
            body = json.loads(request.content)
            assert body["hostname"] and body["fingerprint"]["device_id"]
            return httpx.Response(
                201,
                json={
                    "device_id": body.get("name") or "dev-a",
                    "token": DEVICE_TOKEN,
                    "token_id": "tok_dev",
                    "heartbeat_interval_s": 0.05,
                    "long_poll_s": 0.2,
                },
            )
        if bearer != DEVICE_TOKEN or self.revoked:
            return httpx.Response(401, json={"error": "invalid or revoked token"})
        if path == "/v1/agent/heartbeat":
            body = json.loads(request.content)
            if self.refuse_running and body.get("running"):
                why = f"dev-a may not report running task {body['running']}: attempt 2 is on dev-b"
                return httpx.Response(403, json={"error": why})
            self.beats.append(body)
            self.beat.set()
            return httpx.Response(204)
        if path == "/v1/agent/work":
            await asyncio.sleep(float(request.url.params["wait"]))  # held, as a long-poll
            return httpx.Response(204)
        if path.endswith("/result"):
            if self.result_failures:
                return self.result_failures.pop(0)()
            self.results.append(json.loads(request.content))
            return httpx.Response(200, json={"recorded": True, "measurement_id": "m"})
        return httpx.Response(404, json={"error": f"no {path}"})


def agent_for(home: Path, coordinator: Coordinator, token: str | None = JOIN_TOKEN) -> Agent:
    agent = Agent(SERVER, token, home=home, name="dev-a")
    agent.transport = httpx.MockTransport(coordinator)
    agent.retry_first_s = 0.01
    return agent


async def serve_until_beat(agent: Agent, coordinator: Coordinator) -> None:
    """Run the agent until the coordinator heard its heartbeat, then stop it."""
    coordinator.beat.clear()
    task = asyncio.create_task(agent.serve())
    heard = asyncio.create_task(coordinator.beat.wait())
    await asyncio.wait({task, heard}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    heard.cancel()
    agent.stop()
    await asyncio.wait_for(task, 30)


def test_the_identity_file_is_private_and_only_for_its_server(tmp_path: Path) -> None:
    identity = Identity(SERVER, "dev-a", DEVICE_TOKEN, "tok_dev", 5.0, 25.0)
    path = save_identity(tmp_path, identity)
    assert path == device_file(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert load_identity(tmp_path, SERVER + "/") == identity
    assert load_identity(tmp_path, SERVER.upper().replace("HTTP", "http")) == identity
    assert load_identity(tmp_path, "http://other:8765") is None
    assert DEVICE_TOKEN not in repr(identity)

    path.chmod(0o644)
    with pytest.raises(CredentialError, match="readable by others"):
        load_identity(tmp_path, SERVER)
    path.chmod(0o600)
    path.write_text("not json")
    with pytest.raises(CredentialError, match="does not hold a device identity"):
        load_identity(tmp_path, SERVER)


async def test_an_agent_joins_once_and_a_restart_keeps_its_identity(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    coordinator = Coordinator()
    first = agent_for(tmp_path, coordinator)
    await serve_until_beat(first, coordinator)
    assert coordinator.joins == 1 and first.device_id == "dev-a"
    stored = load_identity(tmp_path, SERVER)
    assert stored is not None and stored.token == DEVICE_TOKEN and stored.device_id == "dev-a"
    assert device_file(tmp_path).stat().st_mode & 0o777 == 0o600
    # After the join, every call carries the device's own credential, never the join token.
    after_join = coordinator.calls[1:]
    assert after_join and all(bearer == DEVICE_TOKEN for _, _, bearer in after_join)

    restarted = agent_for(tmp_path, coordinator, token=None)  # no join token: not needed
    await serve_until_beat(restarted, coordinator)
    assert coordinator.joins == 1, "a restart joined again"
    assert restarted.device_id == "dev-a"

    logged = capfd.readouterr()
    assert "agent_ready" in logged.err  # the agent logged, and no token is in it
    for secret in (JOIN_TOKEN, DEVICE_TOKEN):
        assert secret not in logged.out + logged.err


async def test_a_join_past_the_coordinators_limit_waits_its_retry_after(tmp_path: Path) -> None:
    coordinator = Coordinator()
    coordinator.busy_joins = 2
    agent = agent_for(tmp_path, coordinator)
    started = asyncio.get_running_loop().time()
    await serve_until_beat(agent, coordinator)
    assert coordinator.joins == 1 and agent.device_id == "dev-a"
    tries = [call for call in coordinator.calls if call[1] == "/v1/fleet/join"]
    assert len(tries) == 3
    assert asyncio.get_running_loop().time() - started >= 2.0  # Retry-After: 1, twice


async def test_a_revoked_credential_ends_the_agent_with_a_clear_error(tmp_path: Path) -> None:
    coordinator = Coordinator()
    await serve_until_beat(agent_for(tmp_path, coordinator), coordinator)
    coordinator.revoked = True
    with pytest.raises(CredentialRefused) as refused:
        await asyncio.wait_for(agent_for(tmp_path, coordinator).serve(), 30)
    assert REFUSED_CREDENTIAL in str(refused.value)
    assert str(device_file(tmp_path)) in str(refused.value)  # how to join again
    assert DEVICE_TOKEN not in str(refused.value)


async def test_a_wrong_join_token_is_refused_clearly(tmp_path: Path) -> None:
    coordinator = Coordinator()
    with pytest.raises(CredentialRefused, match="join token is wrong or was rotated"):
        await asyncio.wait_for(agent_for(tmp_path, coordinator, token="x" * 30).serve(), 30)
    assert not device_file(tmp_path).exists()


def test_a_change_of_the_homes_model_is_noticed(tmp_path: Path) -> None:
    watch = ModelWatch(tmp_path / "models")
    assert watch.version() is None
    save_local(tmp_path / "models", "aaaa1111", "dev-hw", b"first")
    assert watch.version() == "aaaa1111"
    assert watch.artifact("aaaa1111").read_bytes() == b"first"
    assert watch.version() == "aaaa1111"  # unchanged: the same version
    save_local(tmp_path / "models", "bbbb2222", "dev-hw", b"second")
    assert watch.version() == "bbbb2222"


async def test_the_sync_loop_uploads_again_when_the_model_changes(tmp_path: Path) -> None:
    coordinator = Coordinator()
    agent = agent_for(tmp_path, coordinator)
    agent.heartbeat_interval_s = 0.01
    synced: list[str | None] = []
    first, second = asyncio.Event(), asyncio.Event()

    async def sync(_: AgentClient, version: str | None) -> None:
        synced.append(version)
        (first if len(synced) == 1 else second).set()

    agent.sync = sync  # type: ignore[method-assign]  # record what the loop asks to upload
    agent._loop = asyncio.get_running_loop()
    agent._stopping = asyncio.Event()
    client = AgentClient(SERVER, DEVICE_TOKEN, transport=httpx.MockTransport(coordinator))
    loop = asyncio.create_task(agent._sync_loop(client))
    try:
        await asyncio.wait_for(first.wait(), 10)
        assert synced == [None]  # at start, even without a model: the measurements
        await asyncio.sleep(0.1)
        assert synced == [None]  # nothing changed: nothing sent again
        save_local(agent.settings.models_dir, "cccc3333", "dev-hw", b"onnx")
        await asyncio.wait_for(second.wait(), 10)
        assert synced == [None, "cccc3333"]
    finally:
        agent.stop()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await client.close()


async def test_a_heartbeat_refused_for_its_task_still_keeps_the_device_alive(
    tmp_path: Path,
) -> None:
    """The coordinator refuses a heartbeat naming a task that moved to another device (403):
    the agent says it is alive without the task instead of going silent."""
    coordinator = Coordinator()
    coordinator.refuse_running = True
    agent = agent_for(tmp_path, coordinator)
    agent.heartbeat_interval_s = 0.01
    agent._loop = asyncio.get_running_loop()
    agent._stopping = asyncio.Event()
    agent.running = ("t-moved", 0.0)
    client = AgentClient(SERVER, DEVICE_TOKEN, transport=httpx.MockTransport(coordinator))
    loop = asyncio.create_task(agent._heartbeat_loop(client))
    try:
        await asyncio.wait_for(coordinator.beat.wait(), 10)
        assert coordinator.beats[0] == {"queued": 0}
        refused = [c for c in coordinator.calls if c[1] == "/v1/agent/heartbeat"]
        assert len(refused) == 2  # the refused one, then the one without the task
    finally:
        agent.stop()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await client.close()


def item() -> WorkItem:
    return WorkItem(
        task_id="t1",
        attempt=2,
        device_id="dev-a",
        workload="montecarlo",
        size=100_000,
        config={"ranks": 1, "threads": 1, "tile": 4096},
    )


async def test_a_result_is_posted_again_until_it_is_accepted(tmp_path: Path) -> None:
    def refused() -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    coordinator = Coordinator()
    coordinator.result_failures = [
        refused,
        refused,
        lambda: httpx.Response(503, json={"error": "the projector is behind"}),
    ]
    agent = agent_for(tmp_path, coordinator)
    agent.device_id = "dev-a"
    agent._loop = asyncio.get_running_loop()
    agent._stopping = asyncio.Event()
    client = AgentClient(SERVER, DEVICE_TOKEN, transport=httpx.MockTransport(coordinator))
    result = TaskResult(
        attempt=2, status="ok", config=item().config, runtime_s=0.25, repeats=1, check_ok=True
    )
    try:
        await asyncio.wait_for(agent.deliver(client, item(), result), 30)
    finally:
        await client.close()
    posts = [c for c in coordinator.calls if c[1] == "/v1/agent/tasks/t1/result"]
    assert len(posts) == 4 and coordinator.result_failures == []
    assert coordinator.results == [result.model_dump(exclude_none=True)]
    assert agent.completed == 1


async def test_a_result_for_an_attempt_no_longer_current_is_not_posted_again(
    tmp_path: Path,
) -> None:
    coordinator = Coordinator()
    coordinator.result_failures = [lambda: httpx.Response(409, json={"error": "requeued"})]
    agent = agent_for(tmp_path, coordinator)
    agent.device_id = "dev-a"
    agent._loop = asyncio.get_running_loop()
    agent._stopping = asyncio.Event()
    client = AgentClient(SERVER, DEVICE_TOKEN, transport=httpx.MockTransport(coordinator))
    result = TaskResult(attempt=2, status="failed", config=item().config, error="boom")
    try:
        await asyncio.wait_for(agent.deliver(client, item(), result), 30)
    finally:
        await client.close()
    posts = [c for c in coordinator.calls if c[1].endswith("/result")]
    assert len(posts) == 1 and coordinator.results == [] and agent.completed == 0


def test_measurements_go_in_posts_under_the_body_limit() -> None:
    rows = [
        {"measurement_id": f"m{i}", "workload": "montecarlo", "pad": "x" * 200} for i in range(50)
    ]
    chunks = measurement_chunks(rows, max_bytes=2000)
    assert [r for c in chunks for r in c] == rows
    assert len(chunks) > 1
    assert all(len(json.dumps(c)) <= 2000 + 300 for c in chunks)
    assert measurement_chunks([]) == []


async def test_a_stop_while_the_coordinator_holds_the_join_returns_at_once(
    tmp_path: Path,
) -> None:
    joining = asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        joining.set()
        await asyncio.sleep(60)
        return httpx.Response(503)

    agent = Agent(SERVER, JOIN_TOKEN, home=tmp_path)
    agent.transport = httpx.MockTransport(slow)
    task = asyncio.create_task(agent.serve())
    await asyncio.wait_for(joining.wait(), 30)
    agent.stop()
    await asyncio.wait_for(task, 5)  # not the 60 s the coordinator would hold it
    assert agent.device_id is None and not device_file(tmp_path).exists()
