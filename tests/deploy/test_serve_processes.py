"""`hpc-ds1 serve --processes` runs each service as its own process: one command, the same banner,
and a Ctrl+C (SIGINT to the terminal's process group) stops every child; a `kill -9` of `serve`
itself leaves no service process behind either."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from hpc_ds1.infra.ports import free_port
from hpc_ds1.process.runtime import SERVICES
from tests.support.commands import HPC_DS1
from tests.support.serving import wait_ready


def start(home: Path, port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(home), HPC_DS1_PORT=str(port), HPC_DS1_LOG_JSON="true")
    # A session of its own: the test plays the terminal and signals the whole group.
    return subprocess.Popen(
        [HPC_DS1, "serve", "--processes"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def service_children(pid: int) -> dict[str, psutil.Process]:
    """serve's service processes by name: forked ones are named hpcds1-NAME (15 characters at
    most), spawned ones run `... service NAME`."""
    found = {}
    for child in psutil.Process(pid).children():
        try:
            comm, line = child.name(), child.cmdline()
        except psutil.Error:
            continue
        if comm.startswith("hpcds1-"):
            name = next((s for s in SERVICES if s.startswith(comm.removeprefix("hpcds1-"))), comm)
            found[name] = child
        elif len(line) >= 2 and line[-2] == "service":
            found[line[-1]] = child
    return found


def gone(processes: list[psutil.Process], within_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + within_s
    alive = processes
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.2)
    return alive


def test_ctrl_c_stops_every_service_process_and_kill_9_leaves_none(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"
    serve = start(home, port)
    try:
        wait_ready(url, serve, timeout=240)
        children = service_children(serve.pid)
        assert sorted(children) == sorted(SERVICES)
        assert all(c.pid != serve.pid for c in children.values())
    finally:
        os.killpg(serve.pid, signal.SIGINT)  # what Ctrl+C in the terminal sends
        output, _ = serve.communicate(timeout=120)
    assert serve.returncode == 0, output[-3000:]
    assert f"Console   {url}/" in output and "stopped after" in output
    assert gone(list(children.values()), 5) == []

    # kill -9 of serve: its children die with it (they would otherwise serve on, orphaned).
    again = start(home, port)
    try:
        deadline = time.monotonic() + 180
        while len(service_children(again.pid)) < len(SERVICES):
            assert again.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        children = service_children(again.pid)
    finally:
        again.kill()
        again.communicate(timeout=60)
    left = gone(list(children.values()), 30)
    _stop_servers_of(home)  # the embedded Postgres outlives a killed owner (the next one stops it)
    assert left == [], [p.cmdline() for p in left]


def _stop_servers_of(home: Path) -> None:
    for process in psutil.process_iter(["cmdline"]):
        if str(home) in " ".join(process.info["cmdline"] or []):
            with contextlib.suppress(psutil.Error):
                process.terminate()
