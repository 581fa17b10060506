"""One settings class for every service and command, read from HPC_DS1_* environment variables."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


class Settings(BaseSettings):
    """Validated at start; an invalid value stops the process with a message naming the variable."""

    model_config = SettingsConfigDict(env_prefix="HPC_DS1_", extra="ignore", frozen=True)

    home: Path = Field(default=Path("~/.hpc_ds1"), description="Measurements, models, audit file.")
    nats_url: str | None = Field(default=None, description="External NATS; unset: embedded.")
    database_url: str | None = Field(
        default=None, description="External Postgres; unset: embedded."
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    reuse_port: bool = Field(
        default=False,
        description="Gateway replicas on one host share the port (SO_REUSEPORT: the kernel "
        "spreads connections over them). Off: a busy port is an error.",
    )
    max_body_bytes: int = Field(
        default=1 << 20,
        ge=1024,
        le=64 << 20,
        description="Largest HTTP request body the gateway reads (413 beyond it).",
    )
    token_cache_s: float = Field(
        default=2.0,
        ge=0,
        le=60,
        description="How long the gateway keeps an active token without asking Postgres again; "
        "its token.revoked event ends it at once. 0: every request looks its token up.",
    )
    # The gateway's limits per client address (services/gateway/edge/ratelimit.py); 0: no limit.
    auth_failures_per_minute: int = Field(
        default=60,
        ge=0,
        le=1_000_000,
        description="Failed authentications (unknown or revoked tokens, used login links) the "
        "gateway takes from one client address a minute, as many at once; past them a request "
        "with a credential from there gets 429 with Retry-After until one is allowed again "
        "(one every 60/N s). Loopback too: a valid token never needs many failures. 0: no limit.",
    )
    joins_per_minute: int = Field(
        default=10,
        ge=0,
        le=1_000_000,
        description="POST /v1/fleet/join calls the gateway takes from one client address a "
        "minute, as many at once (429 with Retry-After past them; an agent waits and tries "
        "again). Callers on this machine (loopback without a forwarded header) are not limited: "
        "a fleet brought up here may join 1,000 agents at once. 0: no limit.",
    )
    forwarded_allow_ips: str = Field(
        default="",
        description="The reverse proxies whose X-Forwarded-For and X-Forwarded-Proto the "
        "gateway believes: comma-separated addresses or networks ('*': any). Empty: none, the "
        "client is the socket's peer. Behind a proxy name it, else every caller is the proxy "
        "(one rate limit for all of them, a login cookie over HTTPS not marked Secure).",
    )
    shutdown_grace_s: int = Field(
        default=10,
        ge=1,
        le=300,
        description="On stop, how long the gateway lets requests in flight finish (a console's "
        "live stream never does) before it cancels them, and how long a `hpc-ds1 service` "
        "process on external servers may outlive its stopped service before it exits; keep it "
        "under the "
        "deployment's stop grace period (docker-compose.yml: 30 s).",
    )
    metrics: bool = Field(
        default=True,
        description="The gateway serves GET /metrics (Prometheus, a viewer's token) and times "
        "every request for it. False: neither, and no per-request cost.",
    )
    nats_sync: Literal["always", "default"] = Field(
        default="always",
        description="Embedded NATS fsync policy: 'always' puts an acknowledged event on disk.",
    )
    stream: str = Field(default="EVENTS", description="JetStream stream holding the event log.")
    subject_prefix: str = Field(default="hpcds1", description="First token of every subject.")
    max_deliver: int = Field(default=5, ge=1, description="Deliveries before a dead letter.")
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="JetStream replicas of the event log and model bucket: 3 on a 3-node cluster.",
    )
    projector_batch: int = Field(default=2000, ge=1, le=10_000)
    serve_mode: Literal["auto", "one-process", "processes"] = Field(
        default="auto",
        description="`serve` runs every service in its own process, or all in one; auto: its "
        "own process each where 2 or more CPUs are usable (measured x1.38 requests/s on 2 cores, "
        "benchmarks/bench_serve_modes.py), one process on 1 (`serve --processes` / "
        "`--one-process` for one start).",
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        default="auto",
        description="The services' event loop: uvloop (libuv, in C) or asyncio's own; auto: "
        "uvloop where it is installed.",
    )
    projector_linger_ms: float = Field(
        default=5.0,
        ge=0,
        le=1000,
        description="A small batch waits this long for more events before it is written "
        "(fewer transactions under a trickle; 0: never wait).",
    )
    auto_threshold: float = Field(default=0.85, ge=0, le=1, description="auto at or above")
    escalate_threshold: float = Field(default=0.5, ge=0, le=1, description="escalate below")
    min_auroc: float = Field(
        default=0.6,
        ge=0,
        le=1,
        description="No decision runs alone when the model's out-of-fold AUROC (for ending "
        "within 5 % of the best) is below this: its confidence cannot tell which moves need "
        "an engineer (0 turns the check off).",
    )
    calibration_target: Literal["not_slower", "good", "unattended"] = Field(
        default="unattended",
        description="What a trained model's confidence states the chance of: not_slower (the "
        "decision does not leave the job slower beyond the noise), good (a move at most 2 % "
        "slower; fewer decisions run by themselves) or unattended (a move makes the job faster "
        "beyond the noise, a STOP leaves at most 2 % on the table: issue 43).",
    )
    runtime_selection: Literal["order", "rmse"] = Field(
        default="order",
        description="How training chooses the runtime model: order (the best leave-one-size-out "
        "order of the configurations of a size) or rmse (the lowest error of log runtime, the "
        "choice before 2 Dec 2026; smaller model files).",
    )
    launcher: Literal["mpiexec", "srun"] = Field(
        default="mpiexec",
        description="How a real run starts its ranks: mpiexec, or srun (a Slurm job step).",
    )
    mpiexec: str | None = Field(
        default=None,
        description="The site's mpiexec, taken as named; unset: an MPICH-compatible (Hydra) "
        "mpiexec on PATH ahead of this environment's bin/, else the pip MPICH's, else mpiexec "
        "on PATH (runner/launch.py choose_mpiexec).",
    )
    max_run_s: float = Field(
        default=600.0,
        gt=0,
        le=7 * 86400,
        description="Wall-time cap of one real run (s): its timeout; a longer expected run is "
        "refused before it starts.",
    )
    heartbeat_interval_s: float = Field(
        default=5.0, gt=0, le=300, description="How often an agent says it is alive."
    )
    run_heartbeat_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="While one real run takes longer than this, a run.heartbeat event says so "
        "every this many seconds (what runs, for how long; setup, evaluate).",
    )
    offline_after_s: float = Field(
        default=20.0,
        gt=0,
        le=3600,
        description="A device silent this long is offline: its tasks are placed again.",
    )
    long_poll_s: float = Field(
        default=25.0, gt=0, le=300, description="How long an agent's poll for work is held open."
    )
    max_task_attempts: int = Field(
        default=3, ge=1, le=20, description="Devices a task may fail on before it fails."
    )
    # The bounds are hpc_ds1.security.credentials' JOIN_TTL_S and JOIN_USES
    # (`token join --ttl/--uses`).
    join_token_ttl_s: float = Field(
        default=86400.0,
        ge=60,
        le=365 * 86400,
        description="How long the join token `serve` makes lasts (s; kubeadm's default, 24 h).",
    )
    join_token_uses: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description="How many devices the join token `serve` makes may join.",
    )
    fleet_device: bool = Field(
        default=True,
        description="The local agent serves the fleet (heartbeats, its task queue). False in the "
        "short-lived stacks a command starts for itself: they must not take tasks they would "
        "kill when they end.",
    )
    max_model_bytes: int = Field(
        default=64 << 20,
        ge=1 << 20,
        le=1 << 30,
        description="Largest ONNX model an agent may upload (413 beyond it).",
    )
    model_vet_memory_mb: int = Field(
        default=1024,
        ge=512,
        le=64 << 10,
        description="Address space (MB) of the child process that first loads and runs an "
        "uploaded model (hpc_ds1.model.vetting): a model needing more is refused. The child's "
        "Python and onnxruntime take about 400 MB of it.",
    )
    model_vet_timeout_s: float = Field(
        default=30.0,
        ge=1,
        le=600,
        description="Wall time (s) that child may take to load an uploaded model and run it "
        "on a few rows (starting it takes 1-2 s); past it the child is killed, the model refused.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_json: bool | None = Field(default=None, description="JSON logs; unset: when not a TTY.")

    # Issue 45, sign-in and sessions that end: the console's own sessions (services/gateway/
    # edge/signins.py) and the site's OpenID provider (services/gateway/edge/oidc.py,
    # docs/sign-in.md).
    console_idle_s: float = Field(
        default=1800.0,
        ge=1,
        le=7 * 86400,
        description="A console session unused this long (s) is over: the browser signs in "
        "again. Default 30 minutes.",
    )
    console_max_s: float = Field(
        default=43200.0,
        ge=1,
        le=90 * 86400,
        description="A console session is over this long (s) after its sign-in, however busy "
        "it was. Default 12 hours.",
    )
    oidc_issuer: str | None = Field(
        default=None,
        description="The site's OpenID provider (its issuer URL, exactly as its discovery "
        "document says it); with a client id and secret the console signs people in there.",
    )
    oidc_client_id: str | None = Field(default=None, description="This console's client id.")
    oidc_client_secret: SecretStr | None = Field(
        default=None, description="This console's client secret at the provider (no default)."
    )
    oidc_scopes: str = Field(
        default="openid profile email groups",
        description="Scopes asked for (space-separated; 'openid' is always asked).",
    )
    oidc_role_claim: str = Field(
        default="groups",
        description="The claim (ID token or userinfo) whose value or values map to a role.",
    )
    oidc_roles: dict[str, Literal["viewer", "engineer", "admin"]] = Field(
        default_factory=dict,
        description='Claim value -> role, as JSON: {"hpc-admins": "admin", "hpc": "engineer"}. '
        "A person with several mapped values gets the highest role.",
    )
    oidc_default_role: Literal["viewer", "engineer", "admin"] | None = Field(
        default=None,
        description="The role of a person none of whose values is mapped; unset: refused.",
    )
    oidc_name_claim: str = Field(
        default="preferred_username",
        description="The claim that names the person in approvals and logs (then 'email', "
        "then 'sub' when it is missing).",
    )
    oidc_redirect_url: str | None = Field(
        default=None,
        description="The callback URL registered at the provider; unset: this gateway's URL "
        "as the browser reached it + /auth/oidc/callback.",
    )
    oidc_post_logout_redirect_url: str | None = Field(
        default=None,
        description="Where the provider sends the browser back after its sign-out (the "
        "console's sign-in page; register it at the provider as a post_logout_redirect_uri); "
        "unset: this gateway's URL as the browser reached it + /.",
    )

    # Issue 45, TLS by default off loopback (hpc_ds1/infra/tls.py, docs/tls.md).
    tls: Literal["auto", "off"] = Field(
        default="auto",
        description="`auto`: `serve` bound beyond loopback serves HTTPS to every connection not "
        "made to loopback, with the site's certificate (tls_cert, tls_key) or else the home's "
        "own CA's (made on the first start); `off`: plain HTTP (behind a TLS proxy).",
    )
    tls_cert: Path | None = Field(
        default=None,
        description="The site's server certificate (PEM, leaf first, then intermediates); with "
        "tls_key. Read again when the file changes.",
    )
    tls_key: Path | None = Field(
        default=None, description="The private key of tls_cert (PEM, mode 0600)."
    )
    tls_names: str = Field(
        default="",
        description="More names or addresses for the home's server certificate, comma-separated "
        "(a NAT's public address, a DNS alias); the machine's own are always in it.",
    )

    @field_validator("home")
    @classmethod
    def _expand_home(cls, value: Path) -> Path:
        from .machine.hosthome import resolve_home

        return resolve_home(value.expanduser().resolve())

    @field_validator("stream", "subject_prefix")
    @classmethod
    def _simple_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r}: use letters, digits, '_' or '-' only")
        return value

    @field_validator("oidc_issuer", "oidc_redirect_url", "oidc_post_logout_redirect_url")
    @classmethod
    def _oidc_url(cls, value: str | None) -> str | None:
        # https, or http on this machine only (a provider run by the tests, a tunnel): the
        # provider's answers and the callback's code carry the sign-in.
        if value is None or not value.strip():
            return None
        from urllib.parse import urlsplit

        value = value.strip()
        parts = urlsplit(value)
        loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
        if parts.scheme != "https" and not (parts.scheme == "http" and loopback):
            raise ValueError(
                f"{value!r} is not an https URL (http is accepted on 127.0.0.1/localhost only)"
            )
        if not parts.hostname or parts.query or parts.fragment:
            raise ValueError(f"{value!r}: give an https URL with a host, no query or fragment")
        return value

    @model_validator(mode="after")
    def _oidc_complete(self) -> Settings:
        if self.oidc_issuer is None:
            return self
        missing = [
            name
            for name, value in (
                ("HPC_DS1_OIDC_CLIENT_ID", self.oidc_client_id),
                ("HPC_DS1_OIDC_CLIENT_SECRET", self.oidc_client_secret),
            )
            if not value
        ]
        if missing:
            raise ValueError(
                f"HPC_DS1_OIDC_ISSUER is set: set {' and '.join(missing)} too (the client "
                "registered for this console at the provider)"
            )
        if not self.oidc_roles and self.oidc_default_role is None:
            raise ValueError(
                "HPC_DS1_OIDC_ISSUER is set but no one could get a role: set HPC_DS1_OIDC_ROLES "
                '(JSON, e.g. {"hpc-admins": "admin"}) or HPC_DS1_OIDC_DEFAULT_ROLE'
            )
        return self

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxies(cls, value: str) -> str:
        import ipaddress

        proxies = [p.strip() for p in value.split(",") if p.strip()]
        for proxy in proxies:
            if proxy == "*":
                continue
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(
                    f"{proxy!r} is not an address or a network (e.g. 10.0.0.5, 10.0.0.0/8, ::1, *)"
                ) from None
        return ",".join(proxies)

    @property
    def dead_letter_stream(self) -> str:
        return f"{self.stream}_DLQ"

    @property
    def dead_letter_prefix(self) -> str:
        return f"{self.subject_prefix}-dlq"

    @property
    def work_stream(self) -> str:
        """Per-device task queues: one subject per device, consumed by its agent (or the
        gateway on a remote agent's behalf). Operational, not the audit trail."""
        return f"{self.stream}_WORK"

    @property
    def work_prefix(self) -> str:
        return f"{self.subject_prefix}-work"

    @property
    def liveness_bucket(self) -> str:
        """KV bucket of device heartbeats (TTL offline_after_s), out of the audit stream."""
        return f"{self.stream}_LIVENESS"

    @property
    def claims_bucket(self) -> str:
        """KV bucket of keyed requests being answered (hpc_ds1.eventlog.claims), out of the audit
        stream."""
        return f"{self.stream}_CLAIMS"

    @property
    def audit_path(self) -> Path:
        return self.home / "audit.jsonl"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    # Issue 45, TLS: a site certificate is a pair; each named file must be there.
    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        given = {"HPC_DS1_TLS_CERT": self.tls_cert, "HPC_DS1_TLS_KEY": self.tls_key}
        if (self.tls_cert is None) != (self.tls_key is None):
            missing = next(name for name, value in given.items() if value is None)
            raise ValueError(
                f"a site certificate needs both HPC_DS1_TLS_CERT and HPC_DS1_TLS_KEY: set "
                f"{missing} too (serve --tls-cert/--tls-key)"
            )
        for name, value in given.items():
            if value is not None and not value.expanduser().is_file():
                raise ValueError(f"{name}: {value} is not a file (a PEM certificate or key)")
        return self
