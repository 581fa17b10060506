"""Free loopback ports and waiting for a server to accept connections."""

from __future__ import annotations

import socket
import time


def free_port(host: str = "127.0.0.1", avoid: tuple[int, ...] = (4222, 5432, 8765)) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
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
