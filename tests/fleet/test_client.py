"""The fleet's HTTP clients: every unwanted answer is a FleetError that says what happened (a
refused credential in the words users see, a 422 with its fields), no token in any message, a
coordinator that is not there is Unreachable at once for submit; the agent client sends what
the contract says (work long-poll, heartbeat, model upload with its digest and metrics)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import pytest

from hpc_ds1.fleet import submit
from hpc_ds1.fleet.client import (
    REFUSED_CREDENTIAL,
    AgentClient,
    Conflict,
    CredentialRefused,
    FleetClient,
    Forbidden,
    NotFound,
    Rejected,
    ServerError,
    TooManyRequests,
    Unreachable,
    base_url,
    check,
)
from hpc_ds1.infra.ports import free_port

SERVER = "http://coordinator.test:8765"
TOKEN = "secret_" + "s" * 40


def answer(status: int, body: Any = None) -> httpx.Response:
    request = httpx.Request("POST", SERVER + "/v1/tasks")
    if body is None:
        return httpx.Response(status, request=request)
    return httpx.Response(status, json=body, request=request)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (401, CredentialRefused),
        (403, Forbidden),
        (404, NotFound),
        (409, Conflict),
        (413, Rejected),
        (422, Rejected),
        (429, TooManyRequests),
        (500, ServerError),
        (503, ServerError),
    ],
)
def test_each_refusal_is_its_own_error(status: int, kind: type[Exception]) -> None:
    with pytest.raises(kind) as raised:
        check(answer(status, {"error": "why it was refused"}), SERVER, "submit a task")
    assert "why it was refused" in str(raised.value)
    assert getattr(raised.value, "status", None) == status


@pytest.mark.parametrize(("header", "seconds"), [("7", 7.0), (None, 1.0), ("soon", 1.0)])
def test_a_429_says_when_to_try_again(header: str | None, seconds: float) -> None:
    response = answer(429, {"error": "too many joins from this address"})
    if header is not None:
        response.headers["Retry-After"] = header
    with pytest.raises(TooManyRequests) as raised:
        check(response, SERVER, "join the fleet")
    assert raised.value.retry_after_s == seconds


def test_a_refused_credential_says_so_in_plain_words() -> None:
    with pytest.raises(CredentialRefused) as raised:
        check(answer(401, {"error": "invalid or revoked token"}), SERVER, "wait for work")
    assert str(raised.value).startswith(REFUSED_CREDENTIAL)


def test_a_422_names_its_fields() -> None:
    body = {
        "error": "invalid request: body.size",
        "detail": [{"loc": ["body", "size"], "msg": "Input should be greater than 0"}],
    }
    with pytest.raises(Rejected, match=r"size: Input should be greater than 0"):
        check(answer(422, body), SERVER, "submit a task")


def test_success_passes_through() -> None:
    response = answer(201, {"task_id": "t"})
    assert check(response, SERVER, "submit a task") is response


def test_a_server_must_be_a_url() -> None:
    assert base_url(" http://c:8765/ ") == "http://c:8765"
    with pytest.raises(ValueError, match="must be a URL"):
        base_url("coordinator:8765")


def closed_port() -> int:
    return free_port()  # nothing listens there now: a connection is refused


def test_submit_to_a_coordinator_that_is_not_there_says_so() -> None:
    server = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(Unreachable) as raised:
        submit(server, TOKEN, "montecarlo", 100_000)
    assert f"cannot reach {server} to submit a task" in str(raised.value)
    assert TOKEN not in str(raised.value)


def test_submit_refuses_nonsense_waits() -> None:
    with pytest.raises(ValueError, match="timeout"):
        submit(SERVER, TOKEN, "montecarlo", 10, timeout=0)
    with pytest.raises(ValueError, match="poll_s"):
        submit(SERVER, TOKEN, "montecarlo", 10, poll_s=-1)


def test_the_clients_do_not_show_the_token() -> None:
    assert TOKEN not in repr(AgentClient(SERVER, TOKEN))
    with FleetClient(SERVER, TOKEN) as client:
        assert TOKEN not in repr(client)


async def test_the_agent_client_speaks_the_contract() -> None:
    seen: list[httpx.Request] = []
    item = {
        "task_id": "t1",
        "attempt": 1,
        "device_id": "dev-a",
        "workload": "montecarlo",
        "size": 100_000,
        "config": {"ranks": 1, "threads": 1, "tile": 4096},
        "expected_s": 0.5,
    }
    polls = iter([httpx.Response(200, json=item), httpx.Response(204)])

    def coordinator(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        path = request.url.path
        if path == "/v1/agent/work":
            return next(polls)
        if path == "/v1/agent/heartbeat":
            return httpx.Response(204)
        if path == "/v1/agent/measurements":
            n = len(json.loads(request.content)["measurements"])
            return httpx.Response(200, json={"accepted": n - 1, "known": 1})
        if path == "/v1/agent/model":
            return httpx.Response(201, json={"model_version": "dev-a:v1"})
        return httpx.Response(404, json={"error": "no such path"})

    client = AgentClient(SERVER, TOKEN, transport=httpx.MockTransport(coordinator))
    try:
        got = await client.work(2.5)
        assert got is not None and got.task_id == "t1" and got.expected_s == 0.5
        assert seen[-1].url.params["wait"] == "2.5"
        assert await client.work(2.5) is None

        await client.heartbeat("t1", 1.23456)
        assert json.loads(seen[-1].content) == {
            "queued": 0,
            "running": "t1",
            "running_for_s": 1.235,
        }
        await client.heartbeat(None, None)
        assert json.loads(seen[-1].content) == {"queued": 0}

        totals = await client.measurements([{"measurement_id": f"m{i}"} for i in range(3)])
        assert totals == {"accepted": 2, "known": 1, "refused": 0}

        data = b"onnx bytes"
        digest = hashlib.sha256(data).hexdigest()
        out = await client.model("v1", data, sha256=digest, trained_on=7, metrics={"r2": 0.9})
        assert out == {"model_version": "dev-a:v1"}
        upload = seen[-1]
        assert upload.content == data
        assert upload.headers["content-type"] == "application/octet-stream"
        assert dict(upload.url.params) == {"version": "v1", "trained_on": "7", "sha256": digest}
        assert json.loads(upload.headers["x-model-metrics"]) == {"r2": 0.9}

        with pytest.raises(NotFound):
            await client.started("t1", 1)  # this coordinator has no such path
    finally:
        await client.close()


async def test_the_agent_client_on_a_closed_port_is_unreachable() -> None:
    client = AgentClient(f"http://127.0.0.1:{closed_port()}", TOKEN)
    try:
        with pytest.raises(Unreachable, match=r"cannot reach .* to take a heartbeat"):
            await client.heartbeat(None, None)
    finally:
        await client.close()


def test_the_submit_command_prints_placement_and_result() -> None:
    from hpc_ds1.cli.submit import render

    task: dict[str, Any] = {
        "task_id": "t1",
        "status": "finished",
        "placement": {"reason": "dev-b: queue 0 s + best measured 4.2 s", "expected_s": 4.2},
        "result": {
            "device_id": "dev-b",
            "config": {"ranks": 2, "threads": 1, "tile": 64, "gpu": False},
            "runtime_s": 4.3101,
            "expected_s": 4.2,
        },
        "failures": [],
    }
    assert render(task).splitlines() == [
        "placed: dev-b: queue 0 s + best measured 4.2 s",
        "finished on dev-b in 4.31 s (expected 4.2 s, ranks=2 threads=1)",
    ]
    failed = {**task, "status": "failed", "result": None, "failures": ["a: x", "b: y"]}
    assert render(failed).splitlines()[-1] == "failed: a: x; b: y"
    waiting = {**task, "status": "waiting", "placement": None, "waiting_for": "no device"}
    assert render(waiting) == "status: waiting (no device)"
