"""Issue 41's probe again, against a real `hpc-ds1 serve`: what a device credential's holder can
still do. Run: `python benchmarks/probe_devices.py [--wrong-tokens N] [--quick] [--json]`
(`make bench-probe`).

It starts `hpc-ds1 serve` (embedded NATS and Postgres) on a fresh temporary home, its working
directory the home's parent and its stdout and stderr (not a terminal) in home/serve.log, takes
the join token as an admin would (`hpc-ds1 token join --json`) and joins devices with it
(POST /v1/fleet/join): deva (this machine's fingerprint), devb (the same, honest) and liar (the
same but claiming 1,048,576 CPUs). Then, one line of the issue at a time, with figures of this
run:

  model bomb      ConstantOfShape([2^28]) -> ReduceSum (156 bytes), the same inside a real
                  model, and a real model with 2 GiB no static bound sees (one, then several at
                  once) to POST /v1/agent/model, beside a legitimate model (trained here on
                  synthetic measurements): status, answer time, the gateway's RSS before and at
                  its peak (VmRSS every 20 ms, and VmHWM), the vetting child's peak;
  external data   a real model whose tensor is external data at credentials/join.token,
                  relative to the gateway's working directory, and at a missing file: status,
                  whether the answers differ, whether anything opened the file (inotify);
  1e-6 s          deva's 1e-6 s for gemm 512 and 1024 (and what its claimed hardware would
                  allow), devb's honest runtimes, liar's 1e-6 s; gemm tasks submitted with the
                  home's CLI token: where they are placed and why, before any device ran the
                  job for the fleet, after devb did (deva and liar drained meanwhile), and
                  after liar ran its tasks reporting the 1e-6 s it claimed;
  heartbeat       deva's heartbeat naming devb's running task;
  join token      joins until the token's uses are spent (count, refusal); then 30 joins with
                  X-Forwarded-For, which the gateway counts as relayed (not this machine):
                  401 against 429 (joins from loopback itself are not limited);
  wrong tokens    N wrong bearer tokens from 4 connections: 401 against 429, requests/s, the
                  auth log lines serve wrote for them (and, a minute on, the count it logs
                  for the rest), and what a valid credential from the same address got
                  meanwhile;
  forwarded       X-Forwarded-For: 8.8.8.8 from loopback: the client the gateway logged;
  the log         whether any token or a login URL (`?token=`) is in serve's stdout.

`--quick` (CI): smaller counts, a join token of 4 uses, no minute's wait; `--json`: the
summary as one JSON object on stdout (the report goes to stderr)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decide_http import _home_credential
from bench_soak import start_serve, stop_serve, wait_served
from unsafe_models import bomb_in, constant_of_shape_bomb, external_in, heavy_in, open_watch

from hpc_ds1.fleet.plausible import declared_work, peak
from hpc_ds1.infra.ports import free_port
from hpc_ds1.machine.hardware import Fingerprint, fingerprint
from hpc_ds1.model import Measurement, train
from hpc_ds1.security.credentials import join_token_path, read_cli_token
from hpc_ds1.security.tokens import new_token
from hpc_ds1.space import ConfigSpace

CONFIG = {"ranks": 1, "threads": 1, "tile": 64, "gpu": False}
HONEST_S = {512: 0.1, 1024: 0.8}  # devb's runtimes of gemm 512 and 1024
LIAR_CPUS = 1 << 20  # the most logical CPUs a joining device may claim
RSS_BOUND_MB = 200.0  # what the test allows the gateway to grow while it checks a bomb
SAMPLE_S = 0.02
TOKEN = re.compile(r"hds1_[A-Za-z0-9_\-]{16,}")


@dataclass
class Sizes:
    wrong_tokens: int = 2000
    concurrent_heavy: int = 4
    forwarded_joins: int = 30
    join_uses: int | None = None  # None: serve's default
    tasks_before: int = 3
    tasks_after: int = 4
    log_window: bool = True  # wait out the auth log's minute for its count of a flood


QUICK = Sizes(wrong_tokens=300, concurrent_heavy=2, forwarded_joins=15, join_uses=4,
              tasks_before=2, tasks_after=2, log_window=False)  # fmt: skip


def say(text: str = "") -> None:
    print(text, file=REPORT, flush=True)


REPORT = sys.stdout


# --- memory of the gateway ----------------------------------------------------------------


def _status_kb(pid: int, field_name: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field_name}:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def gateway_pid(serve_pid: int) -> int:
    """The gateway's process: serve's child named hpcds1-gateway (serve --processes), else serve
    itself (one process)."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(serve_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.name() == "hpcds1-gateway":
                    return child.pid
    return serve_pid


@dataclass
class Memory:
    before_mb: float = 0.0
    peak_mb: float = 0.0  # VmRSS sampled every SAMPLE_S
    hwm_mb: float | None = None  # the kernel's peak (VmHWM, reset at the start), when resettable
    children_peak_mb: float = 0.0  # the gateway's children (the vetting sandbox), summed

    @property
    def growth_mb(self) -> float:
        top = max(self.peak_mb, self.hwm_mb or 0.0)
        return top - self.before_mb

    def text(self) -> str:
        hwm = f", VmHWM {self.hwm_mb:.0f}" if self.hwm_mb is not None else ""
        child = (
            f"; vetting child peak {self.children_peak_mb:.0f} MB"
            if self.children_peak_mb
            else "; no child"
        )
        return (
            f"gateway RSS {self.before_mb:.0f} -> peak {self.peak_mb:.0f} MB{hwm} "
            f"(+{self.growth_mb:.0f} MB){child}"
        )


class MemoryWatch:
    """The gateway's VmRSS and its children's RSS every SAMPLE_S in a thread, and its VmHWM
    (reset at the start through /proc/PID/clear_refs where allowed)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.memory = Memory()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._reset = False

    def __enter__(self) -> Memory:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            self._reset = True
        except OSError:
            pass
        self.memory.before_mb = (_status_kb(self.pid, "VmRSS") or 0) / 1024
        self.memory.peak_mb = self.memory.before_mb
        self._thread.start()
        return self.memory

    def _sample(self) -> None:
        process = psutil.Process(self.pid)
        while not self._stop.is_set():
            rss = _status_kb(self.pid, "VmRSS")
            if rss is not None:
                self.memory.peak_mb = max(self.memory.peak_mb, rss / 1024)
            children = 0
            with contextlib.suppress(psutil.Error):
                for child in process.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        children += child.memory_info().rss
            self.memory.children_peak_mb = max(self.memory.children_peak_mb, children / 2**20)
            self._stop.wait(SAMPLE_S)

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        hwm = _status_kb(self.pid, "VmHWM")
        if self._reset and hwm is not None:
            self.memory.hwm_mb = hwm / 1024


# --- a legitimate model -------------------------------------------------------------------


def legitimate_model(fp: Fingerprint) -> bytes:
    """A real hpc_ds1 model of this machine, trained on synthetic gemm runtimes with a clear
    best configuration (no run: it only has to be what our training exports)."""
    measurements = []
    for config in ConfigSpace.for_device(fp, "gemm").configs():
        for size in (48, 64, 96):
            speed = min(config.ranks * config.threads, fp.cpus) * (1 + math.log2(config.tile) / 10)
            runtime = size**3 / 1e9 / speed + 1e-3 * config.ranks
            measurements.append(
                Measurement(
                    workload="gemm",
                    size=size,
                    config=config.model_dump(),
                    status="ok",
                    runtime_s=runtime,
                    throughput=2 * size**3 / runtime / 1e9,
                )
            )
    return train(measurements, fp, seed=0, candidates=["logistic"]).to_onnx()


# --- the probe ----------------------------------------------------------------------------


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def error_of(reply: httpx.Response) -> str:
    try:
        body = reply.json()
    except ValueError:
        return reply.text[:300]
    if isinstance(body, dict):
        return str(body.get("error") or body.get("detail") or body)[:600]
    return str(body)[:300]


@dataclass
class Probe:
    http: httpx.AsyncClient
    home: Path
    serve: subprocess.Popen[bytes]
    sizes: Sizes
    admin: dict[str, str] = field(default_factory=dict)
    devices: dict[str, dict[str, str]] = field(default_factory=dict)
    secrets: set[str] = field(default_factory=set)
    gateway: int = 0
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.home / "serve.log"

    def log_lines(self, since: int) -> list[dict[str, Any]]:
        """serve's JSON log lines past byte `since` (its banner's plain lines left out)."""
        with self.log.open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        lines = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                found = json.loads(line)
                if isinstance(found, dict):
                    lines.append(found)
        return lines

    def log_size(self) -> int:
        return self.log.stat().st_size


async def upload(
    http: httpx.AsyncClient, device: dict[str, str], data: bytes, version: str
) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    reply = await http.post(
        "/v1/agent/model",
        params={"version": version, "trained_on": 1, "sha256": hashlib.sha256(data).hexdigest()},
        content=data,
        headers={**device, "content-type": "application/octet-stream"},
    )
    return reply, time.perf_counter() - started


async def join(
    http: httpx.AsyncClient,
    token: str,
    name: str,
    fp: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    body = {"hostname": f"probe-{name}", "fingerprint": fp, "name": name}
    return await http.post(
        "/v1/fleet/join", json=body, headers={**bearer(token), **(headers or {})}
    )


def measurement(mid: str, size: int, runtime_s: float) -> dict[str, Any]:
    return {
        "measurement_id": mid,
        "workload": "gemm",
        "size": size,
        "config": CONFIG,
        "status": "ok",
        "runtime_s": runtime_s,
        "repeats": 3,
        "purpose": "setup",
    }


async def measure(probe: Probe, device: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    reply = await probe.http.post(
        "/v1/agent/measurements", json={"measurements": items}, headers=probe.devices[device]
    )
    if reply.status_code != 200:
        raise SystemExit(f"measurements of {device}: {reply.status_code} {reply.text[:500]}")
    answer: dict[str, Any] = reply.json()
    return answer


async def beat_forever(probe: Probe, names: list[str]) -> None:
    """Heartbeats of the probe's devices every 2 s (placement takes online devices only)."""
    while True:
        for name in names:
            with contextlib.suppress(httpx.HTTPError):
                await probe.http.post("/v1/agent/heartbeat", json={}, headers=probe.devices[name])
        await asyncio.sleep(2.0)


async def devices_view(probe: Probe) -> dict[str, dict[str, Any]]:
    reply = await probe.http.get("/v1/devices", headers=probe.admin)
    if reply.status_code != 200:
        return {}
    return {d["device_id"]: d for d in reply.json()["devices"]}


async def until_status(probe: Probe, names: list[str], wanted: set[str], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while True:
        view = await devices_view(probe)
        if all(view.get(n, {}).get("status") in wanted for n in names):
            return
        if time.monotonic() > deadline:
            shown = {n: view.get(n, {}).get("status") for n in names}
            raise SystemExit(f"devices not {sorted(wanted)} within {within_s:g} s: {shown}")
        await asyncio.sleep(0.2)


async def submit(probe: Probe, size: int) -> str:
    reply = await probe.http.post(
        "/v1/tasks", json={"workload": "gemm", "size": size}, headers=probe.admin
    )
    if reply.status_code != 201:
        raise SystemExit(f"submit gemm {size}: {reply.status_code} {reply.text[:500]}")
    return str(reply.json()["task_id"])


async def placed(probe: Probe, task_id: str, within_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        reply = await probe.http.get(f"/v1/tasks/{task_id}", headers=probe.admin)
        if reply.status_code == 200:
            view = reply.json()
            if view["status"] in ("placed", "running", "finished", "waiting"):
                return view
        await asyncio.sleep(0.1)
    raise SystemExit(f"task {task_id} was not placed within {within_s:g} s: {view}")


def placement_line(view: dict[str, Any]) -> dict[str, Any]:
    place = view.get("placement") or {}
    return {
        "task_id": view["task_id"],
        "size": view["size"],
        "status": view["status"],
        "device": place.get("device_id"),
        "verified": place.get("verified"),
        "claimed_s": place.get("claimed_s"),
        "expected_s": place.get("expected_s"),
        "reason": place.get("reason") or view.get("waiting_for"),
    }


async def place_tasks(probe: Probe, sizes: list[int]) -> list[dict[str, Any]]:
    found = []
    for size in sizes:
        view = await placed(probe, await submit(probe, size))
        line = placement_line(view)
        found.append(line)
        say(f"    gemm {size}: {line['device']} (verified {line['verified']}): {line['reason']}")
    return found


# --- each line of the issue ---------------------------------------------------------------


async def probe_forwarded(probe: Probe) -> None:
    """The first failed authentication of this run, from loopback, with X-Forwarded-For."""
    since = probe.log_size()
    reply = await probe.http.get(
        "/v1/devices/xff-probe",
        headers={**bearer(new_token()), "X-Forwarded-For": "8.8.8.8"},
    )
    clients: list[str] = []
    for _ in range(50):
        clients = [
            str(line.get("client"))
            for line in probe.log_lines(since)
            if line.get("event") == "auth_rejected" and line.get("path") == "/v1/devices/xff-probe"
        ]
        if clients:
            break
        await asyncio.sleep(0.1)
    probe.summary["forwarded"] = {"status": reply.status_code, "logged_clients": clients}
    say(
        f"  X-Forwarded-For: 8.8.8.8 from loopback (a wrong token): {reply.status_code}; the "
        f"gateway logged client {', '.join(clients) or '(no auth_rejected line)'}"
    )


async def probe_models(probe: Probe, legit: bytes) -> None:
    device = probe.devices["deva"]
    cases = [
        ("legitimate model", legit),
        ("ConstantOfShape([2^28]) -> ReduceSum", constant_of_shape_bomb()),
        ("the same bomb inside a real model", bomb_in(legit)),
        ("a real model + 2 GiB no static bound sees", heavy_in(legit)),
    ]
    results = []
    say("  POST /v1/agent/model as deva:")
    for number, (what, data) in enumerate(cases):
        with MemoryWatch(probe.gateway) as memory:
            reply, took = await upload(probe.http, device, data, f"probe-{number}")
        results.append(
            {
                "what": what,
                "bytes": len(data),
                "status": reply.status_code,
                "seconds": round(took, 3),
                "error": error_of(reply) if reply.status_code >= 400 else None,
                "rss_before_mb": round(memory.before_mb, 1),
                "rss_peak_mb": round(memory.peak_mb, 1),
                "rss_hwm_mb": None if memory.hwm_mb is None else round(memory.hwm_mb, 1),
                "rss_growth_mb": round(memory.growth_mb, 1),
                "child_peak_mb": round(memory.children_peak_mb, 1),
            }
        )
        said = f": {error_of(reply)[:160]}" if reply.status_code >= 400 else ""
        say(f"    {what} ({len(data):,} bytes): {reply.status_code} in {took:.2f} s{said}")
        say(f"      {memory.text()}")
    probe.summary["models"] = results

    # Several heavy uploads at once: the sandboxes they start (at most 2 at a time), and how
    # long an ordinary read of another caller takes meanwhile.
    count = probe.sizes.concurrent_heavy
    heavy = heavy_in(legit)
    latencies: list[float] = []
    done = asyncio.Event()

    async def reads() -> None:
        while not done.is_set():
            started = time.perf_counter()
            await probe.http.get("/v1/devices", headers=probe.admin)
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.1)

    reader = asyncio.create_task(reads())
    with MemoryWatch(probe.gateway) as memory:
        started = time.perf_counter()
        answers = await asyncio.gather(
            *(upload(probe.http, device, heavy, f"heavy-{i}") for i in range(count))
        )
        took = time.perf_counter() - started
    done.set()
    await reader
    statuses = Counter(reply.status_code for reply, _ in answers)
    probe.summary["models_concurrent"] = {
        "uploads": count,
        "statuses": dict(statuses),
        "seconds": round(took, 2),
        "rss_growth_mb": round(memory.growth_mb, 1),
        "child_peak_mb": round(memory.children_peak_mb, 1),
        "read_max_s": round(max(latencies, default=0.0), 3),
    }
    say(
        f"    {count} of the 2 GiB model at once: {dict(statuses)} in {took:.2f} s; "
        f"{memory.text()}; GET /v1/devices meanwhile at most {max(latencies, default=0.0):.2f} s"
    )


def relative_to_cwd(pid: int, secret: Path) -> tuple[Path, str, str]:
    """The working directory of process `pid`, and `secret` and a missing file beside it as
    paths relative to it (as the issue's model named home/credentials/join.token)."""
    cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    missing = secret.with_name("missing.token")
    return cwd, os.path.relpath(secret, cwd), os.path.relpath(missing, cwd)


async def probe_external(probe: Probe, legit: bytes) -> None:
    secret = join_token_path(probe.home)
    cwd, location, missing = relative_to_cwd(probe.gateway, secret)
    answers = []
    with open_watch(secret) as watch:
        for number, where in enumerate((location, missing)):
            reply, took = await upload(
                probe.http, probe.devices["deva"], external_in(legit, where), f"external-{number}"
            )
            answers.append((where, reply.status_code, error_of(reply), took))
    opened = watch.opened()
    same = answers[0][1:3] == answers[1][1:3]
    probe.summary["external"] = {
        "gateway_cwd": str(cwd),
        "answers": [
            {"location": w, "status": s, "error": e, "seconds": round(t, 3)}
            for w, s, e, t in answers
        ],
        "identical": same,
        "file_opened": opened,
    }
    say(f"  external data (the gateway's working directory {cwd}):")
    for where, status, error, took in answers:
        say(f"    {where}: {status} in {took:.2f} s: {error}")
    say(
        f"    answers identical for the existing and the missing file: {same}; anything opened "
        f"{secret.name} meanwhile: {opened}"
    )


async def probe_measurements(probe: Probe, fp: dict[str, Any]) -> None:
    sizes = probe.sizes
    say("  measurements (POST /v1/agent/measurements):")
    lies = [measurement("m-512", 512, 1e-6), measurement("m-1024", 1024, 1e-6)]
    answer = await measure(probe, "deva", lies)
    refused = {r["measurement_id"]: r["why"] for r in answer["refused"]}
    for mid in ("m-512", "m-1024"):
        say(
            f"    deva {mid} 1e-6 s: {'refused: ' + refused[mid] if mid in refused else 'ACCEPTED'}"
        )
    # The fastest runtime deva's claimed hardware allows, a little above it: a lie it cannot tell.
    top = peak(fp)
    work = declared_work("gemm", 512)
    assert top is not None and work is not None
    bound = max(work[0] / top.flops, work[1] / top.bytes)
    edge = await measure(probe, "deva", [measurement("m-edge", 512, bound * 1.2)])
    devb = await measure(probe, "devb", [measurement(f"m-{s}", s, r) for s, r in HONEST_S.items()])
    liar = await measure(probe, "liar", [measurement(f"m-{s}", s, 1e-6) for s in HONEST_S])
    say(
        f"    deva {bound * 1.2:.2g} s for 512 (1.2 x its claimed hardware's bound): "
        f"accepted {edge['accepted']}, refused {len(edge['refused'])}"
    )
    say(f"    devb {HONEST_S}: accepted {devb['accepted']}, refused {len(devb['refused'])}")
    say(
        f"    liar (claims {LIAR_CPUS:,} CPUs) 1e-6 s for 512 and 1024: accepted "
        f"{liar['accepted']}, refused {[r['why'] for r in liar['refused']]}"
    )
    probe.summary["measurements"] = {
        "deva_1e-6": answer,
        "deva_edge": {"runtime_s": bound * 1.2, **edge},
        "devb": devb,
        "liar_1e-6": liar,
    }

    say("    gemm tasks before any device ran the job for the fleet:")
    before = await place_tasks(probe, [512] * sizes.tasks_before + [1024])

    # devb runs gemm 512 for the fleet (deva and liar drained meanwhile): its runtime is seen.
    say("    deva and liar drained; devb takes its work:")
    for name in ("deva", "liar"):
        await drain(probe, name, True)
    await until_status(probe, ["deva", "liar"], {"draining"}, 30)
    await place_tasks(probe, [512])
    heartbeat: dict[str, Any] = {}
    verified = await runs_for_fleet(probe, "devb", HONEST_S, heartbeat)
    for name in ("deva", "liar"):
        await drain(probe, name, False)
    await until_status(probe, ["deva", "liar"], {"online", "busy"}, 30)

    ahead = await measure(probe, "deva", [measurement("m-ahead", 512, HONEST_S[512] / 20)])
    liar_after = await measure(probe, "liar", [measurement("m-after", 512, 1e-6)])
    say(
        f"    after devb's verified run: deva {HONEST_S[512] / 20:g} s for 512: "
        f"{ahead['refused'][0]['why'] if ahead['refused'] else 'ACCEPTED'}"
    )
    say(
        f"    liar 1e-6 s for 512 again: "
        f"{liar_after['refused'][0]['why'] if liar_after['refused'] else 'accepted'}"
    )
    say("    gemm tasks after devb's verified run:")
    after = await place_tasks(probe, [512] * sizes.tasks_after)
    # liar's results are its own word too: it reports the 1e-6 s it claimed.
    say("    liar takes its work and reports 1e-6 s:")
    liar_ran = await runs_for_fleet(probe, "liar", dict.fromkeys(HONEST_S, 1e-6))
    liar_row = (await devices_view(probe)).get("liar", {})
    say(f"    liar's device row: off_estimates {liar_row.get('off_estimates')}")
    say("    gemm tasks after liar's own run:")
    last = await place_tasks(probe, [512] * sizes.tasks_after)
    probe.summary["placement"] = {
        "before_verified": before,
        "devb_ran": verified,
        "after_verified": after,
        "liar_ran": liar_ran,
        "liar_off_estimates": liar_row.get("off_estimates"),
        "after_liar_ran": last,
        "deva_20x_ahead": ahead,
        "liar_1e-6_after": liar_after,
    }
    probe.summary["heartbeat"] = heartbeat


async def drain(probe: Probe, name: str, draining: bool) -> None:
    reply = await probe.http.post(
        f"/v1/devices/{name}/drain", json={"draining": draining}, headers=probe.admin
    )
    if reply.status_code != 200:
        raise SystemExit(f"drain {name}: {reply.status_code} {reply.text[:300]}")


async def runs_for_fleet(
    probe: Probe, name: str, runtimes: dict[int, float], heartbeat: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Device `name` takes items until it ran a gemm 512, each reported at `runtimes[size]`.
    With `heartbeat` (filled in): before its first result, deva's heartbeat names the running
    task, and the device's own names it too."""
    device, deva = probe.devices[name], probe.devices["deva"]
    ran: list[dict[str, Any]] = []
    for _ in range(8):
        got = await probe.http.get("/v1/agent/work", params={"wait": 10}, headers=device)
        if got.status_code == 204:
            say(f"      {name} got no (more) work within 10 s")
            break
        if got.status_code != 200:
            raise SystemExit(f"{name} got no work: {got.status_code} {got.text[:300]}")
        item = got.json()
        url = f"/v1/agent/tasks/{item['task_id']}"
        started = await probe.http.post(
            f"{url}/started", json={"attempt": item["attempt"]}, headers=device
        )
        if heartbeat is not None and not heartbeat:
            body = {"running": item["task_id"]}
            other = await probe.http.post("/v1/agent/heartbeat", json=body, headers=deva)
            own = await probe.http.post("/v1/agent/heartbeat", json=body, headers=device)
            heartbeat.update(
                task_id=item["task_id"],
                other_status=other.status_code,
                other_error=error_of(other) if other.status_code >= 400 else None,
                own_status=own.status_code,
            )
            say(
                f"  heartbeat of deva naming {name}'s running task {item['task_id']}: "
                f"{other.status_code} ({heartbeat['other_error']}); {name}'s own: "
                f"{own.status_code}"
            )
        runtime = runtimes.get(int(item["size"]), 1.0)
        body = {
            "attempt": item["attempt"],
            "status": "ok",
            "config": item["config"],
            "runtime_s": runtime,
            "check_ok": True,
            "repeats": 3,
        }
        result = await probe.http.post(f"{url}/result", json=body, headers=device)
        view = (await probe.http.get(f"/v1/tasks/{item['task_id']}", headers=probe.admin)).json()
        flag = (view.get("result") or {}).get("off_estimate")
        ran.append(
            {
                "task_id": item["task_id"],
                "size": item["size"],
                "runtime_s": runtime,
                "started": started.status_code,
                "result": result.status_code,
                "answer": result.json() if result.status_code == 200 else error_of(result),
                "off_estimate": flag,
            }
        )
        say(
            f"      {name} ran {item['task_id']} (gemm {item['size']}), reported {runtime:g} s: "
            f"started {started.status_code}, result {result.status_code}, flagged {flag}"
        )
        if item["size"] == 512 and result.status_code == 200:
            break
    return ran


async def probe_joins(probe: Probe, token: str, fp: dict[str, Any]) -> None:
    """Joins from loopback until the token's uses are spent; then joins with X-Forwarded-For."""
    joined = 3  # deva, devb, liar
    refusal: httpx.Response | None = None
    for number in range(1, 10_001):
        reply = await join(probe.http, token, f"cap-{number}", fp)
        if reply.status_code != 201:
            refusal = reply
            break
        probe.secrets.add(reply.json()["token"])
        joined += 1
    assert refusal is not None
    probe.summary["join_cap"] = {
        "joined": joined,
        "status": refusal.status_code,
        "error": error_of(refusal),
    }
    say(f"  join token: {joined} joins in all, then {refusal.status_code}: {error_of(refusal)}")
    statuses: Counter[int] = Counter()
    first_429: httpx.Response | None = None
    started = time.perf_counter()
    for number in range(probe.sizes.forwarded_joins):
        reply = await join(
            probe.http, token, f"fwd-{number}", fp, headers={"X-Forwarded-For": "203.0.113.7"}
        )
        statuses[reply.status_code] += 1
        if reply.status_code == 429 and first_429 is None:
            first_429 = reply
    took = time.perf_counter() - started
    probe.summary["forwarded_joins"] = {
        "joins": probe.sizes.forwarded_joins,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "seconds": round(took, 2),
        "first_429": None if first_429 is None else error_of(first_429),
        "retry_after": None if first_429 is None else first_429.headers.get("retry-after"),
    }
    say(
        f"  {probe.sizes.forwarded_joins} joins with X-Forwarded-For (relayed, not this machine) "
        f"in {took:.2f} s: {dict(sorted(statuses.items()))}"
        + (
            f"; Retry-After {first_429.headers.get('retry-after')}: {error_of(first_429)}"
            if first_429 is not None
            else ""
        )
    )


async def probe_wrong_tokens(probe: Probe) -> None:
    """N wrong bearer tokens from 4 connections as fast as they go, a valid credential from the
    same address every 50 ms meanwhile."""
    n = probe.sizes.wrong_tokens
    wrong = [new_token() for _ in range(n)]
    probe.summary["_wrong"] = wrong  # for the log scan, left out of the summary
    since = probe.log_size()
    statuses: Counter[int] = Counter()
    valid: Counter[int] = Counter()
    queue = iter(wrong)
    done = asyncio.Event()

    async def attacker(client: httpx.AsyncClient) -> None:
        for token in queue:
            reply = await client.get("/v1/whoami", headers=bearer(token))
            statuses[reply.status_code] += 1

    async def owner() -> None:
        while not done.is_set():
            reply = await probe.http.get("/v1/whoami", headers=probe.admin)
            valid[reply.status_code] += 1
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(owner())
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
    async with httpx.AsyncClient(
        base_url=str(probe.http.base_url), limits=limits, timeout=60
    ) as client:
        flood_began = time.monotonic()
        started = time.perf_counter()
        await asyncio.gather(*(attacker(client) for _ in range(4)))
        took = time.perf_counter() - started
    done.set()
    await watcher
    # How long until the owner's valid credential works again from that address.
    back = time.perf_counter()
    while (await probe.http.get("/v1/whoami", headers=probe.admin)).status_code == 429:
        if time.perf_counter() - back > 120:
            raise SystemExit("the owner's valid token was still refused 120 s after the flood")
        await asyncio.sleep(0.05)
    recovered = time.perf_counter() - back
    await asyncio.sleep(0.5)  # the last lines reach the log
    lines = probe.log_lines(since)
    events = Counter(str(line.get("event")) for line in lines)
    requests = Counter(
        int(line.get("status", 0))
        for line in lines
        if line.get("event") == "request" and line.get("path") == "/v1/whoami"
    )
    probe.summary["wrong_tokens"] = {
        "sent": n,
        "status_401": statuses[401],
        "status_429": statuses[429],
        "other": {str(k): v for k, v in statuses.items() if k not in (401, 429)},
        "requests_per_s": round(n / took, 1),
        "seconds": round(took, 2),
        "auth_rejected_lines": events["auth_rejected"],
        "auth_rejected_more_lines": events["auth_rejected_more"],
        "request_lines_401": requests[401],
        "request_lines_429": requests[429],
        "log_lines": len(lines),
        "valid_meanwhile": {str(k): v for k, v in sorted(valid.items())},
        "valid_back_after_s": round(recovered, 2),
    }
    say(
        f"  {n} wrong bearer tokens (4 connections): {statuses[401]} x 401, {statuses[429]} x 429"
        f"{', other ' + str(dict(statuses)) if set(statuses) - {401, 429} else ''}, "
        f"{n / took:.0f} requests/s; serve logged {events['auth_rejected']} auth_rejected "
        f"line(s), {events['auth_rejected_more']} auth_rejected_more, request lines "
        f"{requests[401]} x 401 / {requests[429]} x 429 ({len(lines)} lines in all)"
    )
    say(
        f"    the owner's valid token from the same address meanwhile: "
        f"{dict(sorted(valid.items()))}; accepted again {recovered:.2f} s after the flood"
    )
    if not probe.sizes.log_window:
        return
    # The flood's count is logged once its minute is over, with the next failure from anywhere.
    await asyncio.sleep(max(0.0, flood_began + 61 - time.monotonic()))
    await probe.http.get("/v1/whoami", headers=bearer(new_token()))
    await asyncio.sleep(0.5)
    counts = [
        int(line.get("count", 0))
        for line in probe.log_lines(since)
        if line.get("event") == "auth_rejected_more"
    ]
    probe.summary["wrong_tokens"]["auth_rejected_more_counts"] = counts
    say(
        f"    a minute after the flood began, one more wrong token: auth_rejected_more lines "
        f"with counts {counts}"
    )


def scan_log(probe: Probe, join_token: str) -> None:
    text = probe.log.read_text(errors="replace")
    wrong = set(probe.summary.pop("_wrong", []))
    found = set(TOKEN.findall(text))
    cli = read_cli_token(probe.home)
    named = {
        "join token": join_token in text,
        "CLI token": cli is not None and cli in text,
        "device tokens": any(s in text for s in probe.secrets),
        "wrong tokens": bool(found & wrong),
        "?token= URL": "?token=" in text,
        "any hds1_ token": bool(found),
    }
    banner = [line.strip() for line in text.splitlines() if line.startswith(("  Log in", "  Join"))]
    probe.summary["log"] = {
        "bytes": len(text),
        "found": named,
        "banner": banner,
        "clean": not any(named.values()),
    }
    say(f"  serve's stdout and stderr ({len(text):,} bytes, not a terminal):")
    for line in banner:
        say(f"    {line}")
    say("    " + ", ".join(f"{k}: {'FOUND' if v else 'absent'}" for k, v in named.items()))


async def run(sizes: Sizes, keep: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="hpcds1-probe-"))
    home = root / "home"
    port = free_port()
    settings = {"HPC_DS1_LOG_LEVEL": "info"}
    if sizes.join_uses is not None:
        settings["HPC_DS1_JOIN_TOKEN_USES"] = str(sizes.join_uses)
    started = time.perf_counter()
    say(f"hpc-ds1 serve on a fresh home {home} (working directory {root}) ...")
    serve = start_serve(home, port, settings, cwd=root)
    url = f"http://127.0.0.1:{port}"
    fp = fingerprint()
    training = asyncio.create_task(asyncio.to_thread(legitimate_model, fp))
    summary: dict[str, Any] = {}
    heartbeats: asyncio.Task[None] | None = None
    try:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            await wait_served(serve, home, url)
            deadline = time.monotonic() + 120
            while (await http.get("/readyz")).status_code != 200:
                if time.monotonic() > deadline:
                    raise SystemExit("serve was not ready within 120 s")
                await asyncio.sleep(0.2)
            probe = Probe(http, home, serve, sizes, summary=summary)
            probe.admin = await _home_credential(http, home)
            probe.gateway = gateway_pid(serve.pid)
            summary["gateway"] = {
                "pid": probe.gateway,
                "name": psutil.Process(probe.gateway).name(),
                "ready_s": round(time.perf_counter() - started, 1),
            }
            say(
                f"  ready after {time.perf_counter() - started:.1f} s; gateway pid "
                f"{probe.gateway} ({summary['gateway']['name']})"
            )
            await probe_forwarded(probe)

            shown = await asyncio.to_thread(token_join, home)
            join_token = str(shown["token"])
            say(
                f"  hpc-ds1 token join --json: {shown.get('uses_left')} of "
                f"{shown.get('max_uses')} uses left, expires {shown.get('expires')}"
            )
            honest = fp.model_dump(mode="json")
            liar = {**honest, "logical_cpus": LIAR_CPUS, "physical_cores": LIAR_CPUS}
            for name, claimed in (("deva", honest), ("devb", honest), ("liar", liar)):
                reply = await join(http, join_token, name, claimed)
                if reply.status_code != 201:
                    raise SystemExit(f"join {name}: {reply.status_code} {reply.text[:300]}")
                probe.devices[name] = bearer(reply.json()["token"])
                probe.secrets.add(reply.json()["token"])
            heartbeats = asyncio.create_task(beat_forever(probe, ["deva", "devb", "liar"]))
            await until_status(probe, ["deva", "devb", "liar"], {"online"}, 60)
            say("  deva, devb and liar joined and online")

            legit = await training
            await probe_models(probe, legit)
            await probe_external(probe, legit)
            await probe_measurements(probe, honest)
            await probe_joins(probe, join_token, honest)
            await probe_wrong_tokens(probe)
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats
    finally:
        if heartbeats is not None:
            heartbeats.cancel()
        if not training.done():
            training.cancel()
        summary["serve_exit"] = stop_serve(serve)
    scan_log(probe, join_token)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    say(f"  serve exited {summary['serve_exit']}; {summary['seconds']:.0f} s in all")
    if keep:
        say(f"  kept {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return summary


def token_join(home: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env["HPC_DS1_HOME"] = str(home)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "hpc-ds1"), "token", "join", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"hpc-ds1 token join --json failed: {done.stderr[-1000:]}")
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def main() -> None:
    global REPORT
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wrong-tokens", type=int, help="wrong bearer tokens sent (2000)")
    parser.add_argument("--quick", action="store_true", help="small counts, for CI")
    parser.add_argument("--json", action="store_true", help="the summary as JSON on stdout")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home")
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    if args.wrong_tokens is not None:
        sizes.wrong_tokens = args.wrong_tokens
    if args.json:
        REPORT = sys.stderr
    summary = asyncio.run(run(sizes, args.keep))
    summary["sizes"] = vars(sizes)
    summary["rss_bound_mb"] = RSS_BOUND_MB
    if args.json:
        print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
