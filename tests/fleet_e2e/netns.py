"""A real fleet on one machine, for the end-to-end tests of this folder.

- a coordinator: `hpc-ds1 serve --host 0.0.0.0` as a process with its own home (embedded NATS
  and Postgres, listening on 127.0.0.1 only), short heartbeat / offline / long-poll settings;
- three network namespaces, each joined to the root namespace by a veth pair on its own /30
  (root side .1, namespace side .2), loopback up inside: a device there reaches the coordinator
  only over HTTP through its veth, like a separate host;
- three devices, each with its own home that first got a small real `hpc-ds1 setup`, run in the
  root namespace one after the other; one device is pinned to one CPU (`taskset -c 0`) for its
  setup and its agent, so its jobs get one CPU where the others get two;
- three `hpc-ds1 agent --server https://<root side>:<port> --token <join> --ca-cert-hash <pin>`
  processes, one per namespace: `serve` bound beyond loopback serves HTTPS with its home's own
  CA, whose pin the agents check (issue 45); the harness's own API calls use loopback, which
  stays plain HTTP;
- `tcpdump` on device a's link, from before its agent joins (deploy/install-tcpdump.sh; without
  it the capture test skips and says why).

The coordinator's own machine is a device too (serve runs a local agent); it is drained, so the
placements measured here are between the three remote devices only.

A fault "mid-task" is brought while the task's job is held: its rank processes are stopped
(SIGSTOP) as they start and the task is seen running (Fleet.hold_running), so a short job cannot
finish before the fault.

Everything is removed at the end, also on failure: processes (by the ids started here and their
descendants), namespaces and veth links. Namespaces and links left by an earlier run that died
(their pid is gone) are removed first. Needs root and `ip netns`; skips saying so otherwise."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from hpc_ds1.infra import tls
from hpc_ds1.infra.ports import free_port
from tests.support.waiting import wait_for

VENV_BIN = Path(sys.executable).parent
HPC_DS1 = str(VENV_BIN / "hpc-ds1")
AGENT_COMMAND = [HPC_DS1, "agent"]
WORKLOAD = "montecarlo"
SMALL, LARGE = 200_000, 4_000_000  # measured by every device's setup
SIZES = (SMALL, LARGE)
LETTERS = ("a", "b", "c")
PINNED = "c"  # this device's setup and agent run on CPU 0 only
NETNS_PREFIX = "hds1-"
SETTINGS_ENV = {
    "HPC_DS1_OFFLINE_AFTER_S": "3",
    "HPC_DS1_HEARTBEAT_INTERVAL_S": "0.5",
    "HPC_DS1_LONG_POLL_S": "2",
}


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def clean_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without its HPC_DS1_* settings, then a home of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(home), HPC_DS1_LOG_JSON="true", **(extra or {}))
    return env


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces and veth pairs need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"{NETNS_PREFIX}probe-{os.getpid()}"
    added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if added.returncode != 0:
        return f"`ip netns add` does not work here: {added.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def remove_leftovers() -> list[str]:
    """Namespaces `hds1-<pid>-x` (and their root-side links) of runs whose pid is gone."""
    removed = []
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(rf"{NETNS_PREFIX}(\d+)-([a-z])", name)
        if match and not psutil.pid_exists(int(match.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            subprocess.run(
                ["ip", "link", "del", f"hr{match.group(1)}{match.group(2)}"], capture_output=True
            )
            removed.append(name)
    return removed


def free_subnet_base() -> int:
    """A third octet X such that 10.231.X.0/28 is used by no interface of the root namespace."""
    used = sh("ip", "-o", "-4", "addr").stdout
    start = os.getpid() % 200
    for offset in range(256):
        third = (start + offset) % 256
        if f"10.231.{third}." not in used:
            return third
    raise RuntimeError("no free 10.231.X.0/28 for the test namespaces")


def tcp_refused_from(netns: str, host: str, port: int) -> bool:
    """True when a TCP connect from inside `netns` to host:port fails (refused or times out)."""
    probe = (
        "import socket,sys\n"
        "try:\n"
        f"    socket.create_connection(({host!r}, {port}), timeout=2).close()\n"
        "except OSError:\n"
        "    sys.exit(7)\n"
    )
    done = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=20,
    )
    if done.returncode not in (0, 7):
        raise RuntimeError(f"the probe in {netns} failed: {done.stderr.strip()}")
    return done.returncode == 7


@dataclass
class Netns:
    """One namespace with a veth pair to the root namespace on 10.231.<third>.<base>/30."""

    name: str
    root_link: str  # root-namespace end of the veth pair
    ns_link: str  # the end inside the namespace
    root_ip: str
    ns_ip: str
    created: bool = False

    @classmethod
    def numbered(cls, letter: str, third: int, index: int) -> Netns:
        pid = os.getpid()
        base = 4 * index
        return cls(
            name=f"{NETNS_PREFIX}{pid}-{letter}",
            root_link=f"hr{pid}{letter}",  # ≤ 15 characters for any pid ≤ 4,194,304
            ns_link=f"hn{pid}{letter}",
            root_ip=f"10.231.{third}.{base + 1}",
            ns_ip=f"10.231.{third}.{base + 2}",
        )

    def create(self) -> None:
        self.created = True
        sh("ip", "netns", "add", self.name)
        sh("ip", "link", "add", self.root_link, "type", "veth", "peer", "name", self.ns_link)
        sh("ip", "link", "set", self.ns_link, "netns", self.name)
        sh("ip", "addr", "add", f"{self.root_ip}/30", "dev", self.root_link)
        sh("ip", "link", "set", self.root_link, "up")
        sh("ip", "-n", self.name, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_link)
        sh("ip", "-n", self.name, "link", "set", self.ns_link, "up")
        sh("ip", "-n", self.name, "link", "set", "lo", "up")

    def cut(self) -> None:
        """Take the link down (the root side): nothing passes either way."""
        sh("ip", "link", "set", self.root_link, "down")

    def restore(self) -> None:
        sh("ip", "link", "set", self.root_link, "up")

    def exec_argv(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def destroy(self) -> None:
        if not self.created:
            return
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.root_link], capture_output=True)
        self.created = False

    def exists(self) -> bool:
        listing = sh("ip", "netns", "list").stdout.split()
        links = sh("ip", "-o", "link").stdout
        return self.name in listing or f" {self.root_link}@" in links


class Proc:
    """A process started here, in its own session, its stdout and stderr in files."""

    def __init__(self, argv: list[str], env: dict[str, str], out: Path, err: Path) -> None:
        self.argv, self.out, self.err = argv, out, err
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("ab") as stdout, err.open("ab") as stderr:
            self.popen = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def descendants(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return psutil.Process(self.pid).children(recursive=True)
        return []

    def kill9(self) -> None:
        """SIGKILL to the process, then to every descendant it had (a job it ran)."""
        left = self.descendants()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(left, timeout=5)

    def stop(self, timeout: float = 20.0) -> None:
        if not self.alive():
            return
        left = self.descendants()
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()

    def tail(self, lines: int = 20) -> str:
        parts = []
        for path in (self.out, self.err):
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"--- {path.name}\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts)


class Api:
    """The coordinator's HTTP API from the root namespace, as its admin."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.token = token
        self.client = httpx.Client(base_url=base, timeout=30.0)

    def call(
        self, method: str, path: str, token: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        return self.client.request(method, path, headers=headers, **kwargs)

    def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.call(method, path, **kwargs)
        assert response.status_code < 300, (
            f"{method} {path}: {response.status_code} {response.text}"
        )
        return response.json() if response.content else None

    def devices(self) -> dict[str, dict[str, Any]]:
        return {d["device_id"]: d for d in self.ok("GET", "/v1/devices")["devices"]}

    def task(self, task_id: str) -> dict[str, Any]:
        return self.ok("GET", f"/v1/tasks/{task_id}")

    def submit(self, workload: str, size: int) -> dict[str, Any]:
        response = self.call("POST", "/v1/tasks", json={"workload": workload, "size": size})
        assert response.status_code == 201, f"submit: {response.status_code} {response.text}"
        return response.json()

    def events(self, type: str | None = None) -> list[dict[str, Any]]:
        """Every event of the log as projected (of one type when given), oldest first."""
        found: list[dict[str, Any]] = []
        after = 0
        while True:
            params: dict[str, Any] = {"after": after, "limit": 1000}
            if type:
                params["type"] = type
            page = self.ok("GET", "/v1/events", params=params)
            found += page["events"]
            if page["next_after"] is None:
                return found
            after = page["next_after"]

    def wait_task(
        self, task_id: str, accept: Callable[[dict[str, Any]], bool], within_s: float, what: str
    ) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def check() -> dict[str, Any] | None:
            nonlocal last
            last = self.task(task_id)
            return last if accept(last) else None

        found: dict[str, Any] = wait_for(
            f"task {task_id} {what}",
            check,
            within_s,
            every_s=0.05,
            context=lambda: f"; last seen {json.dumps(last)[:1500]}",
        )
        return found


@dataclass
class Device:
    """One remote device: a namespace, a home with a real setup, an agent process."""

    letter: str
    netns: Netns
    home: Path
    logs: Path
    pinned: bool
    agent: Proc | None = None
    starts: int = 0
    setup_s: float = 0.0

    @property
    def name(self) -> str:
        return f"netns-{self.letter}"

    def prefix(self) -> list[str]:
        return ["taskset", "-c", "0"] if self.pinned else []

    def setup(self) -> None:
        """`hpc-ds1 setup` for real into this device's home, in the root namespace."""
        started = time.monotonic()
        argv = [*self.prefix(), HPC_DS1, "setup", "--workload", WORKLOAD]
        argv += ["--sizes", ",".join(str(s) for s in SIZES), "--repeats", "1", "--no-train"]
        out, err = self.logs / f"setup-{self.letter}.out", self.logs / f"setup-{self.letter}.err"
        proc = Proc(argv, clean_env(self.home), out, err)
        try:
            code = proc.popen.wait(240)
        except subprocess.TimeoutExpired:
            proc.kill9()
            raise
        assert code == 0, f"setup of {self.name} exited {code}\n{proc.tail()}"
        self.setup_s = time.monotonic() - started

    def start(self, server: str, join_token: str, pin: str | None = None) -> None:
        self.starts += 1
        argv = [*self.prefix(), *AGENT_COMMAND, "--server", server, "--token", join_token]
        argv += ["--name", self.name]
        if pin:
            argv += ["--ca-cert-hash", pin]
        out = self.logs / f"agent-{self.letter}.out"
        err = self.logs / f"agent-{self.letter}.err"
        self.agent = Proc(self.netns.exec_argv(*argv), clean_env(self.home), out, err)

    def identity(self) -> dict[str, Any] | None:
        path = self.home / "credentials" / "device.json"
        return json.loads(path.read_text()) if path.exists() else None

    @property
    def device_id(self) -> str:
        identity = self.identity()
        assert identity is not None, f"{self.name} has not joined"
        return str(identity["device_id"])

    def log_lines(self, word: str) -> list[str]:
        """The lines of this device's agent output (both streams) that hold `word`."""
        found = []
        for kind in ("out", "err"):
            path = self.logs / f"agent-{self.letter}.{kind}"
            if path.exists():
                found += [line for line in path.read_text().splitlines() if word in line]
        return found

    def ranks(self) -> list[psutil.Process]:
        """The rank processes of the job this device's agent runs now."""
        found = []
        for proc in self.agent.descendants() if self.agent else []:
            with contextlib.suppress(psutil.Error):
                if "hpc_ds1.runner.rank" in " ".join(proc.cmdline()):
                    found.append(proc)
        return found


@dataclass
class Fleet:
    root: Path
    port: int
    serve: Proc
    api: Api
    join_token: str
    local_device: str | None
    devices: dict[str, Device]
    nats_port: int
    postgres_port: int
    pin: str = ""  # the coordinator's CA pin, as its join command carries it
    capture: Capture | None = None  # tcpdump on device a's link, from before it joined
    timings: dict[str, float] = field(default_factory=dict)

    def server_for(self, device: Device) -> str:
        return f"https://{device.netns.root_ip}:{self.port}"

    def start_agent(self, device: Device) -> None:
        device.start(self.server_for(device), self.join_token, self.pin)

    def set_draining(self, device_ids: set[str], draining: bool) -> None:
        for device_id in device_ids:
            self.api.ok("POST", f"/v1/devices/{device_id}/drain", json={"draining": draining})

    def by_id(self, device_id: str) -> Device:
        for device in self.devices.values():
            if device.device_id == device_id:
                return device
        raise LookupError(f"{device_id} is none of the test's devices")

    def remote_ids(self) -> set[str]:
        return {d.device_id for d in self.devices.values()}

    def wait_online(self, device_ids: set[str], within_s: float = 60.0) -> dict[str, Any]:
        def online() -> dict[str, Any] | None:
            listed = self.api.devices()
            ready = all(
                d in listed and listed[d]["status"] in ("online", "busy") for d in device_ids
            )
            return listed if ready else None

        return wait_for(f"devices {sorted(device_ids)} online", online, within_s, every_s=0.2)

    def events_of(self, type: str, task_id: str) -> list[dict[str, Any]]:
        """The data of every event of `type` about this task, oldest first."""
        return [e["data"] for e in self.api.events(type) if e["data"].get("task_id") == task_id]

    def requeued_because_offline(self, task_id: str, device_id: str) -> list[str]:
        """The task's requeue reasons that name this device as offline."""
        reasons = [r["reason"] for r in self.events_of("task.requeued", task_id)]
        return [r for r in reasons if device_id in r and "offline" in r]

    def hold_running(
        self, task_id: str, within_s: float = 60.0
    ) -> tuple[Device, list[psutil.Process]]:
        """Wait until the task runs on its device and hold it there mid-run: each rank process
        of its job is stopped (SIGSTOP) as soon as it appears, so the job cannot end before the
        fault a test brings. RuntimeError when the task ended before it could be held."""
        placed = self.api.wait_task(task_id, lambda t: t["placement"] is not None, 60, "placed")
        device = self.by_id(placed["placement"]["device_id"])
        held: list[psutil.Process] = []
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            for proc in device.ranks():
                if proc not in held:
                    with contextlib.suppress(psutil.Error):
                        proc.suspend()
                        held.append(proc)
            task = self.api.task(task_id)
            if task["status"] == "running" and held:
                if task["placement"]["device_id"] != device.device_id:
                    raise RuntimeError(f"task {task_id} moved while being held: {task}")
                return device, held
            if task["status"] in ("finished", "failed"):
                raise RuntimeError(f"task {task_id} ended before it could be held: {task}")
            time.sleep(0.02)
        raise TimeoutError(f"task {task_id} did not run on {device.name} within {within_s:g} s")

    def setup_runs(self, device: Device) -> int:
        """How many runs the device's setup measured (it prints so)."""
        text = (device.logs / f"setup-{device.letter}.out").read_text()
        found = re.findall(r"measured (\d+) runs", text)
        assert found, f"no 'measured N runs' in {device.name}'s setup output"
        return int(found[-1])

    def uploaded_runs(self, listed: dict[str, Any], device: Device) -> int:
        kernels = {m["workload"]: m for m in listed[device.device_id]["measured"]}
        return int(kernels[WORKLOAD]["runs"]) if WORKLOAD in kernels else 0

    def all_uploaded(self) -> bool:
        listed = self.api.devices()
        return all(
            self.uploaded_runs(listed, d) >= self.setup_runs(d) for d in self.devices.values()
        )

    def written(self) -> dict[Path, bytes]:
        """Every file any process of the fleet wrote (logs, homes: stores, databases, audit),
        each read once. The servers are still running, so a file listed may be gone when read
        (Postgres rewrites its relation cache, pg_internal.init, at any moment): such a file
        is left out, since it no longer holds anything."""
        out: dict[Path, bytes] = {}
        for path in self.root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                try:
                    out[path] = path.read_bytes()
                except FileNotFoundError:
                    continue
        return out


class Capture:
    """tcpdump on one interface, every byte of every packet, into a pcap file."""

    def __init__(self, interface: str, path: Path) -> None:
        self.path = path
        self.log = path.with_suffix(".log")
        self.proc = Proc(
            ["tcpdump", "-i", interface, "-s", "0", "-U", "-n", "-w", str(path)],
            dict(os.environ),
            self.log,
            self.log,
        )
        wait_for(
            f"tcpdump listening on {interface}",
            lambda: "listening on" in self.log.read_text() or not self.proc.alive(),
            20,
        )
        if not self.proc.alive():
            raise RuntimeError(f"tcpdump exited: {self.log.read_text()[-500:]}")

    def stop(self) -> bytes:
        """Stop it (it writes what it holds on SIGTERM) and the capture's bytes."""
        if self.proc.alive():
            self.proc.popen.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.popen.wait(10)
            self.proc.stop(timeout=5)
        return self.path.read_bytes() if self.path.exists() else b""


def _start_coordinator(root: Path) -> tuple[Proc, int, dict[str, Any]]:
    home = root / "coordinator"
    port = free_port()
    argv = [HPC_DS1, "serve", "--host", "0.0.0.0", "--port", str(port)]
    serve = Proc(
        argv, clean_env(home, SETTINGS_ENV), root / "logs/serve.out", root / "logs/serve.err"
    )

    def ready() -> bool:
        if not serve.alive():
            raise RuntimeError(f"serve exited {serve.popen.returncode}\n{serve.tail()}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
        return False

    wait_for("the coordinator ready (/readyz)", ready, 120, every_s=0.25)
    owner = json.loads((home / "owner.json").read_text())
    return serve, port, owner


def _join_token(home: Path) -> str:
    """`hpc-ds1 token join` prints it (the file is the fallback while that command is missing)."""
    done = subprocess.run(
        [HPC_DS1, "token", "join"], env=clean_env(home), capture_output=True, text=True, timeout=60
    )
    if done.returncode == 0 and done.stdout.strip():
        match = re.search(r"[A-Za-z0-9_\-]{16,128}", done.stdout.strip().splitlines()[-1])
        if match:
            return match.group(0)
    return (home / "credentials" / "join.token").read_text().strip()


def _port(url: str) -> int:
    match = re.search(r":(\d+)(?:/|$)", url.rsplit("@", 1)[-1])
    assert match, f"no port in {url}"
    return int(match.group(1))


@contextlib.contextmanager
def running_fleet(root: Path) -> Iterator[Fleet]:
    """The whole fleet under `root`, removed on exit (also on failure)."""
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    remove_leftovers()
    third = free_subnet_base()
    spaces = {x: Netns.numbered(x, third, i) for i, x in enumerate(LETTERS)}
    devices = {
        x: Device(x, spaces[x], root / f"device-{x}", root / "logs", pinned=x == PINNED)
        for x in LETTERS
    }
    serve: Proc | None = None
    fleet: Fleet | None = None
    try:
        for space in spaces.values():
            space.create()
        timings["namespaces"] = time.monotonic() - t0

        started = time.monotonic()
        serve, port, owner = _start_coordinator(root)
        timings["coordinator start"] = time.monotonic() - started
        home = root / "coordinator"
        admin = (home / "credentials" / "cli.token").read_text().strip()
        api = Api(f"http://127.0.0.1:{port}", admin)
        join = _join_token(home)

        started = time.monotonic()
        for device in devices.values():
            device.setup()
            timings[f"setup {device.name}{' (pinned)' if device.pinned else ''}"] = device.setup_s
        timings["setups"] = time.monotonic() - started

        pin = tls.home_pin(home)
        assert pin, f"serve --host 0.0.0.0 made no CA in {home / 'tls'}"
        assert pin in serve.out.read_text(), "serve does not print its CA pin"
        fleet = Fleet(
            root=root,
            port=port,
            serve=serve,
            api=api,
            join_token=join,
            local_device=None,
            devices=devices,
            nats_port=_port(owner["nats_url"]),
            postgres_port=_port(owner["database_url"]),
            pin=pin,
            timings=timings,
        )
        if shutil.which("tcpdump") is not None:
            fleet.capture = Capture(spaces["a"].root_link, root / "capture-a.pcap")
        started = time.monotonic()
        for device in devices.values():
            fleet.start_agent(device)
        for device in devices.values():
            wait_for(
                f"{device.name} joined (its device.json)\n"
                + (device.agent.tail() if device.agent else ""),
                device.identity,
                60,
            )
        fleet.wait_online(fleet.remote_ids())
        timings["agents joined and online"] = time.monotonic() - started
        # Each agent uploads its home's measurements once it has joined; the tests start when
        # every device's are listed (or after 30 s: the first test then says what is missing).
        with contextlib.suppress(AssertionError):
            wait_for("every device's measurements uploaded", fleet.all_uploaded, 30, every_s=0.3)
        timings["measurements uploaded"] = time.monotonic() - started

        # The coordinator's own device (serve's local agent) is drained: the placements are
        # between the three remote devices.
        local = wait_for(
            "the coordinator's own device listed",
            lambda: [d for d in api.devices().values() if d.get("local")],
            30,
        )
        fleet.local_device = local[0]["device_id"]
        api.ok("POST", f"/v1/devices/{fleet.local_device}/drain", json={"draining": True})
        timings["harness ready"] = time.monotonic() - t0
        yield fleet
    finally:
        if fleet is not None and fleet.capture is not None:
            fleet.capture.stop()
        for device in devices.values():
            if device.agent is not None:
                device.agent.stop(timeout=10)
        if serve is not None:
            serve.stop(timeout=30)
        for space in spaces.values():
            space.destroy()
        timings["total"] = time.monotonic() - t0
        report = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
        print(f"\nfleet timings: {report}", file=sys.stderr)
        (root / "timings.json").write_text(json.dumps(timings, indent=1))
        left = [space.name for space in spaces.values() if space.exists()]
        assert not left, f"namespaces or links left: {left}"
