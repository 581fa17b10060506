"""The console's served product, as its tests see it: where the browser is, the workload and sizes
the package's setup measures, and `Console`, one `hpc-ds1 serve` with its tokens and ids."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from hpc_ds1.settings import Settings
from tests.support.commands import HPC_DS1, cli_env

BROWSER = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
# `make test` names this folder at its end (CONSOLE_SCREENS in the Makefile).
SCREENS = Path(os.environ.get("CONSOLE_SCREENS") or REPO / "build" / "console-screens")

WORKLOAD = "montecarlo"
SETUP_SIZES = (200_000, 400_000)
# Below the measured range: the familiarity guard escalates every decision of the session, so
# its first move waits for an engineer whatever the model's confidence.
SIZES_ARG = ",".join(map(str, SETUP_SIZES))
SESSION_SIZE = 100_000
TASK_SIZE = 200_000
START_S = 120.0
SETUP_TIMEOUT_S = 600.0


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (it is in the dev extras: make install)"
    if not BROWSER.exists():
        why = "not root" if os.geteuid() != 0 else "apt-get install chromium failed or no apt"
        return (
            f"{BROWSER} is missing ({why}): deploy/install-browser.sh, run by make install and "
            "make test, installs Debian's chromium as root"
        )
    return None


def non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine that is not loopback: a browser that opens the console
    there connects from it, so the gateway sees a peer that is not loopback."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10)
        for word in out.stdout.split():
            if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", word) and not word.startswith("127."):
                with socket.socket() as probe:  # reachable from here on that address
                    probe.bind((word, 0))
                return word
    return None


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Console:
    """The running console and what was put in it."""

    base: str  # http://127.0.0.1:<port>
    port: int
    settings: Settings
    admin: str  # the home's CLI token (admin)
    viewer: str
    join_token: str
    device_id: str
    session_id: str
    approval_id: str
    task_id: str
    logs: Path
    notes: dict[str, Any] = field(default_factory=dict)

    def api(self, method: str, path: str, token: str | None = None, **kw: Any) -> httpx.Response:
        return httpx.request(
            method, self.base + path, headers=bearer(token or self.admin), timeout=30, **kw
        )

    def get(self, path: str, token: str | None = None, **kw: Any) -> Any:
        reply = self.api("GET", path, token, **kw)
        assert reply.status_code == 200, f"GET {path}: {reply.status_code} {reply.text[:500]}"
        return reply.json()

    def hpc(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [HPC_DS1, *args],
            env=cli_env(self.settings),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"hpc-ds1 {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def login_token(self) -> str:
        """A new one-time login token, from the URL that `hpc-ds1 token login` prints."""
        out = self.hpc("token", "login")
        found = re.search(r"\?token=(\S+)", out)
        assert found, out
        return found.group(1)

    def serve_log(self) -> str:
        return (self.logs / "serve.err").read_text(errors="replace")[-4000:]

    def log_tail(self) -> str:
        return f"\nserve's log:\n{self.serve_log()}"
