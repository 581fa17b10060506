"""Free loopback ports and waiting for a server to accept connections."""

from __future__ import annotations

import os
import socket
import time


def _worker_slice() -> tuple[int, int]:
    """(index, count) of this pytest-xdist worker, (0, 1) outside one. The variables are
    inherited by what a worker starts (a CLI, a server), so they pick in its slice too."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        index = int(worker.removeprefix("gw")) if worker.startswith("gw") else 0
    except ValueError:
        return 0, 1
    return (index % count, count) if count > 1 else (0, 1)


def free_port(host: str = "127.0.0.1", avoid: tuple[int, ...] = (4222, 5432, 8765)) -> int:
    """A port nothing listens on now. Between this probe and the caller's bind another process
    may take it; parallel test workers take disjoint slices so that two of them never race for
    one. The slice is of port // 2: Linux hands bind() even ports first (odd ones are left to
    connect()), so port mod 2 would starve the worker of the odd slice."""
    index, count = _worker_slice()
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid and (port // 2) % count == index:
            return port


def wait_for_port(host: str, port: int, timeout: float, alive: object = None) -> None:
    """Block until host:port accepts a connection; `alive()` false means the server died."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            if callable(alive) and not alive():
                raise RuntimeError(f"server on {host}:{port} exited during start") from None
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nothing accepted connections on {host}:{port} within {timeout:.0f} s"
                ) from None
            time.sleep(0.02)
