"""The console's "Plug it into existing tools" snippets run as shown against a real `hpc-ds1
serve` (a small real setup of montecarlo on this machine, the test run's NATS and Postgres with
this module's own stream, database and home): the Python call, each command line, the curl with
the CLI token as bearer, and the fleet's Python. The text run is the text the page shows; only
the JOIN_TOKEN placeholder, which the page tells the reader to fill in, is replaced."""

from __future__ import annotations

import contextlib
import html
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from hpc_ds1.infra.ports import free_port
from hpc_ds1.security.credentials import read_cli_token, read_join_token
from hpc_ds1.settings import Settings
from tests.support.commands import HPC_DS1, cli_env
from tests.support.databases import create_database, drop_database
from tests.support.waiting import wait_for

WORKLOAD = "montecarlo"
SIZES = (200_000,)
RUN_S = 300


@dataclass
class Served:
    base: str
    settings: Settings
    admin: str
    join: str
    env: dict[str, str]
    logs: Path

    def get(self, path: str) -> Any:
        reply = httpx.get(
            self.base + path, headers={"Authorization": f"Bearer {self.admin}"}, timeout=30
        )
        assert reply.status_code == 200, (path, reply.status_code, reply.text[:500])
        return reply

    def log(self) -> str:
        return (self.logs / "serve.err").read_text(errors="replace")[-4000:]

    def log_tail(self) -> str:
        return f"\nserve's log:\n{self.log()}"


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, nats_url: str, postgres_url: str
) -> Iterator[Served]:
    database_url = create_database(postgres_url, "snip")
    tag = uuid.uuid4().hex[:10]
    settings = Settings(
        home=tmp_path_factory.mktemp("snippets") / "home",
        nats_url=nats_url,
        database_url=database_url,
        stream=f"SNIP_{tag}",
        subject_prefix=f"s{tag}",
        log_json=True,
    )
    # As after `pip install .`: the hpc-ds1 command is on the PATH.
    env = cli_env(settings)
    env["PATH"] = f"{Path(HPC_DS1).parent}{os.pathsep}{env.get('PATH', '')}"
    logs = tmp_path_factory.mktemp("snippets-logs")
    sizes = ",".join(map(str, SIZES))
    setup = subprocess.run(
        [HPC_DS1, "setup", "--workload", WORKLOAD, "--repeats", "1", "--sizes", sizes],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert setup.returncode == 0, setup.stdout + setup.stderr
    port = free_port()
    out, err = open(logs / "serve.out", "w"), open(logs / "serve.err", "w")
    proc = subprocess.Popen(
        [HPC_DS1, "serve", "--port", str(port)],
        env={**env, "HPC_DS1_HEARTBEAT_INTERVAL_S": "1"},
        stdout=out,
        stderr=err,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> str | None:
            assert proc.poll() is None, (logs / "serve.err").read_text()[-4000:]
            cli = read_cli_token(settings.home)
            if cli and read_join_token(settings.home):
                with contextlib.suppress(httpx.HTTPError):
                    reply = httpx.get(
                        f"{base}/readyz", headers={"Authorization": f"Bearer {cli}"}, timeout=2
                    )
                    if reply.status_code == 200:
                        return cli
            return None

        admin = wait_for("serve got ready", ready, 120, every_s=0.3)
        join = read_join_token(settings.home)
        assert join
        s = Served(base=base, settings=settings, admin=admin, join=join, env=env, logs=logs)
        wait_for(
            "the local device online",
            lambda: [
                d
                for d in s.get("/v1/devices").json()["devices"]
                if d["local"] and d["status"] == "online"
            ],
            60,
            every_s=0.3,
            context=s.log_tail,
        )
        yield s
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        out.close()
        err.close()
        drop_database(postgres_url, database_url)


@pytest.fixture(scope="module")
def shown(served: Served) -> dict[str, str]:
    """The snippets as the console page shows them: {name: text}."""
    page = served.get("/").text
    found = re.findall(r'<code data-snippet="([a-z-]+)">(.*?)</code>', page, re.S)
    return {name: html.unescape(text) for name, text in found}


def commands(text: str) -> list[str]:
    """Shell commands of a snippet: continuation lines joined, comments and blanks dropped."""
    joined = text.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]


def bash(served: Served, command: str, stdin: str = "", timeout: float = RUN_S) -> str:
    done = subprocess.run(
        ["bash", "-c", command],
        env=served.env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}\n{served.log()}"
    return done.stdout


def python(served: Served, code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=served.env,
        capture_output=True,
        text=True,
        timeout=RUN_S,
    )
    assert done.returncode == 0, f"{code}\n{done.stdout}\n{done.stderr}\n{served.log()}"
    return done.stdout


def test_the_page_shows_every_snippet_filled_in_for_this_server(
    served: Served, shown: dict[str, str]
) -> None:
    assert list(shown) == ["python", "cli", "http", "fleet-device", "fleet-anywhere"]
    home = str(served.settings.home)
    for name in ("cli", "http", "fleet-anywhere"):
        assert served.base in shown[name], name
        assert f"{home}/credentials/cli.token" in shown[name], name
    # A job measured here: the workload set up, at its smallest measured size.
    for name in ("python", "cli", "http", "fleet-anywhere"):
        assert WORKLOAD in shown[name] and str(min(SIZES)) in shown[name], name
    # No secret is in the page: the reader fills the join token in, the CLI token is read.
    page = served.get("/").text
    assert served.admin not in page and served.join not in page


def test_the_python_snippet_runs(served: Served, shown: dict[str, str]) -> None:
    out = python(served, shown["python"]).strip()
    assert re.match(r"^(apply [A-Z_]+|confirm\? [A-Z_]+ 0\.\d+|escalate: \[.+\])$", out), out


def test_the_http_snippet_runs_with_the_cli_token_as_bearer(
    served: Served, shown: dict[str, str]
) -> None:
    script = shown["http"]
    reply = orjson.loads(bash(served, script))  # the whole snippet, as a shell script
    assert {"choice", "confidence", "mode", "reasons"} <= set(reply), reply
    assert reply["mode"] in ("auto", "confirm", "escalate")
    # The same request without the bearer is refused: the snippet's header is what makes it.
    header = '  -H "Authorization: Bearer $TOKEN" \\\n'
    assert header in script, script
    refused = orjson.loads(bash(served, script.replace(header, "")))
    assert "choice" not in refused and "token" in refused["error"], refused


def test_the_command_lines_run(served: Served, shown: dict[str, str]) -> None:
    decide, tune, submit, agent = commands(shown["cli"])
    assert decide.startswith("hpc-ds1 decide") and tune.startswith("hpc-ds1 tune")
    assert submit.startswith("hpc-ds1 submit") and agent.startswith("hpc-ds1 agent")

    out = bash(served, decide)
    assert re.search(r"auto|confirm|escalate", out), out
    # tune asks at the terminal when a move needs an engineer: this one says no, which ends
    # the session at its last good configuration.
    out = bash(served, tune, stdin="n\nfrom the snippet test\n")
    assert "session" in out, out
    out = bash(served, submit)
    assert "finished" in out, out

    joined = run_agent(served, agent.replace("JOIN_TOKEN", served.join), "cli-agent", shell=True)
    assert joined["local"] is False


def test_the_fleet_python_snippets_run(served: Served, shown: dict[str, str]) -> None:
    task = python(served, shown["fleet-anywhere"]).strip()
    assert task, "submit printed no placement reason"
    device = shown["fleet-device"].replace("JOIN_TOKEN", served.join)
    joined = run_agent(served, device, "py-agent", shell=False)
    assert joined["local"] is False


def run_agent(served: Served, snippet: str, label: str, *, shell: bool) -> dict[str, Any]:
    """Start an agent snippet with a home of its own (a device of its own), wait until its
    device is in /v1/devices, stop it. Returns the device."""
    before = {d["device_id"] for d in served.get("/v1/devices").json()["devices"]}
    home = served.logs / f"{label}-home"
    env = {**served.env, "HPC_DS1_HOME": str(home)}
    argv = ["bash", "-c", snippet] if shell else [sys.executable, "-c", snippet]
    log = open(served.logs / f"{label}.log", "w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
    try:

        def joined() -> list[dict[str, Any]]:
            assert proc.poll() is None, (served.logs / f"{label}.log").read_text()[-3000:]
            devices = served.get("/v1/devices").json()["devices"]
            return [d for d in devices if d["device_id"] not in before]

        return wait_for(f"{label} joined", joined, 120, every_s=0.3, context=served.log_tail)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
