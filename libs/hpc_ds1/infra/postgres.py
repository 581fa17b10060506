"""The embedded Postgres: the binaries of the pgserver package, listening on a loopback port."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path
from typing import Any

from .ports import free_port, wait_for_port

SYSTEM_USER = "pgserver"  # Postgres refuses to run as root; pgserver uses this account too.


def _bin(name: str) -> str:
    from pgserver._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


class EmbeddedPostgres:
    """initdb on first use, then `pg_ctl start`/`stop` on the data directory `pgdata`."""

    def __init__(self, pgdata: Path, port: int | None = None, durable: bool = True) -> None:
        self.pgdata = pgdata
        self.port = port
        self.durable = durable
        self._run_as: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _prepare_user(self) -> None:
        if os.geteuid() != 0:
            return
        from pgserver._commands import POSTGRES_BIN_PATH
        from pgserver.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        entry = ensure_user_exists(SYSTEM_USER)
        assert entry is not None
        self.pgdata.mkdir(parents=True, exist_ok=True)
        ensure_prefix_permissions(self.pgdata)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        ensure_folder_permissions(POSTGRES_BIN_PATH, 0o555)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o444)
        for path in [self.pgdata, *self.pgdata.rglob("*")]:
            os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run_as = {"user": SYSTEM_USER, "group": pwd.getpwnam(SYSTEM_USER).pw_gid}

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, check=False, **self._run_as
        )

    def start(self, timeout: float = 30.0) -> str:
        self.pgdata.mkdir(parents=True, exist_ok=True)
        self._prepare_user()
        if not (self.pgdata / "PG_VERSION").exists():
            done = self._run(
                _bin("initdb"),
                "-D",
                str(self.pgdata),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-instructions",
            )
            if done.returncode != 0:
                raise RuntimeError(f"initdb failed: {done.stderr.strip() or done.stdout.strip()}")
        # A server left running by a killed owner would hold the directory: stop it first.
        if self._run(_bin("pg_ctl"), "-D", str(self.pgdata), "status").returncode == 0:
            self._run(_bin("pg_ctl"), "-D", str(self.pgdata), "-m", "fast", "-w", "stop")
        self.port = self.port or free_port()
        options = f"-h 127.0.0.1 -p {self.port} -k ''"
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        done = self._run(
            _bin("pg_ctl"),
            "-D",
            str(self.pgdata),
            "-o",
            options,
            "-l",
            str(self.pgdata / "server.log"),
            "-w",
            "-t",
            str(int(timeout)),
            "start",
            timeout=timeout + 5,
        )
        if done.returncode != 0:
            log_file = self.pgdata / "server.log"
            log = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
            raise RuntimeError(f"Postgres did not start: {done.stderr.strip()}\n{log}")
        wait_for_port("127.0.0.1", self.port, timeout)
        return self.url

    def stop(self) -> None:
        if (self.pgdata / "postmaster.pid").exists():
            self._run(_bin("pg_ctl"), "-D", str(self.pgdata), "-m", "fast", "-w", "stop")
