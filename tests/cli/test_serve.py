"""The product end to end: `hpc-ds1 serve` as a user runs it, on embedded NATS and Postgres."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from hpc_ds1.infra.nats_server import leftover_servers
from hpc_ds1.infra.ports import free_port
from tests.support.commands import HPC_DS1
from tests.support.serving import cli_headers, start_serve, stop, wait_ready


def devices_registered(url: str, home: Path) -> list[dict]:
    headers = cli_headers(home)
    for _ in range(100):
        reply = httpx.get(f"{url}/v1/events", params={"type": "device.registered"}, headers=headers)
        if reply.status_code == 200 and reply.json()["events"]:
            return list(reply.json()["events"])
        time.sleep(0.1)
    return []


def test_serve_embedded_comes_back_with_its_data(tmp_path: Path) -> None:
    home = tmp_path / "home"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first = start_serve(home, port)
    try:
        ready = wait_ready(url, first)
        assert ready["checks"]["services"]["missing"] == []
        # Ready means the home's own tokens work: the CLI token is answered at once.
        assert ready["checks"]["credentials"] == {"ok": True, "problem": None}
        cli = (home / "credentials" / "cli.token").read_text().strip()
        answer = httpx.get(f"{url}/v1/devices", headers={"Authorization": f"Bearer {cli}"})
        assert answer.status_code == 200, answer.text
        registered = devices_registered(url, home)
        assert registered and registered[0]["data"]["local"] is True
        # On loopback too, nothing without a credential.
        assert httpx.get(f"{url}/v1/events").status_code == 401
        assert (home / "credentials" / "cli.token").stat().st_mode & 0o777 == 0o600
        # The CLI of the same home sends the home's token by itself: the server answers for the
        # job (no model yet: 409), not 401.
        env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
        decide = subprocess.run(
            [
                HPC_DS1,
                "decide",
                *"--workload gemm --size 64 --ranks 1 --threads 1".split(),
                "--runtime-s",
                "0.01",
            ],
            env={**env, "HPC_DS1_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert decide.returncode != 0 and "answered 409" in decide.stderr, decide.stderr
        # `status` finds the server, which answers and knows this machine's device; POST
        # /v1/recommend of the server says there is no model yet: a missing precondition (3).
        status = subprocess.run(
            [HPC_DS1, "status", "--json"],
            env={**env, "HPC_DS1_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert status.returncode == 0, status.stderr
        found = json.loads(status.stdout)
        assert found["server"]["url"].rstrip("/") == url and found["server"]["answers"]
        assert found["server"]["devices"] >= 1 and found["model"] is None
        assert "hpc-ds1 setup --quick" in found["next_step"]
        recommend = subprocess.run(
            [HPC_DS1, "recommend", "--server", url, *"--workload gemm --size 64".split()],
            env={**env, "HPC_DS1_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert recommend.returncode == 3, recommend.stderr
        assert "answered 409" in recommend.stderr and "no model" in recommend.stderr
        owner = json.loads((home / "owner.json").read_text())
        assert not owner["nats_url"].endswith(":4222")
        # Its output is no terminal: a one-time login URL comes from `hpc-ds1 token login`.
        login = subprocess.run(
            [HPC_DS1, "token", "login", "--json"],
            env={**env, "HPC_DS1_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert login.returncode == 0, login.stderr
        login_url = json.loads(login.stdout)["url"]
        assert login_url.startswith(f"{url}/?token=hds1_")
        one_time = login_url.split("?token=")[1]
        assert httpx.get(login_url, follow_redirects=False).status_code == 303
    finally:
        output = stop(first, signal.SIGINT)
    assert f"Console   {url}/" in output
    login_lines = [line for line in output.splitlines() if line.startswith("  Log in    ")]
    assert login_lines == ["  Log in    `hpc-ds1 token login` prints a one-time login URL"]
    cli_token = (home / "credentials" / "cli.token").read_text().strip()
    assert one_time not in output and cli_token not in output  # never logged
    assert (home / "nats" / "jetstream").is_dir() and (home / "postgres" / "PG_VERSION").exists()
    assert not (home / "owner.json").exists()
    audit_lines = (home / "audit.jsonl").read_text().splitlines()
    assert len(audit_lines) >= 1

    second = start_serve(home, port)
    try:
        wait_ready(url, second)
        events = httpx.get(
            f"{url}/v1/events", params={"type": "device.registered"}, headers=cli_headers(home)
        ).json()
        # The first run's registration is still there, and the second run adds its own.
        assert events["events"][0]["event_id"] == registered[0]["event_id"]
    finally:
        stop(second)
    lines = (home / "audit.jsonl").read_text().splitlines()
    assert lines[: len(audit_lines)] == audit_lines
    verdict = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from hpc_ds1.eventlog.audit import verify; from pathlib import Path; "
            f"print(verify(Path({str(home / 'audit.jsonl')!r})).intact)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert verdict.stdout.strip() == "True"


def test_serve_uses_external_servers_when_configured(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    home = tmp_path / "home"
    port = free_port()
    tag = os.urandom(4).hex()
    process = start_serve(
        home,
        port,
        HPC_DS1_NATS_URL=nats_url,
        HPC_DS1_DATABASE_URL=database_url,
        HPC_DS1_STREAM=f"EXT_{tag}",
        HPC_DS1_SUBJECT_PREFIX=f"ext{tag}",
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", process)
        owner = json.loads((home / "owner.json").read_text())
        assert owner["nats_url"] == nats_url and owner["embedded"] is False
    finally:
        stop(process)
    assert not (home / "nats").exists() and not (home / "postgres").exists()


def external_env(nats_url: str, database_url: str) -> dict[str, str]:
    tag = os.urandom(4).hex()
    return {
        "HPC_DS1_NATS_URL": nats_url,
        "HPC_DS1_DATABASE_URL": database_url,
        "HPC_DS1_STREAM": f"BAN_{tag}",
        "HPC_DS1_SUBJECT_PREFIX": f"ban{tag}",
    }


def serve_on_terminal(home: Path, port: int, env: dict[str, str], until: str) -> str:
    """`hpc-ds1 serve` with its stdout on a terminal (a pty) until it printed `until`, then
    stopped; what the terminal showed."""
    main_fd, terminal = pty.openpty()
    full = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    full.update(HPC_DS1_HOME=str(home), HPC_DS1_PORT=str(port), HPC_DS1_LOG_JSON="true", **env)
    with (home.parent / "serve-on-terminal.err").open("w") as err:
        process = subprocess.Popen([HPC_DS1, "serve"], env=full, stdout=terminal, stderr=err)
    os.close(terminal)
    shown = b""
    try:
        deadline = time.monotonic() + 240
        while until.encode() not in shown:
            assert time.monotonic() < deadline and process.poll() is None, shown.decode()
            ready, _, _ = select.select([main_fd], [], [], 1.0)
            if ready:
                shown += os.read(main_fd, 65536)
        wait_ready(f"http://127.0.0.1:{port}", process)  # type: ignore[arg-type]
    finally:
        process.send_signal(signal.SIGINT)
        while True:  # drain, so that serve never blocks on a full terminal
            ready, _, _ = select.select([main_fd], [], [], 1.0)
            try:
                chunk = os.read(main_fd, 65536) if ready else b""
            except OSError:  # the terminal closed: serve exited
                break
            shown += chunk
            if not chunk and process.poll() is not None:
                break
        process.wait(60)
        os.close(main_fd)
    assert process.returncode == 0, shown.decode()
    return shown.decode().replace("\r\n", "\n")


def test_serve_shows_the_join_token_and_login_url_on_a_terminal_and_in_no_log(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    home = tmp_path / "home"
    port = free_port()
    env = external_env(nats_url, database_url)
    # stdout to a file, as a service manager or `serve > serve.log` has it.
    log_file = tmp_path / "serve.log"
    full = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    full.update(HPC_DS1_HOME=str(home), HPC_DS1_PORT=str(port), HPC_DS1_LOG_JSON="true", **env)
    with log_file.open("w") as out:
        process = subprocess.Popen([HPC_DS1, "serve"], env=full, stdout=out, stderr=out)
    try:
        wait_ready(f"http://127.0.0.1:{port}", process)  # type: ignore[arg-type]
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(60)
    assert process.returncode == 0
    logged = log_file.read_text()
    join_token = (home / "credentials" / "join.token").read_text().strip()
    assert join_token.startswith("hds1_") and join_token not in logged
    assert "?token=" not in logged and "hds1_" not in logged  # no token of any kind
    assert "  Log in    `hpc-ds1 token login` prints a one-time login URL" in logged
    assert "  Join      `hpc-ds1 token join` prints the command that joins a device" in logged

    # On a terminal (this machine's own), both are shown.
    shown = serve_on_terminal(home, port, env, until="  Join      ")
    server = f"http://127.0.0.1:{port}"
    assert f"  Join      hpc-ds1 agent --server {server} --token {join_token}" in shown
    assert re.search(rf"^  Log in    {server}/\?token=hds1_\S+$", shown, re.MULTILINE), shown


def test_a_second_serve_is_refused_and_a_killed_one_leaves_no_server_behind(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first = start_serve(home, port)
    try:
        wait_ready(url, first)
        # Where the servers listen is for the home's account only, and holds no password.
        owner = (home / "owner.json").read_text()
        assert (home / "owner.json").stat().st_mode & 0o777 == 0o600
        assert home.stat().st_mode & 0o067 == 0
        servers = json.loads((home / "credentials" / "servers.json").read_text())
        passwords = [*servers["postgres"].values(), *servers["nats"].values()]
        assert passwords and not any(password in owner for password in passwords)
        second = start_serve(home, free_port())
        output, _ = second.communicate(timeout=60)
        assert second.returncode == 2
        assert "is already served by process" in output
        registered = devices_registered(url, home)
        assert registered
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    # After kill -9, a new serve on the home runs one nats-server on the store (the killed
    # one's died with it or is stopped first), and every event is still there.
    nats_config, nats_pid = home / "nats" / "nats.conf", home / "nats" / "nats.pid"
    third = start_serve(home, port)
    try:
        wait_ready(url, third)
        assert len(leftover_servers(nats_config, nats_pid)) == 1
        events = httpx.get(
            f"{url}/v1/events", params={"type": "device.registered"}, headers=cli_headers(home)
        ).json()
        assert events["events"][0]["event_id"] == registered[0]["event_id"]
    finally:
        stop(third)
    assert leftover_servers(nats_config, nats_pid) == []
