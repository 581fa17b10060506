"""HTTP clients of the coordinator's fleet endpoints (the contract is the gateway's): the
agent-facing ones (join, work long-poll, heartbeat, started, result, measurements, model) in
`AgentClient` (async, for the agent), the user-facing ones (tasks, devices) in `FleetClient`
(sync, for `submit` and the CLI). Both turn an unwanted answer into a `FleetError` whose message
says what happened; neither ever logs or prints a token (it is only in the Authorization
header; `repr` of a client does not show it).

Over https both verify the server (issue 45): against the CA the join command pinned
(`Trust`, kept beside the device's credential) or the system trust store for a site
certificate. `verify_for` is the one place their TLS context is made; a server that fails it
is an `UntrustedServer`, saying which CA was expected and what the server presented."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..infra import tls
from ..log import get_logger
from ..security.credentials import CredentialError, _replace, credentials_dir
from .execute import TaskResult
from .work import WorkItem

log = get_logger("fleet.client")

REFUSED_CREDENTIAL = "the coordinator refused this credential: revoked or wrong token"
MAX_MEASUREMENTS_PER_POST = 5000
MAX_METRICS_HEADER = 4000  # bytes of X-Model-Metrics sent (larger metrics are left out)


class FleetError(Exception):
    """An answer the caller cannot use; `status` is the HTTP status (None: no answer)."""

    status: int | None = None

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class CredentialRefused(FleetError):
    """401: the token is wrong, revoked, or not a token of this coordinator."""


class Forbidden(FleetError):
    """403: the credential is valid but may not do this (its role)."""


class Conflict(FleetError):
    """409: e.g. an attempt that is no longer current, a device name taken."""


class NotFound(FleetError):
    """404."""


class Rejected(FleetError):
    """Another 4xx: the request is wrong and sending it again will not help."""


class ServerError(FleetError):
    """5xx: the coordinator failed (or a service behind it is down); worth retrying."""


class Unreachable(FleetError):
    """No answer: connection refused, DNS, TLS, or a timeout; worth retrying."""


class UntrustedServer(FleetError):
    """The server's certificate chain does not end at the CA this client trusts (the pinned one,
    or the system store's): nothing was sent to it. Not worth retrying at once: it is either
    not the coordinator, or the pin or the trust store is wrong; the message says which CA was
    expected and what the server presented."""


class TooManyRequests(FleetError):
    """429: too many joins or failed authentications from this address; worth retrying after
    `retry_after_s` (the answer's Retry-After)."""

    def __init__(self, message: str, status: int | None, retry_after_s: float) -> None:
        super().__init__(message, status)
        self.retry_after_s = retry_after_s


def _retry_after(response: httpx.Response) -> float:
    """Retry-After in seconds (1 when absent or not a number of seconds), at most an hour."""
    try:
        return min(max(float(response.headers.get("retry-after", "1")), 1.0), 3600.0)
    except ValueError:
        return 1.0


def base_url(server: str) -> str:
    server = server.strip().rstrip("/")
    if not server.startswith(("http://", "https://")):
        raise ValueError(f"server {server!r} must be a URL such as http://coordinator:8765")
    return server


def _reason(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300] or response.reason_phrase
    if not isinstance(body, dict):
        return str(body)[:300]
    text = str(body.get("error") or body.get("detail") or body)
    issues = body.get("detail")
    if isinstance(issues, list) and issues:
        parts = []
        for d in issues[:5]:
            if isinstance(d, dict):
                where = ".".join(str(x) for x in d.get("loc", []) if x != "body")
                parts.append(f"{where}: {d.get('msg')}" if where else str(d.get("msg")))
        if parts:
            text = f"{text} ({'; '.join(parts)})"
    return text


def check(response: httpx.Response, server: str, what: str) -> httpx.Response:
    """`response` when it is a success; else the FleetError for its status."""
    code = response.status_code
    if code < 400:
        return response
    reason = _reason(response)
    if code == 401:
        raise CredentialRefused(f"{REFUSED_CREDENTIAL} ({server}: {reason})", code)
    if code == 403:
        raise Forbidden(f"{server} refused to {what} for this credential: {reason}", code)
    if code == 404:
        raise NotFound(f"{server}: {what}: {reason}", code)
    if code == 409:
        raise Conflict(f"{server}: {what}: {reason}", code)
    if code == 429:
        raise TooManyRequests(f"{server}: {what}: {reason}", code, _retry_after(response))
    if code >= 500:
        raise ServerError(f"{server} failed to {what} ({code}): {reason}", code)
    raise Rejected(f"{server} refused to {what} ({code}): {reason}", code)


def unreachable(server: str, what: str, error: Exception) -> Unreachable:
    said = f"cannot reach {server} to {what}: {type(error).__name__}: {error}"
    if server.startswith("http://") and isinstance(error, httpx.RemoteProtocolError):
        # what a plain-HTTP request to a TLS port gets: the handshake fails, the server hangs up
        said += " (does it serve HTTPS? then use https:// and the join command's --ca-cert-hash)"
    return Unreachable(said)


# --- what an HTTPS call trusts (issue 45): the one place a verifying client is built ----------


@dataclass(frozen=True)
class Trust:
    """What HTTPS calls to a coordinator trust: the CA whose SPKI hashes to `pin` (its PEM
    fetched at the join and kept beside the device's credential), or, without a pin, the
    system trust store (a site certificate; SSL_CERT_FILE names a bundle)."""

    pin: str | None = None
    ca_pem: str | None = None

    def context(self) -> ssl.SSLContext:
        return tls.client_context(self.ca_pem)

    def describe(self) -> str:
        return f"the pinned CA {self.pin}" if self.pin else "the system trust store"


def verify_for(server: str, trust: Trust | None) -> ssl.SSLContext | bool:
    """httpx's `verify` for calls to `server`: the trust's context for https (the system store
    when none is given), True (unused) for plain http."""
    if not server.startswith("https://"):
        return True
    return (trust or Trust()).context()


def pinned_trust(server: str, pin: str) -> Trust:
    """The CA of `server`'s presented chain that hashes to `pin` (kubeadm's discovery: an
    unverified handshake, then the pin decides). Blocking. UntrustedServer when the chain has
    no such CA; Unreachable when the server cannot be reached."""
    try:
        return Trust(pin, tls.fetch_pinned_ca(server, pin))
    except tls.UntrustedServer as error:
        raise UntrustedServer(str(error)) from None
    except (OSError, ssl.SSLError) as error:
        raise unreachable(server, "read its certificate", error) from None


def resolve_trust(server: str, ca_pin: str | None = None, home: Path | None = None) -> Trust | None:
    """What calls to `server` trust: None for http (ValueError when a pin is given: a pin
    needs https); with `ca_pin`, the CA it pins (from this home's device credential when it
    holds that pin for the server, else fetched and checked); without, the pin this home's
    device credential keeps for the server, or this home's own CA when `server` is this home's
    own gateway; else the system trust store. Blocking."""
    if not server.strip().lower().startswith("https://"):
        if ca_pin:
            raise ValueError(f"a CA pin needs an https:// server, not {server!r}")
        return None
    pin = tls.parse_pin(ca_pin) if ca_pin else None
    stored = _stored_trust(server, home) if home is not None else None
    if stored is not None and (pin is None or stored.pin == pin):
        return stored
    if pin is not None:
        return pinned_trust(server, pin)
    return Trust()


def _stored_trust(server: str, home: Path) -> Trust | None:
    from ..security.credentials import CredentialError

    try:
        identity = load_identity(home, server)
    except CredentialError:
        identity = None
    if identity is not None and identity.ca_pin and identity.ca_pem:
        return Trust(identity.ca_pin, identity.ca_pem)
    from ..infra.home import running_owner

    owner = running_owner(home)
    pin = tls.home_pin(home)
    if owner is not None and owner.gateway_url and pin is not None:
        from ..security.credentials import _origin

        if _origin(owner.gateway_url) == _origin(server):
            return Trust(pin, tls.HomeTLS.of(home).ca_cert.read_text())
    return None


def refused_by_tls(server: str, error: Exception, trust: Trust | None) -> UntrustedServer | None:
    """The UntrustedServer a failed call amounts to (the server's chain did not verify), with
    what it presented; None for any other failure. Blocking (it reads the chain again)."""
    if not server.startswith("https://"):
        return None
    said = tls.explain_refusal(server, error, trust.pin if trust else None)
    return UntrustedServer(said) if said else None


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class AgentClient:
    """The agent-facing endpoints, with the device's credential (or, for `join`, the join
    token). Async; one connection pool."""

    def __init__(
        self,
        server: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        trust: Trust | None = None,
    ) -> None:
        self.server = base_url(server)
        self._token = token
        self.trust = trust
        self._http = httpx.AsyncClient(
            base_url=self.server,
            timeout=timeout_s,
            transport=transport,
            verify=verify_for(self.server, trust),
        )

    def __repr__(self) -> str:
        return f"AgentClient({self.server!r})"

    def use_token(self, token: str) -> None:
        self._token = token

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(
        self, method: str, path: str, what: str, *, token: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers = {**kwargs.pop("headers", {}), **_headers(token or self._token)}
        try:
            response = await self._http.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as error:
            refused = await asyncio.to_thread(refused_by_tls, self.server, error, self.trust)
            raise refused or unreachable(self.server, what, error) from None
        return check(response, self.server, what)

    async def join(
        self, join_token: str, hostname: str, fingerprint: dict[str, Any], name: str | None
    ) -> dict[str, Any]:
        """Trade the join token for this device's own credential: {device_id, token,
        token_id, heartbeat_interval_s, long_poll_s}."""
        body: dict[str, Any] = {"hostname": hostname, "fingerprint": fingerprint}
        if name:
            body["name"] = name
        response = await self._call(
            "POST", "/v1/fleet/join", "join the fleet", token=join_token, json=body
        )
        answer: dict[str, Any] = response.json()
        return answer

    async def work(self, wait_s: float) -> WorkItem | None:
        """The next attempt for this device, or None when none came within `wait_s`."""
        response = await self._call(
            "GET",
            "/v1/agent/work",
            "wait for work",
            params={"wait": f"{wait_s:g}"},
            timeout=wait_s + 15.0,
        )
        if response.status_code == 204 or not response.content:
            return None
        return WorkItem.model_validate_json(response.content)

    async def heartbeat(
        self, running: str | None, running_for_s: float | None, queued: int = 0
    ) -> None:
        body: dict[str, Any] = {"queued": queued}
        if running is not None:
            body["running"] = running
            body["running_for_s"] = round(max(running_for_s or 0.0, 0.0), 3)
        await self._call("POST", "/v1/agent/heartbeat", "take a heartbeat", json=body)

    async def started(self, task_id: str, attempt: int) -> None:
        """Conflict when the attempt is no longer current (requeued): do not run it."""
        await self._call(
            "POST",
            f"/v1/agent/tasks/{task_id}/started",
            f"start task {task_id}",
            json={"attempt": attempt},
        )

    async def result(self, task_id: str, result: TaskResult) -> dict[str, Any]:
        """{recorded, measurement_id?, why?}; Conflict when the attempt is no longer current."""
        response = await self._call(
            "POST",
            f"/v1/agent/tasks/{task_id}/result",
            f"record the result of task {task_id}",
            content=result.model_dump_json(exclude_none=True),
            headers={"Content-Type": "application/json"},
        )
        answer: dict[str, Any] = response.json()
        return answer

    async def measurements(self, rows: list[dict[str, Any]]) -> dict[str, int]:
        """Upload this device's measurements (MeasurementRecorded fields without device_id),
        in posts of at most MAX_MEASUREMENTS_PER_POST; totals of {accepted, known, refused}
        (refused: runtimes the coordinator does not believe, each logged with why)."""
        totals = {"accepted": 0, "known": 0, "refused": 0}
        for start in range(0, len(rows), MAX_MEASUREMENTS_PER_POST):
            chunk = rows[start : start + MAX_MEASUREMENTS_PER_POST]
            response = await self._call(
                "POST",
                "/v1/agent/measurements",
                "upload measurements",
                content=json.dumps({"measurements": chunk}, default=str),
                headers={"Content-Type": "application/json"},
            )
            answer = response.json()
            for key in ("accepted", "known"):
                totals[key] += int(answer.get(key, 0))
            refused = answer.get("refused") or []
            totals["refused"] += len(refused)
            for entry in refused[:5]:
                if isinstance(entry, dict):
                    log.warning(
                        "measurement_refused",
                        measurement_id=str(entry.get("measurement_id")),
                        why=str(entry.get("why"))[:500],
                    )
        return totals

    async def model(
        self,
        version: str,
        data: bytes,
        *,
        sha256: str,
        trained_on: int,
        metrics: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Upload this device's ONNX model: {model_version}."""
        headers = {"Content-Type": "application/octet-stream"}
        if metrics:
            text = json.dumps(metrics, default=str, separators=(",", ":"))
            if len(text) <= MAX_METRICS_HEADER and text.isascii():
                headers["X-Model-Metrics"] = text
        response = await self._call(
            "POST",
            "/v1/agent/model",
            f"upload model {version}",
            params={"version": version, "trained_on": trained_on, "sha256": sha256},
            content=data,
            headers=headers,
            timeout=120.0,
        )
        answer: dict[str, Any] = response.json()
        return answer


class FleetClient:
    """The user-facing endpoints (tasks and devices) with a user's token. Synchronous."""

    def __init__(
        self,
        server: str,
        token: str | None,
        *,
        timeout_s: float = 30.0,
        trust: Trust | None = None,
    ) -> None:
        """`trust`: what an https server must prove (resolve_trust); None: the system store."""
        self.server = base_url(server)
        self.trust = trust
        self._http = httpx.Client(
            base_url=self.server,
            timeout=timeout_s,
            headers=_headers(token) if token else {},
            verify=verify_for(self.server, trust),
        )

    def __repr__(self) -> str:
        return f"FleetClient({self.server!r})"

    def __enter__(self) -> FleetClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise refused_by_tls(self.server, error, self.trust) or unreachable(
                self.server, what, error
            ) from None
        return check(response, self.server, what).json()

    def submit(
        self, workload: str, size: int, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """POST /v1/tasks: the new task's JSON. With `idempotency_key` (docs/idempotency.md) a
        submission sent again is the same task."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        task: dict[str, Any] = self._call(
            "POST",
            "/v1/tasks",
            "submit a task",
            json={"workload": workload, "size": size},
            headers=headers,
        )
        return task

    def task(self, task_id: str) -> dict[str, Any]:
        task: dict[str, Any] = self._call("GET", f"/v1/tasks/{task_id}", f"read task {task_id}")
        return task

    def tasks(self, **filters: Any) -> list[dict[str, Any]]:
        params = {k: v for k, v in filters.items() if v is not None}
        body = self._call("GET", "/v1/tasks", "list tasks", params=params)
        found: list[dict[str, Any]] = body["tasks"]
        return found

    def devices(self) -> list[dict[str, Any]]:
        body = self._call("GET", "/v1/devices", "list devices")
        found: list[dict[str, Any]] = body["devices"]
        return found

    def device(self, device_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self._call(
            "GET", f"/v1/devices/{device_id}", f"read device {device_id}"
        )
        return found


DEVICE_FILE = "device.json"
CA_FILE = "coordinator-ca.pem"  # the pinned CA's certificate, beside device.json


# --- identity ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """The device's credential for one coordinator (device.json)."""

    server: str
    device_id: str
    token: str
    token_id: str
    heartbeat_interval_s: float | None = None
    long_poll_s: float | None = None
    ca_pin: str | None = None  # sha256:… of the coordinator's CA (https with a pin)
    ca_pem: str | None = None  # that CA's certificate (credentials/coordinator-ca.pem)

    def __repr__(self) -> str:  # never the token
        return f"Identity(server={self.server!r}, device_id={self.device_id!r})"

    @property
    def trust(self) -> Trust | None:
        return Trust(self.ca_pin, self.ca_pem) if self.ca_pin else None


def device_file(home: Path) -> Path:
    return Path(home) / "credentials" / DEVICE_FILE


def ca_file(home: Path) -> Path:
    return Path(home) / "credentials" / CA_FILE


def same_server(a: str, b: str) -> bool:
    pa, pb = urlsplit(a.strip().rstrip("/")), urlsplit(b.strip().rstrip("/"))
    return (pa.scheme.lower(), pa.netloc.lower()) == (pb.scheme.lower(), pb.netloc.lower())


def load_identity(home: Path, server: str) -> Identity | None:
    """The stored identity for `server`, or None (no file, or one for another server).
    CredentialError for a file others can read or that does not hold an identity."""
    path = device_file(home)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    if mode & 0o077:
        raise CredentialError(
            f"{path} is readable by others (mode {mode & 0o777:o}): run `chmod 600 {path}`"
        )
    try:
        raw = json.loads(path.read_text())
        found = Identity(
            server=str(raw["server"]),
            device_id=str(raw["device_id"]),
            token=str(raw["token"]),
            token_id=str(raw["token_id"]),
            heartbeat_interval_s=raw.get("heartbeat_interval_s"),
            long_poll_s=raw.get("long_poll_s"),
            ca_pin=tls.parse_pin(raw["ca_pin"]) if raw.get("ca_pin") else None,
        )
    except (ValueError, KeyError, TypeError):
        raise CredentialError(
            f"{path} does not hold a device identity; delete it to join again"
        ) from None
    if not same_server(found.server, server):
        return None
    if found.ca_pin is not None:
        # The CA kept at the join must still hash to the pin: an altered file is not trusted.
        where = ca_file(home)
        try:
            pem = tls.check_ca_pem(where.read_text(), found.ca_pin)
        except (OSError, tls.TLSError) as error:
            raise CredentialError(
                f"{where} cannot be trusted for the pin {found.ca_pin} in {path} ({error}); "
                "delete both to join again"
            ) from None
        found = dataclasses.replace(found, ca_pem=pem)
    return found


def save_identity(home: Path, identity: Identity) -> Path:
    """Write device.json (0600, in the 0700 credentials folder), replacing it atomically."""
    credentials_dir(home)
    path = device_file(home)
    body = {
        "server": identity.server,
        "device_id": identity.device_id,
        "token": identity.token,
        "token_id": identity.token_id,
        "heartbeat_interval_s": identity.heartbeat_interval_s,
        "long_poll_s": identity.long_poll_s,
        "ca_pin": identity.ca_pin,
    }
    if identity.ca_pin and identity.ca_pem:
        _replace(ca_file(home), identity.ca_pem.strip())  # first: device.json names its pin
    _replace(path, json.dumps(body, indent=2))
    return path
