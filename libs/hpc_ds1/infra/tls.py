"""TLS for the gateway off loopback, and the CA pin that the join command carries (issue 45).

The home's own CA. On its first start with a bind that other machines can reach, `serve`
makes a small certificate authority (EC P-256, ten years) and a server certificate it signs
for the machine's names and addresses (one year; made again on a start when it no longer
covers them, was not signed by the home's CA, or has under 30 days left):

    $HPC_DS1_HOME/tls/            0700
    $HPC_DS1_HOME/tls/ca.pem      0600  the CA certificate (what an agent pins)
    $HPC_DS1_HOME/tls/ca.key      0600  the CA's private key (never leaves the home)
    $HPC_DS1_HOME/tls/server.pem  0600  the server certificate, then the CA's (the chain served)
    $HPC_DS1_HOME/tls/server.key  0600  the server's private key

A site's own certificate (settings tls_cert / tls_key, `serve --tls-cert/--tls-key`) replaces
the home's; clients then verify it against the system trust store.

The pin. `sha256:<hex>`: the SHA-256 of the CA certificate's DER SubjectPublicKeyInfo, as
kubeadm's `--discovery-token-ca-cert-hash` and RFC 7469 compute it. At the join the agent fetches
the chain the server presents through a handshake that verifies nothing yet (as kubeadm fetches
cluster-info), keeps the certificate of that chain whose key hashes to the pin, and from then on
trusts that CA alone: every connection (the join's own request included) verifies the server's
chain up to it and the server's name, so a server that cannot prove it holds a key the CA
signed gets no request, no token. The CA's PEM is kept beside the device's credential.

Loopback stays plain HTTP. One port serves both: a connection made to a loopback address (only
this machine can make one) is served as it is; any other gets a TLS handshake first. The local
CLI, the console on this machine and health checks keep `http://127.0.0.1:PORT`.

Rotation. The gateway checks its certificate and key files (at most once a second, on a new
TLS connection) and serves new ones from then on: a server certificate made again from the same
CA (`serve` on a start, `python -m hpc_ds1.infra.tls renew`), or a site's renewed certificate
put in place, reaches new connections without a restart, and agents, which pin the CA and not
the server certificate, keep working."""

from __future__ import annotations

import _ssl
import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import ipaddress
import os
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..log import get_logger

log = get_logger("tls")

TLS_DIR: Final = "tls"
CA_CERT: Final = "ca.pem"
CA_KEY: Final = "ca.key"
SERVER_CERT: Final = "server.pem"
SERVER_KEY: Final = "server.key"
PIN_PREFIX: Final = "sha256:"
PIN_RULE: Final = "sha256:<64 hex digits> (the SHA-256 of the CA's SubjectPublicKeyInfo)"
_PIN = re.compile(r"^sha256:([0-9a-f]{64})$")
CA_YEARS: Final = 10
SERVER_DAYS: Final = 365
RENEW_BEFORE_DAYS: Final = 30  # a server certificate closer than this to its end is made again
RELOAD_CHECK_S: Final = 1.0  # the gateway stats its certificate files at most this often
HANDSHAKE_TIMEOUT_S: Final = 30.0  # a connection that never completes one is closed


class TLSError(Exception):
    """TLS material that cannot be used (missing, unreadable, not matching), said plainly."""


class UntrustedServer(Exception):
    """The server's certificate chain does not end at the CA the client trusts; the message says
    which CA was expected and which the server presented."""


# --- the pin ------------------------------------------------------------------------------


def spki_pin(cert: x509.Certificate) -> str:
    """`sha256:<hex>` of the certificate's DER SubjectPublicKeyInfo (RFC 7469; kubeadm's
    discovery-token-ca-cert-hash)."""
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return PIN_PREFIX + hashlib.sha256(spki).hexdigest()


def parse_pin(text: str) -> str:
    """A pin as written on a command line or in a file, normalized (lower-case hex); ValueError
    naming what was wrong and the accepted form otherwise."""
    value = text.strip().lower()
    if not value.startswith(PIN_PREFIX):
        raise ValueError(f"{text!r} is not a CA pin: use {PIN_RULE}, as `hpc-ds1 serve` prints it")
    if not _PIN.match(value):
        digits = len(value) - len(PIN_PREFIX)
        raise ValueError(
            f"{text!r} is not a CA pin: after 'sha256:' come 64 hex digits, not {digits} "
            f"characters ({PIN_RULE})"
        )
    return value


def load_certificates(pem: bytes | str) -> list[x509.Certificate]:
    """Every certificate of a PEM text (TLSError when there is none)."""
    data = pem.encode() if isinstance(pem, str) else pem
    try:
        found = x509.load_pem_x509_certificates(data)
    except ValueError as error:
        raise TLSError(f"not a PEM certificate: {error}") from None
    return found


def pem_of(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


# --- the home's CA and server certificate -----------------------------------------------------


@dataclass(frozen=True)
class HomeTLS:
    """Where a home keeps its CA and server certificate."""

    folder: Path

    @classmethod
    def of(cls, home: Path) -> HomeTLS:
        return cls(Path(home) / TLS_DIR)

    @property
    def ca_cert(self) -> Path:
        return self.folder / CA_CERT

    @property
    def ca_key(self) -> Path:
        return self.folder / CA_KEY

    @property
    def cert(self) -> Path:
        return self.folder / SERVER_CERT

    @property
    def key(self) -> Path:
        return self.folder / SERVER_KEY


def _private_write(path: Path, data: bytes) -> None:
    """`path` (0600) holding `data`, replaced atomically: never readable by others, never half
    written (a reader sees the old file or the new one)."""
    from .secrets import write_private

    write_private(path, data.decode())


def _folder(home: Path) -> HomeTLS:
    from .secrets import secure_dir

    paths = HomeTLS.of(home)
    secure_dir(paths.folder)
    return paths


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def ensure_ca(home: Path) -> x509.Certificate:
    """The home's CA certificate, made (with its key, both 0600) when the home has none."""
    paths = _folder(home)
    if paths.ca_cert.exists() and paths.ca_key.exists():
        return _read_ca(paths)[0]
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "HPC-DS1"),
            x509.NameAttribute(
                NameOID.COMMON_NAME, f"HPC-DS1 CA {socket.gethostname()[:40]} {os.urandom(3).hex()}"
            ),
        ]
    )
    now = _now()
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365 * CA_YEARS))
        # path_length 0: it signs server certificates only, never another CA
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    # The key first: a CA certificate on disk always has its key beside it.
    _private_write(paths.ca_key, _key_pem(key))
    _private_write(paths.ca_cert, cert.public_bytes(serialization.Encoding.PEM))
    log.info("tls_ca_created", pin=spki_pin(cert), path=str(paths.ca_cert))
    return cert


def _read_ca(paths: HomeTLS) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = load_certificates(paths.ca_cert.read_bytes())[0]
        key = serialization.load_pem_private_key(paths.ca_key.read_bytes(), password=None)
    except (OSError, ValueError, TLSError) as error:
        raise TLSError(
            f"the home's CA in {paths.folder} cannot be read ({error}); remove {paths.folder} "
            "to make a new one (every device then joins again with the new pin)"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise TLSError(f"{paths.ca_key} is not the key of {paths.ca_cert}")
    return cert, key


def home_pin(home: Path) -> str | None:
    """The pin of the home's CA, or None when the home has none (yet)."""
    path = HomeTLS.of(home).ca_cert
    try:
        return spki_pin(load_certificates(path.read_bytes())[0])
    except (OSError, TLSError):
        return None


def local_names(bind_host: str, extra: Iterable[str] = ()) -> list[str]:
    """What a server bound to `bind_host` is reached as: for a wildcard bind every address of
    this machine's interfaces, its host names and `localhost`; else the bind host; then `extra`
    (settings tls_names: a NAT's public address, a DNS alias)."""
    import psutil

    names: list[str] = []
    if bind_host in ("0.0.0.0", "::", ""):
        for addresses in psutil.net_if_addrs().values():
            for address in addresses:
                if address.family in (socket.AF_INET, socket.AF_INET6):
                    names.append(address.address.split("%", 1)[0])  # without an IPv6 zone
        names += [socket.gethostname(), socket.getfqdn(), "localhost"]
    else:
        names.append(bind_host.strip("[]"))
    names += [n.strip() for n in extra if n.strip()]
    seen: list[str] = []
    for name in names:
        if name and name not in seen:
            seen.append(name)
    return seen


def _san(names: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name.lower()))
    return out


def covered(cert: x509.Certificate, names: Iterable[str]) -> list[str]:
    """The names of `names` that `cert` does not name (its subjectAltName)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return list(names)
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    dns = {d.lower() for d in san.get_values_for_type(x509.DNSName)}
    missing = []
    for name in names:
        try:
            if str(ipaddress.ip_address(name)) not in ips:
                missing.append(name)
        except ValueError:
            if name.lower() not in dns:
                missing.append(name)
    return missing


def issue_server_cert(home: Path, names: list[str]) -> x509.Certificate:
    """A new server certificate (and key) for `names`, signed by the home's CA, written in
    place of the current one (the running gateway serves it to new connections)."""
    if not names:
        raise TLSError("a server certificate needs at least one name or address")
    paths = _folder(home)
    ensure_ca(home)
    ca, ca_key = _read_ca(paths)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cn = next((n for n in names if not _is_ip(n)), names[0])[:64]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=SERVER_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_san(names)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    chain = cert.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(
        serialization.Encoding.PEM
    )
    # Key, then certificate: the gateway that reads the pair between the two writes finds them
    # not matching, keeps serving the old pair and reads both again after the second write.
    _private_write(paths.key, _key_pem(key))
    _private_write(paths.cert, chain)
    log.info("tls_server_certificate_issued", names=names, serial=f"{cert.serial_number:x}")
    return cert


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def ensure_server_cert(home: Path, names: list[str]) -> tuple[HomeTLS, str]:
    """The home's server certificate for `names`, made again when it is missing, does not name
    all of them, was not signed by the home's CA or ends within RENEW_BEFORE_DAYS; the paths
    and the CA's pin."""
    paths = _folder(home)
    ca = ensure_ca(home)
    why = _renewal_reason(paths, ca, names)
    if why is not None:
        log.info("tls_server_certificate_renewing", why=why)
        issue_server_cert(home, names)
    return paths, spki_pin(ca)


def _renewal_reason(paths: HomeTLS, ca: x509.Certificate, names: list[str]) -> str | None:
    if not paths.cert.exists() or not paths.key.exists():
        return "none yet"
    try:
        cert = load_certificates(paths.cert.read_bytes())[0]
        cert.verify_directly_issued_by(ca)
    except (TLSError, ValueError, TypeError, InvalidSignature):
        return "not signed by the home's CA"
    if cert.not_valid_after_utc - _now() < dt.timedelta(days=RENEW_BEFORE_DAYS):
        return f"it ends {cert.not_valid_after_utc:%Y-%m-%d}"
    missing = covered(cert, names)
    if missing:
        return f"it does not name {', '.join(missing)}"
    return None


# --- the server side --------------------------------------------------------------------------


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for the pair (TLS 1.2 at least; TLSError naming the file otherwise)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert), str(key))
    except FileNotFoundError as error:
        raise TLSError(f"TLS certificate or key not found: {error.filename}") from None
    except PermissionError as error:
        raise TLSError(f"cannot read {error.filename}: permission denied") from None
    except ssl.SSLError as error:
        raise TLSError(
            f"{cert} and {key} are not a certificate (PEM, leaf first) and its private key: "
            f"{error.reason or error}"
        ) from None
    return context


def check_key_private(key: Path) -> None:
    """A private key that others can read is refused, as ssh refuses one."""
    try:
        mode = key.stat().st_mode
    except FileNotFoundError:
        raise TLSError(f"TLS key not found: {key}") from None
    if mode & 0o077:
        raise TLSError(f"{key} is readable by others (mode {mode & 0o777:o}): run chmod 600 {key}")


class ServerCertificate:
    """The gateway's certificate and key, read again when the files change (checked at most
    every RELOAD_CHECK_S, when a TLS connection arrives): rotation without a restart."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = Path(cert), Path(key)
        check_key_private(self.key)
        self._context = server_context(self.cert, self.key)
        self._signature = self._stat()
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        self.reloads = 0

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        found = []
        for path in (self.cert, self.key):
            try:
                st = path.stat()
                found.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                found.append((0, 0, 0))
        return tuple(found)

    def context(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_S:
            return self._context
        with self._lock:
            self._checked = now
            signature = self._stat()
            if signature != self._signature:
                self._signature = signature
                try:
                    self._context = server_context(self.cert, self.key)
                    self.reloads += 1
                    log.info("tls_certificate_reloaded", cert=str(self.cert))
                except TLSError as error:  # half replaced: the old pair serves until it is whole
                    log.warning("tls_certificate_not_reloaded", error=str(error))
        return self._context


def is_loopback(address: str | None) -> bool:
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _ssl_protocol_class(loop: asyncio.AbstractEventLoop) -> Any:
    """The event loop's own TLS protocol: uvloop's (C) on a uvloop loop, else asyncio's."""
    if type(loop).__module__.startswith("uvloop"):
        import uvloop.loop

        return uvloop.loop.SSLProtocol  # type: ignore[attr-defined]
    from asyncio import sslproto

    return sslproto.SSLProtocol


def _handshake_done(waiter: asyncio.Future[None]) -> None:
    """A handshake that failed (a client that does not trust us, speaks plain HTTP, or left):
    its connection is closed by the TLS protocol and nothing of it reached the application."""
    if not waiter.cancelled() and (error := waiter.exception()) is not None:
        log.debug("tls_handshake_failed", error=f"{type(error).__name__}: {error}")


def tls_protocol(base: type[asyncio.Protocol], certificate: ServerCertificate) -> type[Any]:
    """uvicorn's HTTP protocol class `base`, with TLS in front of it for every connection that
    was not made to a loopback address (see the module docstring)."""

    class LoopbackPlainElseTLS(asyncio.Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._inner = base(*args, **kwargs)

        def connection_made(self, transport: Any) -> None:  # uvloop's is no asyncio.Transport
            local = transport.get_extra_info("sockname")
            if is_loopback(local[0] if isinstance(local, tuple) else None):
                transport.set_protocol(self._inner)
                self._inner.connection_made(transport)
                return
            # What create_server(ssl=...) does for each connection, with this connection's
            # context: the TLS protocol owns the socket from its first byte and hands the
            # decrypted stream to uvicorn's protocol once the handshake is done.
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            waiter.add_done_callback(_handshake_done)
            secured = _ssl_protocol_class(loop)(
                loop,
                self._inner,
                certificate.context(),
                waiter,
                server_side=True,
                call_connection_made=True,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
            )
            transport.set_protocol(secured)
            secured.connection_made(transport)

        def data_received(self, data: bytes) -> None:  # never: the protocol was swapped
            pass

    return LoopbackPlainElseTLS


def uvicorn_options(settings: Any) -> dict[str, Any]:
    """uvicorn.Config options of the gateway: with a certificate in the settings (tls_cert,
    tls_key: `serve` sets the home's own off loopback), TLS for every connection not made to
    loopback; without one, none (plain HTTP, as behind a TLS-terminating proxy)."""
    cert, key = getattr(settings, "tls_cert", None), getattr(settings, "tls_key", None)
    if cert is None or key is None or getattr(settings, "tls", "auto") == "off":
        return {}
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    certificate = ServerCertificate(Path(cert), Path(key))
    log.info("tls_serving", cert=str(cert), loopback="plain HTTP")
    return {"http": tls_protocol(AutoHTTPProtocol, certificate)}


# --- the client side ----------------------------------------------------------------------------


def client_context(ca_pem: str | None = None) -> ssl.SSLContext:
    """The verifying context of every HTTPS call to a coordinator: trusting the pinned CA alone
    (`ca_pem`), else the system trust store (which honours SSL_CERT_FILE / SSL_CERT_DIR: a site
    CA bundle). The server's name is checked either way."""
    context = ssl.create_default_context(cadata=ca_pem) if ca_pem else ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _host_port(server: str) -> tuple[str, int]:
    parts = urlsplit(server)
    if parts.scheme != "https" or not parts.hostname:
        raise ValueError(f"{server!r} is not an https:// URL")
    return parts.hostname, parts.port or 443


def presented_chain(server: str, timeout_s: float = 10.0) -> list[x509.Certificate]:
    """The certificates the server at `server` presents, read through a handshake that verifies
    nothing (what kubeadm's discovery does before it checks the pin); nothing is sent after the
    handshake. Blocking. OSError when it cannot be reached."""
    host, port = _host_port(server)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=timeout_s) as raw:
        with context.wrap_socket(raw, server_hostname=None if _is_ip(host) else host) as tls:
            chain = _unverified_chain(tls)
    return chain


def _unverified_chain(tls: ssl.SSLSocket) -> list[x509.Certificate]:
    getter = getattr(tls, "get_unverified_chain", None)  # public from Python 3.13
    if getter is None:
        getter = tls._sslobj.get_unverified_chain  # type: ignore[attr-defined]  # 3.10-3.12
    certs = getter() or []
    out = []
    for cert in certs:
        der = cert if isinstance(cert, bytes) else cert.public_bytes(_ssl.ENCODING_DER)
        out.append(x509.load_der_x509_certificate(der))
    if not out:
        leaf = tls.getpeercert(binary_form=True)
        if leaf:
            out.append(x509.load_der_x509_certificate(leaf))
    return out


def describe_chain(chain: list[x509.Certificate]) -> str:
    """`sha256:… (CN=…)` of each certificate presented, leaf first."""
    if not chain:
        return "no certificate"
    return ", ".join(f"{spki_pin(c)} ({c.subject.rfc4514_string()[:80]})" for c in chain)


def fetch_pinned_ca(server: str, pin: str) -> str:
    """The PEM of the CA certificate whose key hashes to `pin`, from the chain the server at
    `server` presents. UntrustedServer saying what it presented when none does."""
    expected = parse_pin(pin)
    chain = presented_chain(server)
    for cert in chain:
        if spki_pin(cert) == expected:
            constraints = _basic_constraints(cert)
            if constraints is None or not constraints.ca:
                raise UntrustedServer(
                    f"{server} presented a certificate with the pinned key ({expected}) that is "
                    "no CA certificate: refused, nothing was sent"
                )
            return pem_of(cert)
    raise UntrustedServer(
        f"{server} is not the coordinator this device was told to trust: its certificate "
        f"chain does not end at the pinned CA (expected {expected}; it presented "
        f"{describe_chain(chain)}). Nothing was sent to it. Check the address, and that the "
        "--ca-cert-hash is the one `hpc-ds1 serve` (or `hpc-ds1 token join`) prints there"
    )


def _basic_constraints(cert: x509.Certificate) -> x509.BasicConstraints | None:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return None


def check_ca_pem(ca_pem: str, pin: str) -> str:
    """`ca_pem` when it holds one certificate whose key hashes to `pin` (a stored CA that was
    altered is refused); TLSError otherwise."""
    certs = load_certificates(ca_pem)
    got = spki_pin(certs[0])
    if len(certs) != 1 or got != parse_pin(pin):
        raise TLSError(f"the stored CA hashes to {got}, not the pinned {pin}")
    return ca_pem


def explain_refusal(server: str, error: BaseException, pin: str | None) -> str | None:
    """Why a TLS connection to `server` failed verification, in words, with what the server
    presented (fetched again without verifying); None when `error` is no verification error."""
    verification = _verification_error(error)
    if verification is None:
        return None
    try:
        presented = describe_chain(presented_chain(server, timeout_s=5.0))
    except (OSError, ValueError, ssl.SSLError) as fetch_error:
        presented = f"(its chain could not be read again: {fetch_error})"
    reason = getattr(verification, "verify_message", None) or str(verification)
    if pin is not None:
        return (
            f"{server} is not the coordinator this device trusts: {reason}. Expected a chain "
            f"ending at the pinned CA {pin}; it presented {presented}. Nothing was sent to it"
        )
    return (
        f"{server}'s certificate is not trusted by this machine's trust store: {reason}. It "
        f"presented {presented}. For a coordinator's own CA give --ca-cert-hash sha256:… as "
        "`hpc-ds1 serve` prints it; for a site certificate, the site's CA in the system store "
        "(or SSL_CERT_FILE). Nothing was sent to it"
    )


def _verification_error(error: BaseException | None) -> ssl.SSLError | None:
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, ssl.SSLCertVerificationError):
            return error
        if isinstance(error, ssl.SSLError) and "CERTIFICATE_VERIFY_FAILED" in str(error):
            return error
        error = error.__cause__ or error.__context__
        seen += 1
    return None


# --- `python -m hpc_ds1.infra.tls` ----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`pin HOME`: the pin of a home's CA; `renew HOME [--host H]`: a new server certificate
    from the same CA (the running gateway serves it within a second)."""
    parser = argparse.ArgumentParser(prog="python -m hpc_ds1.infra.tls")
    sub = parser.add_subparsers(dest="command", required=True)
    pin = sub.add_parser("pin", help="print the pin of the home's CA")
    pin.add_argument("home", type=Path)
    renew = sub.add_parser("renew", help="make a new server certificate from the home's CA")
    renew.add_argument("home", type=Path)
    renew.add_argument("--host", default="0.0.0.0", help="the bind host (default: every address)")
    renew.add_argument("--name", action="append", default=[], help="another name or address")
    args = parser.parse_args(argv)
    try:
        if args.command == "pin":
            found = home_pin(args.home)
            if found is None:
                print(f"{args.home} has no CA yet (`hpc-ds1 serve --host 0.0.0.0` makes one)")
                return 1
            print(found)
            return 0
        cert = issue_server_cert(args.home, local_names(args.host, args.name))
    except TLSError as error:
        print(f"tls: {error}", file=sys.stderr)
        return 1
    print(f"new server certificate {cert.serial_number:x}, CA pin {home_pin(args.home)}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
