"""The console in a real browser: one `hpc-ds1 serve --host 0.0.0.0` of its own home (on the
test run's NATS and Postgres, its own stream, prefix and database) with real events in it: a
small real setup of montecarlo (measured under real MPI ranks and trained), a tuning session
paused on a move that waits for an engineer, a task placed on the local device and run, and a
viewer's token. Debian's chromium (deploy/install-browser.sh, run by `make install` and `make
test`) is driven by Playwright from pip through executable_path; without it the tests skip and
say why.

Every fixture here is package-scoped: the setup and the server are made once for the folder."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpc_ds1.infra.ports import free_port
from hpc_ds1.security.credentials import read_cli_token, read_join_token
from hpc_ds1.settings import Settings
from hpc_ds1.workloads import get_workload
from tests.support.commands import HPC_DS1, cli_env
from tests.support.databases import create_database, drop_database
from tests.support.waiting import wait_for

from .served import (
    BROWSER,
    SCREENS,
    SESSION_SIZE,
    SETUP_TIMEOUT_S,
    SIZES_ARG,
    START_S,
    TASK_SIZE,
    WORKLOAD,
    Console,
    bearer,
    browser_missing,
)


@pytest.fixture(scope="package")
def console_settings(
    tmp_path_factory: pytest.TempPathFactory, nats_url: str, postgres_url: str
) -> Iterator[Settings]:
    database_url = create_database(postgres_url, "console")
    tag = uuid.uuid4().hex[:10]
    yield Settings(
        home=tmp_path_factory.mktemp("console") / "home",
        nats_url=nats_url,
        database_url=database_url,
        stream=f"CON_{tag}",
        subject_prefix=f"c{tag}",
        log_json=True,
    )
    drop_database(postgres_url, database_url)


@pytest.fixture(scope="package")
def console(
    console_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    """`hpc-ds1 setup` (small, real), then `hpc-ds1 serve --host 0.0.0.0` with a session
    waiting for an engineer, a finished task and a viewer token in it."""
    missing = browser_missing()
    if missing:
        pytest.skip(missing)
    settings = console_settings
    logs = tmp_path_factory.mktemp("console-logs")
    env = cli_env(settings)
    started = time.monotonic()
    setup = subprocess.run(
        [HPC_DS1, "setup", "--workload", WORKLOAD, "--repeats", "1", "--sizes", SIZES_ARG],
        env=env,
        capture_output=True,
        text=True,
        timeout=SETUP_TIMEOUT_S,
    )
    assert setup.returncode == 0, setup.stdout + setup.stderr
    setup_s = time.monotonic() - started
    # the yardstick on the recorded fixture, for the Evaluation section's plot of it
    data = Path(__file__).resolve().parents[1] / "tuning" / "data"
    yardstick = subprocess.run(
        [sys.executable, "benchmarks/yardstick.py", str(data / "convolution_milo_A6000_cut.json"),
         "--kernel", str(data / "convolution_milo_cut.json"), "--seeds", "2", "--budgets",
         "5,10,20", "--policies", "random,optuna_tpe,hpcds1", "--home", str(settings.home)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=SETUP_TIMEOUT_S,
    )  # fmt: skip
    assert yardstick.returncode == 0, yardstick.stdout + yardstick.stderr

    port = free_port()
    serve_env = {**env, "HPC_DS1_HEARTBEAT_INTERVAL_S": "1"}
    out, err = open(logs / "serve.out", "w"), open(logs / "serve.err", "w")
    proc = subprocess.Popen(
        [HPC_DS1, "serve", "--host", "0.0.0.0", "--port", str(port)],
        env=serve_env,
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
                    reply = httpx.get(f"{base}/readyz", headers=bearer(cli), timeout=2)
                    if reply.status_code == 200:
                        return cli
            return None

        admin = wait_for("serve got ready", ready, START_S, every_s=0.3)
        join = read_join_token(settings.home)
        assert join
        c = Console(
            base=base,
            port=port,
            settings=settings,
            admin=admin,
            viewer="",
            join_token=join,
            device_id="",
            session_id="",
            approval_id="",
            task_id="",
            logs=logs,
        )
        created = c.hpc("token", "create", "--role", "viewer", "--name", "vic")
        c.viewer = created.strip().splitlines()[1].strip()
        assert c.get("/v1/whoami", c.viewer)["role"] == "viewer"

        devices = wait_for(
            "the local device online",
            lambda: [
                d for d in c.get("/v1/devices")["devices"] if d["local"] and d["status"] == "online"
            ],
            60,
            every_s=0.3,
            context=c.log_tail,
        )
        c.device_id = devices[0]["device_id"]

        # A session whose first move waits for an engineer (the guard: a size never measured).
        wl = get_workload(WORKLOAD)
        start = {"ranks": 1, "threads": 1, "tile": wl.default_tile}
        reply = c.api(
            "POST",
            "/v1/sessions",
            json={"workload": WORKLOAD, "size": SESSION_SIZE, "start": start},
        )
        assert reply.status_code in (200, 201, 202), reply.text
        c.session_id = reply.json()["session_id"]

        def waiting() -> list[dict[str, Any]]:
            rows = c.get("/v1/approvals")["approvals"]
            return [a for a in rows if a["session_id"] == c.session_id]

        c.approval_id = wait_for(
            "the session's first move waits for an engineer",
            waiting,
            180,
            every_s=0.3,
            context=c.log_tail,
        )[0]["approval_id"]

        # A task, placed on the local device (the only one) and run there for real.
        reply = c.api("POST", "/v1/tasks", json={"workload": WORKLOAD, "size": TASK_SIZE})
        assert reply.status_code in (200, 201, 202), reply.text
        c.task_id = reply.json()["task_id"]
        task = wait_for(
            "the task finished",
            lambda: (
                (t := c.get(f"/v1/tasks/{c.task_id}"))["status"] in ("finished", "failed") and t
            ),
            180,
            every_s=0.3,
            context=c.log_tail,
        )
        assert task["status"] == "finished", task
        c.notes.update(setup_s=setup_s, ready_s=time.monotonic() - started)
        print(
            f"console fixture: setup {setup_s:.1f} s ({setup.stdout.splitlines()[0]}), "
            f"serving with a waiting move and a finished task after {c.notes['ready_s']:.1f} s"
        )
        yield c
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


@pytest.fixture(scope="module")
def browser(console: Console) -> Iterator[Any]:
    """Module-scoped: while Playwright's sync API is open it keeps an event loop running on this
    thread, and the async tests of the modules after it (pytest-asyncio) could not start."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: chromium's sandbox refuses to run as root.
        chromium = p.chromium.launch(executable_path=str(BROWSER), args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="package")
def screens() -> Path:
    SCREENS.mkdir(parents=True, exist_ok=True)
    for old in SCREENS.glob("*.png"):
        old.unlink()
    return SCREENS
