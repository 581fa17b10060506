"""A local JetStream cluster: three (or five) nats-server processes of the same binary as the
embedded server, on loopback ports, each with its own store, joined by cluster routes.

For tests, for trying a cluster on one machine, and as the worked example of docs/cluster.md
(a site runs one such server per machine with the same configuration):

    python -m hpc_ds1.infra.cluster ~/hpc-ds1-cluster      # prints HPC_DS1_NATS_URL, runs

With HPC_DS1_NATS_URL naming every server and HPC_DS1_STREAM_REPLICAS=3, the event log and the
model bucket are kept on all three: any one server can die and the log goes on."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import nats
from nats.js.errors import APIError

from .nats_server import NatsUser, nats_server_binary
from .ports import free_port, wait_for_port

CLUSTER_NAME = "hpc-ds1"


def render_node_config(
    name: str,
    port: int,
    cluster_port: int,
    routes: Sequence[int],
    store_dir: Path,
    sync: Literal["always", "default"] = "always",
    host: str = "127.0.0.1",
    monitor_port: int | None = None,
    users: Sequence[NatsUser] | None = None,
) -> str:
    """One node's configuration: a unique server_name, JetStream with its own store, and
    routes to every node of the cluster (a route to itself is ignored). `users`: the only
    clients it accepts (the same on every node); None: anyone who reaches the port."""
    if users is not None and not users:
        raise ValueError("an authorized cluster needs at least one user")
    lines = [
        f"server_name: {json.dumps(name)}",
        f"listen: {host}:{port}",
        f"http: {host}:{monitor_port}" if monitor_port else "",
        "max_payload: 8MB",
        "jetstream {",
        f"  store_dir: {json.dumps(str(store_dir))}",
        # 'always' fsyncs every write: an acknowledged event is on disk on a quorum of nodes.
        "  sync_interval: always" if sync == "always" else "",
        "}",
        "cluster {",
        f"  name: {CLUSTER_NAME}",
        f"  listen: {host}:{cluster_port}",
        "  routes: [",
        *(f"    nats-route://{host}:{route}" for route in routes),
        "  ]",
        "}",
    ]
    if users:
        lines += ["authorization {", "  users = [", *(u.render() for u in users), "  ]", "}"]
    return "\n".join(line for line in lines if line) + "\n"


@dataclass
class Node:
    name: str
    port: int
    cluster_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def url_as(self, user: NatsUser | None) -> str:
        if user is None:
            return self.url
        return f"nats://{user.name}:{user.password}@127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class LocalCluster:
    """`size` nats-server processes under `directory` (node names n1, n2, ...). Ports are
    chosen once and kept, so a node restarted after a kill rejoins under the same address.
    `users`: every node accepts only these clients (as a site's cluster does); None: anyone."""

    def __init__(
        self,
        directory: Path,
        size: int = 3,
        sync: Literal["always", "default"] = "always",
        users: Sequence[NatsUser] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least 1 node, not {size}")
        if users is not None and not users:
            raise ValueError("an authorized cluster needs at least one user")
        self.directory = directory
        self.sync = sync
        self.users = None if users is None else tuple(users)
        taken: set[int] = set()
        self.nodes: list[Node] = []
        for index in range(1, size + 1):
            port, cluster_port = _fresh(taken), _fresh(taken)
            name = f"n{index}"
            self.nodes.append(Node(name, port, cluster_port, directory / name))

    @property
    def url(self) -> str:
        """HPC_DS1_NATS_URL for this cluster: every node, comma-separated (no credentials)."""
        return ",".join(node.url for node in self.nodes)

    def url_for(self, name: str) -> str:
        """HPC_DS1_NATS_URL with the credentials of user `name` in every node's URL."""
        return ",".join(node.url_as(self._user(name)) for node in self.nodes)

    def _user(self, name: str) -> NatsUser:
        for user in self.users or ():
            if user.name == name:
                return user
        known = [u.name for u in self.users or ()]
        raise KeyError(f"no NATS user {name!r} on this cluster; its users are {known}")

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r}; the nodes are {[n.name for n in self.nodes]}")

    def start(self, timeout: float = 30.0) -> str:
        """Start every node and wait until JetStream answers (a meta leader is elected).
        Blocking: from async code, `await asyncio.to_thread(cluster.start)`."""
        try:
            for node in self.nodes:
                self.start_node(node.name, timeout)
            asyncio.run(self.wait_ready(timeout))
        except Exception:
            self.stop()
            raise
        return self.url

    def start_node(self, name: str, timeout: float = 30.0) -> None:
        node = self.node(name)
        if node.running:
            return
        node.directory.mkdir(parents=True, exist_ok=True)
        config = node.directory / "nats.conf"
        config.write_text(
            render_node_config(
                node.name,
                node.port,
                node.cluster_port,
                [n.cluster_port for n in self.nodes],
                node.directory / "jetstream",
                self.sync,
                users=self.users,
            )
        )
        log = (node.directory / "nats.log").open("ab")
        node.process = subprocess.Popen(
            [str(nats_server_binary()), "-c", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        process = node.process
        wait_for_port("127.0.0.1", node.port, timeout, alive=lambda: process.poll() is None)

    async def wait_ready(self, within_s: float = 30.0) -> None:
        """Until JetStream answers through the running nodes (the cluster has a meta leader)."""
        deadline = time.monotonic() + within_s
        first = self.users[0] if self.users else None
        urls = [n.url_as(first) for n in self.nodes if n.running]
        nc = await nats.connect(urls, connect_timeout=2)
        try:
            js = nc.jetstream(timeout=2.0)
            while True:
                try:
                    await js.account_info()
                    return
                except (APIError, nats.errors.Error, TimeoutError) as error:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"the cluster's JetStream did not answer in {within_s:.0f} s: {error}"
                        ) from None
                    await asyncio.sleep(0.2)
        finally:
            await nc.close()

    def kill(self, name: str) -> None:
        """SIGKILL one node: no flush, no goodbye, as a crashed machine."""
        node = self.node(name)
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait()
        node.process = None

    def stop_node(self, name: str, timeout: float = 10.0) -> None:
        node = self.node(name)
        process, node.process = node.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)  # lets JetStream flush and close its stores
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        for node in self.nodes:
            self.stop_node(node.name)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _fresh(taken: set[int]) -> int:
    while (port := free_port()) in taken:
        pass
    taken.add(port)
    return port


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_ds1.infra.cluster",
        description="Run a local JetStream cluster (loopback) until Ctrl-C.",
    )
    parser.add_argument("directory", type=Path, help="where each node keeps its store")
    parser.add_argument("--size", type=int, default=3, choices=(1, 3, 5), help="nodes (3)")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.directory.expanduser().resolve(), size=args.size)
    url = cluster.start()
    print(f"{args.size} nodes up under {args.directory}; in another shell:")
    print(f"  export HPC_DS1_NATS_URL={url}")
    print(f"  export HPC_DS1_STREAM_REPLICAS={min(args.size, 3)}")
    for node in cluster.nodes:
        pid = node.process.pid if node.process else "?"
        print(f"  {node.name}: {node.url} (pid {pid}, store {node.directory / 'jetstream'})")
    sys.stdout.flush()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
