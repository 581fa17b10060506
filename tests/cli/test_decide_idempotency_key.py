"""`hpc-ds1 decide --idempotency-key`: the key goes to the server as the Idempotency-Key header
(the same command run again after a timeout gets the first decision), and a malformed key is a
usage error naming the accepted form before anything is asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from hpc_ds1.cli import EXIT_USAGE, main
from hpc_ds1.cli import decide as cli_decide
from hpc_ds1.requests import DecideRequest

REQUEST = DecideRequest.model_validate(
    {"workload": "gemm", "size": 64, "config": {"ranks": 1, "threads": 1}, "source": "cli"}
)


def test_the_key_is_sent_as_the_idempotency_key_header(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, str]] = []

    def post(url: str, **kwargs: Any) -> httpx.Response:
        sent.append(dict(kwargs["headers"]))
        return httpx.Response(200, json={"decision_id": "d1"})

    monkeypatch.setattr(cli_decide.httpx, "post", post)
    cli_decide.over_http("http://gw", REQUEST, "tok", "retry-7")
    cli_decide.over_http("http://gw", REQUEST, "tok")
    assert sent[0]["Idempotency-Key"] == "retry-7"
    assert "Idempotency-Key" not in sent[1]


def test_a_malformed_key_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HPC_DS1_HOME", str(tmp_path / "home"))
    argv = ["decide", "--workload", "gemm", "--size", "64", "--ranks", "1", "--threads", "1"]
    assert main([*argv, "--idempotency-key", "has spaces", "--server", "http://gw"]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "--idempotency-key: invalid Idempotency-Key header: use 1 to 255" in error


def test_submit_sends_its_key_and_refuses_a_malformed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpc_ds1.fleet.client import FleetClient

    sent: list[httpx.Headers] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers)
        return httpx.Response(201, json={"task_id": "t1"})

    with FleetClient("http://gw", "tok") as client:
        client._http.close()
        client._http = httpx.Client(base_url="http://gw", transport=httpx.MockTransport(handler))
        client.submit("gemm", 64, "task-7")
        client.submit("gemm", 64)
    assert sent[0]["Idempotency-Key"] == "task-7" and "Idempotency-Key" not in sent[1]

    monkeypatch.setenv("HPC_DS1_HOME", str(tmp_path / "home"))
    argv = ["submit", "--workload", "gemm", "--size", "64", "--server", "http://gw"]
    assert main([*argv, "--idempotency-key", "x" * 256]) == EXIT_USAGE
    assert "use 1 to 255" in capsys.readouterr().err
