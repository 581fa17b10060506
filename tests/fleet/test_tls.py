"""TLS off loopback and the CA pin (issue 45), with real certificates and real TLS: the home's CA
and server certificate, the pin as kubeadm and openssl compute it, a real uvicorn server with
the gateway's TLS protocol (plain on loopback, TLS on the machine's own address), clients that
trust the pinned CA alone or the system store, an impostor of another CA refused with both pins
named, rotation seen by new connections, a site certificate through SSL_CERT_FILE, the device
credential keeping the pin. No server here is the gateway: a small ASGI app records what
reached it (so "nothing was sent" is checked, not assumed)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import uvicorn
from cryptography import x509

from hpc_ds1.fleet.agent import Agent
from hpc_ds1.fleet.client import (
    FleetClient,
    Identity,
    Unreachable,
    UntrustedServer,
    ca_file,
    load_identity,
    pinned_trust,
    resolve_trust,
    save_identity,
)
from hpc_ds1.infra import tls
from hpc_ds1.infra.ports import free_port, wait_for_port
from hpc_ds1.security.credentials import CredentialError, join_command, reachable_host
from tests.support.commands import HPC_DS1

TOKEN = "hds1_" + "t" * 40


def own_address() -> str | None:
    """This machine's address on its default route (not loopback), or None."""
    found = reachable_host("0.0.0.0")
    try:
        socket.inet_aton(found)
    except OSError:
        return None
    return None if found.startswith("127.") else found


ADDRESS = own_address()
needs_address = pytest.mark.skipif(ADDRESS is None, reason="no non-loopback IPv4 address here")


@dataclass
class Seen:
    """What reached the application: (scheme, method, path, authorization) per request."""

    requests: list[tuple[str, str, str, str]] = field(default_factory=list)


def recording_app(seen: Seen) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"").decode()
        seen.requests.append((scope["scheme"], scope["method"], scope["path"], auth))
        body = {"scheme": scope["scheme"]}
        if scope["path"] == "/v1/tasks" and scope["method"] == "POST":
            body = {"task_id": "task-1", "status": "submitted", "placement": None}
        data = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 201 if scope["method"] == "POST" else 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": data})

    return app


@dataclass
class Server:
    port: int
    seen: Seen
    server: uvicorn.Server
    thread: threading.Thread

    def url(self, host: str | None = None, scheme: str = "https") -> str:
        return f"{scheme}://{host or ADDRESS}:{self.port}"


@contextlib.contextmanager
def serving(cert: Path, key: Path) -> Iterator[Server]:
    """A real uvicorn on 0.0.0.0 with the gateway's TLS options for (cert, key)."""
    seen = Seen()
    port = free_port()
    settings = SimpleNamespace(tls_cert=cert, tls_key=key, tls="auto")
    config = uvicorn.Config(
        recording_app(seen),
        host="0.0.0.0",
        port=port,
        log_config=None,
        access_log=False,
        loop="asyncio",
        **tls.uvicorn_options(settings),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_port("127.0.0.1", port, 15)
    try:
        yield Server(port, seen, server, thread)
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def coordinator(home: Path) -> Iterator[tuple[Server, str]]:
    paths, pin = tls.ensure_server_cert(home, tls.local_names("0.0.0.0"))
    with serving(paths.cert, paths.key) as server:
        yield server, pin


# --- the CA, the certificate, the pin ------------------------------------------------------------


def test_the_home_ca_and_server_certificate_are_made_once_private_and_chained(home: Path) -> None:
    names = ["127.0.0.1", "10.9.8.7", "coordinator.example", "localhost"]
    paths, pin = tls.ensure_server_cert(home, names)
    for path in (paths.ca_cert, paths.ca_key, paths.cert, paths.key):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(paths.folder.stat().st_mode) == 0o700
    ca = tls.load_certificates(paths.ca_cert.read_bytes())[0]
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length == 0
    leaf, served_ca = tls.load_certificates(paths.cert.read_bytes())
    assert served_ca == ca  # the chain served carries the CA: what a joining agent reads
    leaf.verify_directly_issued_by(ca)
    assert tls.covered(leaf, names) == []
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert pin == tls.spki_pin(ca) == tls.home_pin(home)
    # Again: nothing new. A new address: a new server certificate from the same CA.
    assert tls.ensure_server_cert(home, names) == (paths, pin)
    assert tls.load_certificates(paths.cert.read_bytes())[0] == leaf
    _, again = tls.ensure_server_cert(home, [*names, "192.0.2.77"])
    renewed = tls.load_certificates(paths.cert.read_bytes())[0]
    assert again == pin and renewed.serial_number != leaf.serial_number
    assert tls.covered(renewed, ["192.0.2.77"]) == []


def test_the_pin_is_the_sha256_of_the_ca_spki_as_kubeadm_documents_it(home: Path) -> None:
    """kubeadm's recipe: openssl x509 -pubkey | openssl pkey -pubin -outform der | sha256."""
    tls.ensure_ca(home)
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl binary to cross-check with")
    pubkey = subprocess.run(
        [openssl, "x509", "-pubkey", "-noout", "-in", str(tls.HomeTLS.of(home).ca_cert)],
        capture_output=True,
        check=True,
    ).stdout
    der = subprocess.run(
        [openssl, "pkey", "-pubin", "-outform", "der"],
        input=pubkey,
        capture_output=True,
        check=True,
    ).stdout
    assert tls.home_pin(home) == "sha256:" + hashlib.sha256(der).hexdigest()


def test_a_pin_that_is_not_one_is_refused_saying_the_form(home: Path) -> None:
    good = "sha256:" + "ab" * 32
    assert tls.parse_pin(good.upper().replace("SHA256", "sha256")) == good
    for bad, said in (
        ("ab" * 32, "is not a CA pin: use sha256:<64 hex digits>"),
        ("sha256:abc", "64 hex digits, not 3 characters"),
        ("sha1:" + "ab" * 20, "is not a CA pin"),
        ("sha256:" + "zz" * 32, "64 hex digits"),
    ):
        with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
            tls.parse_pin(bad)
    with pytest.raises(ValueError, match="needs an https:// server"):
        Agent("http://coordinator:8765", TOKEN, home=home, ca_pin=good)
    assert join_command("https://h:1", TOKEN, good).endswith(
        f"--token {TOKEN} --ca-cert-hash {good}"
    )


def test_a_site_key_others_can_read_is_refused(home: Path) -> None:
    paths, _ = tls.ensure_server_cert(home, ["127.0.0.1"])
    paths.key.chmod(0o644)
    with pytest.raises(tls.TLSError, match="readable by others"):
        tls.ServerCertificate(paths.cert, paths.key)
    paths.key.chmod(0o600)
    with pytest.raises(tls.TLSError, match="not a certificate"):
        tls.ServerCertificate(paths.ca_cert, paths.key)  # the CA's certificate, the server's key


# --- a real server: loopback plain, the machine's address TLS -----------------------------


@needs_address
def test_loopback_stays_plain_and_the_address_serves_tls_to_the_pinned_ca_only(
    coordinator: tuple[Server, str],
) -> None:
    server, pin = coordinator
    assert httpx.get(server.url("127.0.0.1", "http")).json() == {"scheme": "http"}
    trust = pinned_trust(server.url(), pin)
    assert trust.pin == pin and tls.spki_pin(tls.load_certificates(trust.ca_pem or "")[0]) == pin
    with FleetClient(server.url(), TOKEN, trust=trust) as client:
        assert client.submit("gemm", 64)["task_id"] == "task-1"
    assert server.seen.requests[-1] == ("https", "POST", "/v1/tasks", f"Bearer {TOKEN}")
    # Plain HTTP to the machine's address gets no answer, and says what to try.
    with (
        pytest.raises(Unreachable, match="does it serve HTTPS"),
        FleetClient(server.url(scheme="http"), TOKEN) as plain,
    ):
        plain.submit("gemm", 64)
    # The system trust store does not know the home's CA: refused before anything is sent.
    before = len(server.seen.requests)
    with pytest.raises(UntrustedServer) as refused, FleetClient(server.url(), TOKEN) as system:
        system.submit("gemm", 64)
    said = str(refused.value)
    assert "not trusted by this machine's trust store" in said and pin in said
    assert "--ca-cert-hash" in said and TOKEN not in said
    assert len(server.seen.requests) == before


@needs_address
def test_an_impostor_of_another_ca_is_refused_at_the_join_and_later_naming_both_pins(
    coordinator: tuple[Server, str], tmp_path: Path
) -> None:
    server, pin = coordinator
    impostor_home = tmp_path / "impostor"
    paths, impostor_pin = tls.ensure_server_cert(impostor_home, tls.local_names("0.0.0.0"))
    assert impostor_pin != pin
    with serving(paths.cert, paths.key) as impostor:
        # At the join: the chain fetched does not hold the pinned CA.
        with pytest.raises(UntrustedServer) as at_join:
            pinned_trust(impostor.url(), pin)
        said = str(at_join.value)
        assert f"expected {pin}" in said and impostor_pin in said and "Nothing was sent" in said
        # The agent stops at the join, saying so; the impostor never saw a request.
        agent = Agent(impostor.url(), TOKEN, home=tmp_path / "device", ca_pin=pin)
        with pytest.raises(UntrustedServer, match=f"expected {pin}"):
            agent.run()
        # Later: a client that trusts the real CA, sent to the impostor, verifies and refuses.
        trust = pinned_trust(server.url(), pin)
        with (
            pytest.raises(UntrustedServer) as later,
            FleetClient(impostor.url(), TOKEN, trust=trust) as client,
        ):
            client.submit("gemm", 64)
        said = str(later.value)
        assert f"pinned CA {pin}" in said and impostor_pin in said and TOKEN not in said
        assert impostor.seen.requests == []


@needs_address
def test_a_new_server_certificate_reaches_new_connections_and_the_pin_still_holds(
    coordinator: tuple[Server, str], home: Path
) -> None:
    server, pin = coordinator
    trust = pinned_trust(server.url(), pin)
    first = tls.presented_chain(server.url())[0]
    renewed = tls.issue_server_cert(home, tls.local_names("0.0.0.0"))
    assert renewed.serial_number != first.serial_number
    deadline = time.monotonic() + 10
    while tls.presented_chain(server.url())[0].serial_number != renewed.serial_number:
        assert time.monotonic() < deadline, "the server kept its old certificate"
        time.sleep(0.2)
    with FleetClient(server.url(), TOKEN, trust=trust) as client:  # a new connection
        assert client.submit("gemm", 64)["task_id"] == "task-1"

    async def agent_client() -> None:
        from hpc_ds1.fleet.client import AgentClient

        agent = AgentClient(server.url(), TOKEN, trust=trust)
        try:
            await agent.heartbeat(None, None)
        finally:
            await agent.close()

    asyncio.run(agent_client())
    assert server.seen.requests[-1][:3] == ("https", "POST", "/v1/agent/heartbeat")


@needs_address
def test_a_site_certificate_is_verified_by_the_system_store_named_by_ssl_cert_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site's CA (made here with the same code, in a folder of its own) signs the server's
    certificate; clients without a pin trust it once the system store holds the site's CA,
    here through SSL_CERT_FILE naming a bundle, as docs/tls.md says."""
    site = tmp_path / "site"
    paths, site_pin = tls.ensure_server_cert(site, [str(ADDRESS)])
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(paths.ca_cert.read_text())
    with serving(paths.cert, paths.key) as server:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        with pytest.raises(UntrustedServer, match="not trusted by this machine's trust store"):
            with FleetClient(server.url(), TOKEN, trust=resolve_trust(server.url())) as c:
                c.submit("gemm", 64)
        monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
        with FleetClient(server.url(), TOKEN, trust=resolve_trust(server.url())) as client:
            assert client.submit("gemm", 64)["task_id"] == "task-1"
        # The CLI, another process, the same way.
        env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
        env.update(HPC_DS1_HOME=str(tmp_path / "cli-home"), SSL_CERT_FILE=str(bundle))
        argv = [HPC_DS1, "submit", "--server", server.url(), "--token", TOKEN]
        done = subprocess.run(
            [*argv, "--workload", "gemm", "--size", "64", "--no-wait", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["task_id"] == "task-1"
        env.pop("SSL_CERT_FILE")
        refused = subprocess.run(
            [*argv, "--workload", "gemm", "--size", "64", "--no-wait"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode == 1 and site_pin in refused.stderr, refused.stderr
        assert TOKEN not in refused.stderr
    assert [r[0] for r in server.seen.requests] == ["https", "https"]


# --- the device credential keeps the pin ----------------------------------------------------


def test_the_device_credential_keeps_the_pin_and_refuses_an_altered_ca(
    home: Path, tmp_path: Path
) -> None:
    tls.ensure_ca(home)
    pin = tls.home_pin(home)
    assert pin is not None
    ca_pem = tls.HomeTLS.of(home).ca_cert.read_text()
    device = tmp_path / "device"
    identity = Identity(
        "https://10.0.0.1:8765", "dev-a", TOKEN, "tok_a", 5.0, 25.0, ca_pin=pin, ca_pem=ca_pem
    )
    save_identity(device, identity)
    assert stat.S_IMODE(ca_file(device).stat().st_mode) == 0o600
    assert json.loads((device / "credentials" / "device.json").read_text())["ca_pin"] == pin
    loaded = load_identity(device, "https://10.0.0.1:8765/")
    assert loaded is not None and loaded.trust is not None and loaded.trust.pin == pin
    assert loaded.ca_pem is not None and loaded.ca_pem.strip() == ca_pem.strip()
    assert resolve_trust("https://10.0.0.1:8765", None, device) == loaded.trust
    # Another CA's certificate in its place: the credential is refused, saying why.
    other = tmp_path / "other"
    tls.ensure_ca(other)
    ca_file(device).write_text(tls.HomeTLS.of(other).ca_cert.read_text())
    with pytest.raises(CredentialError, match=f"not the pinned {pin}"):
        load_identity(device, "https://10.0.0.1:8765")
