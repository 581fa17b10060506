"""The fleet end to end, with real processes: a coordinator (`hpc-ds1 serve`), three devices in
their own network namespaces that reach it only over HTTP through a veth pair, each with its own
home and a small real setup (one pinned to one CPU). Placement follows their measured runtimes;
`kill -9` of an agent mid-task and a link taken down mid-task get the task finished elsewhere;
wrong, revoked, replayed and borrowed credentials are refused; the join token is in no log and
no event. Over HTTPS with the CA pinned (issue 45): a capture on a device's link holds no token,
an impostor of another CA on the coordinator's address is refused and runs nothing, a new
server certificate keeps the agents working. The tests run in this order and share one fleet
(see conftest.py)."""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from hpc_ds1.infra import tls
from hpc_ds1.infra.ports import free_port, wait_for_port
from hpc_ds1.machine.hardware import fingerprint
from tests.support.waiting import wait_for

from .netns import (
    HPC_DS1,
    LARGE,
    PINNED,
    SIZES,
    SMALL,
    WORKLOAD,
    Device,
    Fleet,
    Netns,
    Proc,
    clean_env,
    free_subnet_base,
    remove_leftovers,
    sh,
    tcp_refused_from,
)

CONFIG_KEYS = ("ranks", "threads", "tile", "gpu")


# --- the harness itself (no fleet needed) --------------------------------------------------


def test_a_namespace_reaches_the_root_side_over_its_veth_and_nothing_else(
    netns_ok: None, tmp_path: Path
) -> None:
    (tmp_path / "hello.txt").write_text("hello from the root namespace")
    open_port, loopback_port = free_port(), free_port()
    servers = [
        subprocess.Popen(
            [sys.executable, "-m", "http.server", "--bind", bind, str(port)],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for bind, port in (("0.0.0.0", open_port), ("127.0.0.1", loopback_port))
    ]
    space = Netns.numbered("z", free_subnet_base(), 0)
    fetch = (
        "import sys,urllib.request\n"
        "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())\n"
    )
    try:
        for port in (open_port, loopback_port):
            wait_for_port("127.0.0.1", port, 10)
        space.create()
        url = f"http://{space.root_ip}:{open_port}/hello.txt"
        got = subprocess.run(
            space.exec_argv(sys.executable, "-c", fetch, url),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert got.stdout.strip() == "hello from the root namespace", got.stderr
        # A server on the root namespace's loopback is out of reach, and the namespace's own
        # loopback is not the root one's.
        assert tcp_refused_from(space.name, space.root_ip, loopback_port)
        assert tcp_refused_from(space.name, "127.0.0.1", open_port)
        assert not tcp_refused_from(space.name, space.root_ip, open_port)
        space.cut()
        assert tcp_refused_from(space.name, space.root_ip, open_port)
        space.restore()
        wait_for(
            "the link back up",
            lambda: not tcp_refused_from(space.name, space.root_ip, open_port),
            15,
            every_s=0.2,
        )
    finally:
        for server in servers:
            server.kill()
            server.wait()
        space.destroy()
    assert not space.exists()


def test_namespaces_left_by_a_run_that_died_are_removed(netns_ok: None) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert not psutil.pid_exists(dead.pid)
    space = Netns.numbered("q", free_subnet_base(), 0)
    space.name = f"hds1-{dead.pid}-q"
    space.root_link, space.ns_link = f"hr{dead.pid}q", f"hn{dead.pid}q"
    try:
        space.create()
        assert space.exists()
        assert space.name in remove_leftovers()
        assert not space.exists()
    finally:
        space.destroy()


# --- helpers ---------------------------------------------------------------------------------


def best_measured(fleet: Fleet, device_id: str, size: int) -> tuple[float, dict[str, Any]]:
    """A device's best measured (runtime, config) for (WORKLOAD, size): its ok runs whose check
    did not fail, as recorded in the coordinator's log."""
    rows = [
        e["data"]
        for e in fleet.api.events("measurement.recorded")
        if e["data"]["device_id"] == device_id
        and e["data"]["workload"] == WORKLOAD
        and e["data"]["size"] == size
        and e["data"]["status"] == "ok"
        and e["data"].get("check_ok") is not False
        and e["data"].get("runtime_s") is not None
    ]
    assert rows, f"{device_id} has no measured run of {WORKLOAD} {size}"
    best = min(rows, key=lambda r: r["runtime_s"])
    return float(best["runtime_s"]), best["config"]


def same_config(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in CONFIG_KEYS)


def ranked(placement: dict[str, Any]) -> list[dict[str, Any]]:
    """The candidates with an estimate, earliest expected finish first."""
    with_estimate = [c for c in placement["candidates"] if c["finish_s"] is not None]
    accepted = [c for c in with_estimate if c["accepted"]] or with_estimate
    return sorted(accepted, key=lambda c: c["finish_s"])


# --- the fleet ---------------------------------------------------------------------------------


def test_the_three_devices_are_online_with_their_measured_kernels(fleet: Fleet) -> None:
    listed = fleet.api.devices()
    runs = {d["device_id"]: 0 for d in listed.values()}
    for event in fleet.api.events("measurement.recorded"):
        runs[event["data"]["device_id"]] = runs.get(event["data"]["device_id"], 0) + 1
    for device in fleet.devices.values():
        entry = listed[device.device_id]
        assert entry["status"] == "online", entry
        assert entry["local"] is False
        assert entry["working_on"] is None
        kernels = {m["workload"]: m for m in entry["measured"]}
        # Every run its setup measured came over, under this device's identity.
        measured = fleet.setup_runs(device)
        synced = device.log_lines("home_synced")
        assert WORKLOAD in kernels, (
            f"{device.name} lists no {WORKLOAD} measurement; its setup measured {measured} "
            f"runs; its agent says: {synced}"
        )
        assert sorted(kernels[WORKLOAD]["sizes"]) == sorted(SIZES), entry["measured"]
        assert kernels[WORKLOAD]["runs"] == measured == runs[device.device_id], (entry, synced)
        assert kernels[WORKLOAD]["correct_runs"] <= measured
        assert entry["hardware"]["cores"] >= 1
    if fleet.local_device is not None:
        assert listed[fleet.local_device]["local"] is True
        assert listed[fleet.local_device]["status"] == "draining"
    # The devices reach the coordinator over HTTP only: its NATS and Postgres listen on its
    # loopback, out of every namespace's reach (while HTTP to the same address works).
    for device in fleet.devices.values():
        root_ip = device.netns.root_ip
        assert tcp_refused_from(device.netns.name, root_ip, fleet.nats_port)
        assert tcp_refused_from(device.netns.name, root_ip, fleet.postgres_port)
        assert not tcp_refused_from(device.netns.name, root_ip, fleet.port)


# --- TLS on the path (issue 45): run before the placement tests, at a size no setup measured,
# so the tasks here verify no estimate those tests compare --------------------------------------

TLS_SIZE = 2 * SMALL  # measured by no device: its tasks leave the compared sizes alone
CLIENT_HELLO = re.compile(rb"\x16\x03[\x01-\x04]..\x01", re.S)  # a TLS record: handshake, hello


def run_on(fleet: Fleet, device: Device, size: int = TLS_SIZE) -> dict[str, Any]:
    """A task run on `device` (every other remote device draining meanwhile), finished."""
    others = fleet.remote_ids() - {device.device_id}
    fleet.set_draining(others, True)
    try:
        task = fleet.api.submit(WORKLOAD, size)
        done = fleet.api.wait_task(
            task["task_id"], lambda t: t["status"] in ("finished", "failed"), 90, "finished"
        )
    finally:
        fleet.set_draining(others, False)
    assert done["status"] == "finished", done
    assert done["result"]["device_id"] == device.device_id, done
    return done


def test_nothing_on_the_path_reads_a_token_while_a_device_joins_and_works(fleet: Fleet) -> None:
    """tcpdump on device a's link from before its agent joined: the join, its uploads, its
    polls and a task run there cross it as TLS only. The control: a datagram with a marker sent
    over the same link is found in the same capture, so the search does find plain bytes."""
    if fleet.capture is None:
        pytest.skip("tcpdump is not installed (deploy/install-tcpdump.sh, run by make install)")
    device = fleet.devices["a"]
    done = run_on(fleet, device)
    marker = f"plain-marker-{secrets.token_hex(8)}"
    send = (
        "import socket,sys\n"
        "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(sys.argv[1].encode(), "
        f"({device.netns.root_ip!r}, 9))\n"
    )
    subprocess.run(
        device.netns.exec_argv(sys.executable, "-c", send, marker), check=True, timeout=20
    )
    # The control: plain bytes on this link are readable in the capture (waited for: tcpdump
    # writes each packet as it reads it, and on a loaded machine it reads late).
    pcap = fleet.capture.path
    wait_for("the marker in the capture", lambda: marker.encode() in pcap.read_bytes(), 20)
    captured = fleet.capture.stop()
    assert len(captured) > 10_000, f"the capture holds {len(captured)} bytes"
    assert marker.encode() in captured
    assert CLIENT_HELLO.search(captured), "no TLS ClientHello in the capture"
    secrets_on_path = {
        "the join token": fleet.join_token,
        "the device credential": device.identity()["token"],  # type: ignore[index]
        "the admin token": fleet.api.token,
    }
    for what, secret in secrets_on_path.items():
        assert secret.encode() not in captured, f"{what} is readable on the path"
    for plain in (b"Bearer ", b"/v1/fleet/join", b"/v1/agent/", b"HTTP/1.1"):
        assert plain not in captured, f"{plain!r} is readable on the path"
    print(f"\ncapture of {device.name}'s link: {len(captured)} bytes, task {done['task_id']}")


def test_an_impostor_on_the_coordinators_address_is_refused_and_nothing_runs(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A server in a namespace of its own, with a certificate of another CA for the
    coordinator's address, takes device a's route to that address: a device joining through
    it stops at the join naming both pins; a's running agent refuses every call (nothing sent,
    it goes offline, a task waiting for it does not run); with the route back it works on."""
    device = fleet.devices["a"]
    space = device.netns
    pid = os.getpid()
    ns, to_impostor, impostor_end = f"hds1-{pid}-i", f"hv{pid}a", f"hw{pid}a"
    _, impostor_pin = tls.ensure_server_cert(tmp_path / "impostor", [space.root_ip])
    cert = tls.HomeTLS.of(tmp_path / "impostor")
    log = tmp_path / "impostor.jsonl"
    others = fleet.remote_ids() - {device.device_id}
    impostor: Proc | None = None
    task_id = ""
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", to_impostor, "type", "veth", "peer", "name", impostor_end)
        sh("ip", "link", "set", to_impostor, "netns", space.name)
        sh("ip", "link", "set", impostor_end, "netns", ns)
        sh("ip", "-n", ns, "addr", "add", f"{space.root_ip}/32", "dev", impostor_end)
        sh("ip", "-n", ns, "link", "set", impostor_end, "up")
        sh("ip", "-n", ns, "route", "add", f"{space.ns_ip}/32", "dev", impostor_end)
        sh("ip", "-n", space.name, "link", "set", to_impostor, "up")
        script = str(Path(__file__).with_name("impostor.py"))
        argv = [sys.executable, script, str(cert.cert), str(cert.key), space.root_ip]
        impostor = Proc(
            ["ip", "netns", "exec", ns, *argv, str(fleet.port), str(log)],
            dict(os.environ),
            tmp_path / "impostor.out",
            tmp_path / "impostor.err",
        )
        wait_for("the impostor", lambda: log.exists() and "listening" in log.read_text(), 20)
        # The route to the coordinator's address now leads to the impostor.
        sh("ip", "-n", space.name, "route", "add", f"{space.root_ip}/32", "dev", to_impostor)

        joining = subprocess.run(
            space.exec_argv(
                HPC_DS1, "agent", "--server", fleet.server_for(device), "--token",
                fleet.join_token, "--ca-cert-hash", fleet.pin, "--name", "netns-impostor",
            ),
            env=clean_env(tmp_path / "joiner"),
            capture_output=True,
            text=True,
            timeout=90,
        )  # fmt: skip
        assert joining.returncode == 1, joining.stdout + joining.stderr
        assert f"expected {fleet.pin}" in joining.stderr and impostor_pin in joining.stderr
        assert fleet.join_token not in joining.stdout + joining.stderr

        refusals = wait_for(
            f"{device.name} refusing", lambda: device.log_lines("coordinator_untrusted"), 30
        )
        assert fleet.pin in refusals[0] and impostor_pin in refusals[0], refusals[0]
        fleet.set_draining(others, True)
        task_id = fleet.api.submit(WORKLOAD, TLS_SIZE)["task_id"]
        wait_for(
            f"{device.name} offline behind the impostor",
            lambda: fleet.api.devices()[device.device_id]["status"] == "offline",
            20,
        )
        time.sleep(1.0)
        assert fleet.api.task(task_id)["status"] not in ("running", "finished")
        assert fleet.events_of("task.started", task_id) == []
    finally:
        subprocess.run(
            ["ip", "-n", space.name, "route", "del", f"{space.root_ip}/32"], capture_output=True
        )
        if impostor is not None:
            impostor.stop(timeout=5)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # its veth end too
        if task_id == "":
            fleet.set_draining(others, False)
    try:
        fleet.wait_online({device.device_id}, within_s=60)
        done = fleet.api.wait_task(
            task_id, lambda t: t["status"] in ("finished", "failed"), 90, "finished"
        )
    finally:
        fleet.set_draining(others, False)
    assert done["status"] == "finished" and done["result"]["device_id"] == device.device_id
    seen = [json.loads(line) for line in log.read_text().splitlines()[1:]]
    assert seen, "the impostor saw no connection"
    leaked = [entry for entry in seen if entry.get("received")]
    assert leaked == [], f"bytes sent to the impostor: {leaked}"
    assert "netns-impostor" not in {d.get("name") for d in fleet.api.devices().values()}


def test_a_new_server_certificate_from_the_same_ca_keeps_the_agents_working(
    fleet: Fleet,
) -> None:
    device = fleet.devices["b"]
    server = fleet.server_for(device)
    home = fleet.root / "coordinator"
    before = tls.presented_chain(server)[0].serial_number
    renewed = subprocess.run(
        [sys.executable, "-m", "hpc_ds1.infra.tls", "renew", str(home)],
        env=clean_env(home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert renewed.returncode == 0, renewed.stderr
    assert fleet.pin in renewed.stdout and tls.home_pin(home) == fleet.pin
    wait_for(
        "the gateway serving the new certificate",
        lambda: tls.presented_chain(server)[0].serial_number != before,
        15,
    )
    # b's agent restarted: every connection it makes now meets the new certificate.
    assert device.agent is not None
    device.agent.stop(timeout=20)
    fleet.start_agent(device)
    fleet.wait_online(fleet.remote_ids())
    done = run_on(fleet, device)
    print(f"\nrotated: serial {before:x} -> {tls.presented_chain(server)[0].serial_number:x}; "
          f"task {done['task_id']} on {device.name}")  # fmt: skip
    fleet.wait_online(fleet.remote_ids())


def test_the_pinned_device_measured_its_multi_worker_runs_on_one_cpu(fleet: Fleet) -> None:
    """Not a speed assertion (the machine is shared): what each device measured, as figures,
    and that the pinned device's agent and its jobs really are confined to CPU 0."""
    pinned = fleet.devices[PINNED]
    assert pinned.agent is not None
    assert psutil.Process(pinned.agent.pid).cpu_affinity() == [0]
    for device in fleet.devices.values():
        if device is not pinned and device.agent is not None:
            assert len(psutil.Process(device.agent.pid).cpu_affinity()) == psutil.cpu_count()
    lines = []
    for device in fleet.devices.values():
        rows = [
            e["data"]
            for e in fleet.api.events("measurement.recorded")
            if e["data"]["device_id"] == device.device_id
            and e["data"]["size"] == LARGE
            and e["data"]["status"] == "ok"
        ]
        single = [
            r["runtime_s"] for r in rows if r["config"]["ranks"] * r["config"]["threads"] == 1
        ]
        multi = [r["runtime_s"] for r in rows if r["config"]["ranks"] * r["config"]["threads"] > 1]
        assert single and multi, device.name
        lines.append(
            f"{device.name}{' (pinned)' if device.pinned else ''}: best 1 worker "
            f"{min(single):.4f} s, best >1 workers {min(multi):.4f} s"
        )
    print(f"\nmeasured at {LARGE}: " + "; ".join(lines))


def test_a_task_goes_to_the_device_expected_to_finish_it_first(fleet: Fleet) -> None:
    bests = {d: best_measured(fleet, d, LARGE) for d in fleet.remote_ids()}
    task = fleet.api.submit(WORKLOAD, LARGE)
    assert task["status"] in ("submitted", "placed", "running", "finished")
    done = fleet.api.wait_task(
        task["task_id"], lambda t: t["status"] in ("finished", "failed"), 60, "finished"
    )
    assert done["status"] == "finished", done
    placement = done["placement"]
    order = ranked(placement)
    chosen, runner_up = order[0], order[1]
    assert placement["device_id"] == chosen["device_id"]
    assert placement["device_id"] in fleet.remote_ids()
    assert placement["basis"] == "measured"
    # Each remote device's candidate is its own best measured runtime (its queue is empty).
    candidates = {c["device_id"]: c for c in placement["candidates"]}
    for device_id, (runtime, config) in bests.items():
        candidate = candidates[device_id]
        assert candidate["basis"] == "measured"
        assert candidate["runtime_s"] == pytest.approx(runtime, rel=1e-6)
        assert same_config(candidate["config"], config)
        assert candidate["finish_s"] == pytest.approx(candidate["queue_s"] + runtime, abs=1e-6)
    # The task runs with the chosen device's best measured configuration.
    assert same_config(placement["config"], bests[placement["device_id"]][1])
    assert placement["expected_s"] == pytest.approx(bests[placement["device_id"]][0], rel=1e-6)
    # The reason names the chosen device, its numbers and the runner-up.
    reason = placement["reason"]
    assert placement["device_id"] in reason and runner_up["device_id"] in reason, reason
    assert placement["runner_up"] is not None and runner_up["device_id"] in placement["runner_up"]
    numbers = [float(n) for n in re.findall(r"\d+(?:\.\d+)?", reason)]
    for figure in (chosen["runtime_s"], chosen["finish_s"], runner_up["finish_s"]):
        assert any(abs(n - figure) <= 0.06 * figure + 0.006 for n in numbers), (figure, reason)
    # The result: on the chosen device, with that configuration, measured for real.
    result = done["result"]
    assert result["device_id"] == placement["device_id"]
    assert same_config(result["config"], placement["config"])
    assert result["runtime_s"] > 0
    pinned = fleet.devices[PINNED].device_id
    print(
        "\nbest measured at "
        + f"{LARGE}: "
        + ", ".join(
            f"{d}{' (pinned)' if d == pinned else ''} {r:.4f} s "
            f"(ranks={c.get('ranks')} threads={c.get('threads')})"
            for d, (r, c) in sorted(bests.items(), key=lambda x: x[1][0])
        )
        + f"; reason: {reason}"
    )


def test_a_burst_spreads_over_the_devices_as_their_queues_grow(fleet: Fleet) -> None:
    runtimes = sorted(best_measured(fleet, d, SMALL)[0] for d in fleet.remote_ids())
    fastest, second = runtimes[0], runtimes[1]
    # Enough tasks that the fastest device's queue outgrows the gap to the second.
    count = min(16, max(4, math.ceil((second - fastest) / fastest) + 3))
    with ThreadPoolExecutor(count) as pool:
        tasks = list(pool.map(lambda _: fleet.api.submit(WORKLOAD, SMALL), range(count)))
    done = [
        fleet.api.wait_task(
            t["task_id"], lambda t: t["status"] in ("finished", "failed"), 120, "finished"
        )
        for t in tasks
    ]
    assert [t["status"] for t in done] == ["finished"] * count, done
    first_placements = []
    for task in done:
        placement = task["placement"]
        assert placement["device_id"] == ranked(placement)[0]["device_id"], placement
        assert task["result"]["device_id"] == placement["device_id"]
        first_placements.append(placement)
    used = {p["device_id"] for p in first_placements}
    queued = [c for p in first_placements for c in p["candidates"] if c["queue_s"] > 0]
    assert queued, "no placement of the burst counted a queue"
    assert len(used) >= 2, (
        f"{count} tasks all went to {used}: best runtimes {runtimes}; "
        f"queues {[(c['device_id'], c['queue_s']) for c in queued]}"
    )
    print(f"\nburst of {count} at {SMALL}: {sorted(p['device_id'] for p in first_placements)}")


def test_submit_from_another_host_waits_and_prints_the_result(fleet: Fleet) -> None:
    device = fleet.devices["a"]
    server = fleet.server_for(device)
    argv = [HPC_DS1, "submit", "--server", server, "--token", fleet.api.token]
    argv += ["--ca-cert-hash", fleet.pin, "--workload", WORKLOAD, "--size", str(SMALL), "--json"]
    done = subprocess.run(
        device.netns.exec_argv(*argv),
        env=clean_env(device.home.parent / "submitter"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    task = json.loads(done.stdout)
    assert task["status"] == "finished", task
    assert task["result"]["device_id"] in fleet.remote_ids()
    assert task["placement"]["reason"]
    assert fleet.api.token not in done.stderr


def test_kill_9_of_the_agent_running_a_task_gets_it_finished_elsewhere(fleet: Fleet) -> None:
    task = fleet.api.submit(WORKLOAD, LARGE)
    victim, held = fleet.hold_running(task["task_id"])
    identity = victim.identity()
    assert victim.agent is not None
    victim.agent.kill9()
    killed = time.monotonic()
    done = fleet.api.wait_task(
        task["task_id"], lambda t: t["status"] in ("finished", "failed"), 60, "finished elsewhere"
    )
    took = time.monotonic() - killed
    assert done["status"] == "finished", done
    assert done["result"]["device_id"] != victim.device_id
    assert done["result"]["device_id"] in fleet.remote_ids()
    assert done["attempt"] >= 2
    assert fleet.requeued_because_offline(task["task_id"], victim.device_id), fleet.events_of(
        "task.requeued", task["task_id"]
    )
    offline = [
        e["data"]
        for e in fleet.api.events("device.status_changed")
        if e["data"]["device_id"] == victim.device_id and e["data"]["status"] == "offline"
    ]
    assert offline, "no offline status for the killed device"
    # Nothing of the killed device's job is left running.
    assert not [p for p in held if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    print(f"\nkill -9 of {victim.name}: finished elsewhere {took:.1f} s later")

    # The agent restarted keeps its identity: no second join, back online.
    tokens_before = len(fleet.api.events("token.created"))
    fleet.start_agent(victim)
    fleet.wait_online({victim.device_id})
    assert victim.identity() == identity
    assert len(fleet.api.events("token.created")) == tokens_before


def test_a_link_taken_down_mid_task_gets_it_finished_elsewhere(fleet: Fleet) -> None:
    fleet.wait_online(fleet.remote_ids())
    task = fleet.api.submit(WORKLOAD, LARGE)
    victim, held = fleet.hold_running(task["task_id"])
    victim.netns.cut()
    cut = time.monotonic()
    try:
        for proc in held:
            proc.resume()  # the job runs to its end; its result cannot get out
        done = fleet.api.wait_task(
            task["task_id"],
            lambda t: t["status"] in ("finished", "failed"),
            60,
            "finished elsewhere",
        )
        took = time.monotonic() - cut
        assert done["status"] == "finished", done
        assert done["result"]["device_id"] not in (victim.device_id, None)
        assert fleet.requeued_because_offline(task["task_id"], victim.device_id)
        assert victim.agent is not None and victim.agent.alive()
    finally:
        victim.netns.restore()
    # The link back: the device comes back online and its late result is not the task's.
    fleet.wait_online({victim.device_id})
    wait_for(
        f"{victim.name} idle again",
        lambda: fleet.api.devices()[victim.device_id]["working_on"] is None,
        30,
    )
    time.sleep(2.0)  # its agent's last post of the stale result, if any, has been answered
    again = fleet.api.task(task["task_id"])
    assert again["result"] == done["result"]
    finished = fleet.events_of("task.finished", task["task_id"])
    assert len(finished) == 1 and finished[0]["device_id"] == done["result"]["device_id"]
    print(f"\nlink of {victim.name} down: finished elsewhere {took:.1f} s later")


def test_a_wrong_token_is_refused(fleet: Fleet) -> None:
    wrong = secrets.token_urlsafe(32)
    body = {"hostname": "intruder", "fingerprint": fingerprint().model_dump(mode="json")}
    assert fleet.api.call("POST", "/v1/fleet/join", token=wrong, json=body).status_code == 401
    assert fleet.api.call("GET", "/v1/agent/work?wait=0", token=wrong).status_code == 401
    assert fleet.api.call("POST", "/v1/agent/heartbeat", token=wrong, json={}).status_code == 401
    # A device's credential is not a join token, and the join token is no device credential.
    device_token = fleet.devices["a"].identity()["token"]  # type: ignore[index]
    joined = fleet.api.call("POST", "/v1/fleet/join", token=device_token, json=body)
    assert joined.status_code in (401, 403)
    polled = fleet.api.call("GET", "/v1/agent/work?wait=0", token=fleet.join_token)
    assert polled.status_code in (401, 403)


def test_a_replayed_join_of_a_taken_name_is_refused(fleet: Fleet) -> None:
    taken = fleet.devices["a"].device_id
    before = len(fleet.api.events("token.created")), len(fleet.api.events("device.registered"))
    body = {
        "hostname": "elsewhere",
        "fingerprint": fingerprint().model_dump(mode="json"),
        "name": taken,
    }
    replay = fleet.api.call("POST", "/v1/fleet/join", token=fleet.join_token, json=body)
    assert replay.status_code == 409, replay.text
    assert taken in replay.text
    after = len(fleet.api.events("token.created")), len(fleet.api.events("device.registered"))
    assert after == before


def test_a_device_cannot_post_for_another_devices_task(fleet: Fleet) -> None:
    fleet.wait_online(fleet.remote_ids())
    task = fleet.api.submit(WORKLOAD, LARGE)
    owner, held = fleet.hold_running(task["task_id"])
    other = next(d for d in fleet.devices.values() if d.device_id != owner.device_id)
    other_token = other.identity()["token"]  # type: ignore[index]
    attempt = fleet.api.task(task["task_id"])["attempt"]
    measured_before = len(fleet.api.events("measurement.recorded"))
    try:
        started = fleet.api.call(
            "POST",
            f"/v1/agent/tasks/{task['task_id']}/started",
            token=other_token,
            json={"attempt": attempt},
        )
        assert started.status_code in (403, 409), started.text
        result = fleet.api.call(
            "POST",
            f"/v1/agent/tasks/{task['task_id']}/result",
            token=other_token,
            json={
                "attempt": attempt,
                "status": "ok",
                "config": {"ranks": 1, "threads": 1, "tile": 4096, "gpu": False},
                "runtime_s": 0.001,
                "repeats": 1,
                "check_ok": True,
            },
        )
        assert result.status_code in (403, 409), result.text
        now = fleet.api.task(task["task_id"])
        assert now["status"] == "running" and now["result"] is None
        assert now["placement"]["device_id"] == owner.device_id
        assert len(fleet.api.events("measurement.recorded")) == measured_before
    finally:
        for proc in held:
            proc.resume()
    done = fleet.api.wait_task(
        task["task_id"], lambda t: t["status"] in ("finished", "failed"), 60, "finished"
    )
    assert done["status"] == "finished"
    assert done["result"]["device_id"] == owner.device_id
    assert done["result"]["runtime_s"] != 0.001
    for kind in ("task.started", "task.finished"):
        assert {e["device_id"] for e in fleet.events_of(kind, task["task_id"])} == {owner.device_id}


def test_a_revoked_device_credential_is_refused(fleet: Fleet) -> None:
    device = fleet.devices[PINNED]
    token = device.identity()["token"]  # type: ignore[index]
    assert fleet.api.call("POST", "/v1/agent/heartbeat", token=token, json={}).status_code == 204
    fleet.api.ok("POST", f"/v1/devices/{device.device_id}/revoke")
    wait_for(
        "the revoked credential refused",
        lambda: (
            fleet.api.call("POST", "/v1/agent/heartbeat", token=token, json={}).status_code == 401
        ),
        15,
    )
    assert fleet.api.call("GET", "/v1/agent/work?wait=0", token=token).status_code == 401
    # Its agent is told so and stops; the device is listed as left.
    assert device.agent is not None
    wait_for(f"{device.name}'s agent ends", lambda: not device.agent.alive(), 30)  # type: ignore[union-attr]
    assert device.agent.popen.returncode != 0
    assert fleet.api.devices()[device.device_id]["status"] == "left"


def test_the_join_token_is_in_no_log_and_no_event(fleet: Fleet) -> None:
    join = fleet.join_token.encode()
    serve_out = fleet.serve.out.read_bytes()
    # serve's output here is a file, not a terminal: it says how to get the token instead
    assert join not in serve_out
    assert b"hpc-ds1 token join" in serve_out
    own_file = fleet.root / "coordinator" / "credentials" / "join.token"
    files = fleet.written()
    assert len(files) > 50  # the logs, the homes' stores and databases, the audit files
    leaks = [
        str(p) for p, data in files.items() if p not in (fleet.serve.out, own_file) and join in data
    ]
    assert leaks == []
    events = json.dumps(fleet.api.events())
    assert fleet.join_token not in events
    # Nor is any device's credential anywhere but in that device's own device.json.
    for device in fleet.devices.values():
        token = device.identity()["token"].encode()  # type: ignore[index]
        mine = device.home / "credentials" / "device.json"
        leaks = [str(p) for p, data in files.items() if p != mine and token in data]
        assert leaks == [], device.name
        assert token.decode() not in events
