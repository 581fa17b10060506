"""A cut connection. As root: the client runs in its own network namespace, joined to the root
namespace by a veth pair, and nats-server listens on the root end's address; the cut takes that
link down (packets stop, nothing is reset) and brings it back up. Without root or `ip netns`:
a TCP proxy in this process drops every connection and refuses new ones for the same time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.infra.nats_server import nats_server_binary, render_config
from hpc_ds1.infra.ports import free_port, wait_for_port
from hpc_ds1.settings import Settings

from .cluster import MARKER, Cluster, stream_ids
from .loads import Load
from .outcome import Outcome

CLIENT = Path(__file__).with_name("netclient.py")


def _ip(*args: str, netns: str | None = None) -> None:
    argv = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


class Veth:
    """A network namespace and a veth pair: `host_addr` in the root namespace, `ns_addr` in it."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100_000}"
        self.netns = f"hpcf{tag}"
        self.host_if, self.ns_if = f"hpcfa{tag}", f"hpcfb{tag}"
        octet = 16 + os.getpid() % 200
        self.host_addr, self.ns_addr = f"10.213.{octet}.1", f"10.213.{octet}.2"

    def up(self) -> None:
        _ip("netns", "add", self.netns)
        try:
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.netns)
            _ip("addr", "add", f"{self.host_addr}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("addr", "add", f"{self.ns_addr}/30", "dev", self.ns_if, netns=self.netns)
            _ip("link", "set", self.ns_if, "up", netns=self.netns)
            _ip("link", "set", "lo", "up", netns=self.netns)
        except Exception:
            self.down()
            raise

    def link(self, state: str) -> None:
        _ip("link", "set", self.host_if, state)

    def down(self) -> None:
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", self.host_if)
        with contextlib.suppress(RuntimeError):
            _ip("netns", "del", self.netns)

    def wrap(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]


def netns_available() -> str | None:
    """None when a namespace and veth pair can be made here; else why not."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "no `ip` command"
    veth = Veth()
    try:
        veth.up()
    except RuntimeError as error:
        return str(error)
    finally:
        veth.down()
    return None


@contextlib.contextmanager
def nats_on(address: str, directory: Path, marker: str) -> Iterator[str]:
    """A nats-server (sync always, the project's config) listening on `address`."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = directory / "nats.conf"
    text = render_config(port, directory / "jetstream", "always")
    config.write_text(text.replace("listen: 127.0.0.1:", f"listen: {address}:"))
    with (directory / "nats.log").open("ab") as log:
        server = subprocess.Popen(
            [str(nats_server_binary()), "-c", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, MARKER: marker},
            start_new_session=True,
        )
    try:
        wait_for_port(address, port, 15, alive=lambda: server.poll() is None)
        yield f"nats://{address}:{port}"
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


class CutProxy:
    """TCP proxy to `target`; `cut(s)` drops every connection and refuses new ones for s."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self.writers -= {writer, up_writer}

    async def cut(self, seconds: float) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for writer in list(self.writers):
            writer.transport.abort()
        await asyncio.sleep(seconds)
        await self.start()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def cut_connection(cluster: Cluster, load: Load, repeat: int, rng: random.Random) -> Outcome:
    why_not = netns_available()
    how = "veth link down/up, client in its own netns" if why_not is None else "TCP proxy cut"
    out = Outcome("cut-link", f"cut the client's connection for {load.cut_down_s:g} s ({how})")
    if why_not is not None:
        out.notes.append(f"no network namespace ({why_not}): used the TCP proxy")
    veth = Veth() if why_not is None else None
    with contextlib.ExitStack() as stack:
        if veth is not None:
            veth.up()
            stack.callback(veth.down)
            url = stack.enter_context(
                nats_on(veth.host_addr, cluster.root / "nats-veth", cluster.marker)
            )
            proxy = None
        else:
            url = cluster.nats_url
            assert cluster.nats.port is not None
            proxy = CutProxy("127.0.0.1", cluster.nats.port)
            await proxy.start()
        try:
            for rep in range(repeat):
                out.repeats += 1
                await _one_cut(cluster, load, rep, rng, out, url, veth, proxy)
        finally:
            if proxy is not None:
                await proxy.close()
    return out


async def _one_cut(
    cluster: Cluster,
    load: Load,
    rep: int,
    rng: random.Random,
    out: Outcome,
    url: str,
    veth: Veth | None,
    proxy: CutProxy | None,
) -> None:
    tag = f"cut{rep}"
    settings = Settings(
        stream=f"F_{tag}", subject_prefix=f"f{tag}", nats_url=url, database_url="unused"
    )
    bus = await EventBus.connect(settings, url, "faults-checker")  # creates the stream
    acked_path = cluster.root / f"{tag}.acked"
    client_url = proxy.url if proxy is not None else url
    argv = [
        sys.executable,
        str(CLIENT),
        *("--url", client_url, "--stream", settings.stream, "--prefix", settings.subject_prefix),
        *("--count", str(load.cut_events), "--acked", str(acked_path)),
    ]
    client = await asyncio.create_subprocess_exec(
        *(veth.wrap(argv) if veth is not None else argv),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, MARKER: cluster.marker},
    )
    waiting = asyncio.create_task(client.communicate())
    cut_at = rng.randint(load.cut_events // 6, load.cut_events // 3)
    for _ in range(12_000):  # up to 2 minutes
        if _lines(acked_path) >= cut_at or waiting.done():
            break
        await asyncio.sleep(0.01)
    if waiting.done() or _lines(acked_path) < cut_at:
        out.fail(rep, f"the client never reached {cut_at} acknowledged events before the cut")
    else:
        if veth is not None:
            veth.link("down")
            await asyncio.sleep(load.cut_down_s)
            veth.link("up")
        else:
            assert proxy is not None
            await proxy.cut(load.cut_down_s)
        out.kills += 1
    try:
        stdout, stderr = await asyncio.wait_for(waiting, 180)
    except TimeoutError:
        client.kill()
        stdout, stderr = await waiting
    summary: dict[str, object] = {}
    with contextlib.suppress(Exception):
        summary = json.loads(stdout.decode().strip().splitlines()[-1])
    acked = acked_path.read_text().split() if acked_path.exists() else []
    stored = Counter(await stream_ids(bus))
    lost = [i for i in acked if stored[i] == 0]
    dups = sum(n - 1 for n in stored.values() if n > 1)
    out.add_events(len(acked), len(acked) - len(lost))
    out.lost += len(lost)
    out.duplicates += dups
    problems = []
    if client.returncode != 0 or not summary:
        problems.append(f"the client exited {client.returncode}: {stderr.decode()[-500:]}")
    elif summary.get("unacked"):
        problems.append(f"{summary['unacked']} events never acknowledged after the cut")
    elif len(acked) != load.cut_events:
        problems.append(f"{len(acked)} of {load.cut_events} events acknowledged")
    for problem in problems:
        out.fail(rep, problem)
    if rep == 0 and summary:
        out.notes.append(
            f"client (rep 1): {summary.get('disconnects')} disconnects, "
            f"{summary.get('reconnects')} reconnects, {summary.get('retries')} retries"
        )
    if summary and not summary.get("reconnects"):
        out.notes.append(f"repetition {rep + 1}: the client's connection outlived the cut")
    if not problems and not lost and not dups:
        out.survived += 1
    for stream in (settings.stream, settings.dead_letter_stream):
        with contextlib.suppress(Exception):
            await bus.js.delete_stream(stream)
    await bus.close()
