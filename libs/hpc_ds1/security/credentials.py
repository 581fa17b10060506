"""The home's own credentials: the CLI's bearer token, the fleet's join token and the one-time
login token.

Layout (created on the home's first start, readable by its owner only):

    $HPC_DS1_HOME/credentials/            0700
    $HPC_DS1_HOME/credentials/cli.token   0600  the CLI's bearer token (role admin)
    $HPC_DS1_HOME/credentials/join.token  0600  the fleet's join token (role join)
    $HPC_DS1_HOME/credentials/login.sha256 0600 SHA-256 of the one-time login token

How the gateway knows the CLI token: on start the gateway reads `cli.token` (creating it when
missing) and, when its hash is not among the tokens, publishes a `token.created` event for it
(holder: the OS user that runs the home, role admin, token id `tok_` + the first 12 hex digits
of its hash, published only if that token's history is empty, so two gateways never register it
twice) and waits until the projector has folded it. A revoked CLI token is replaced by a new one
on the next start. The tokens table is the one place any credential is checked.

The join token is registered the same way (holder `fleet-join`, role join): an agent trades it,
once, for its own device credential (POST /v1/fleet/join). It is shown only on this machine:
`serve` prints the join command on its own terminal, `hpc-ds1 token join` reads the file, and
GET /v1/fleet/join-token serves it only to an admin calling from loopback. `hpc-ds1 token join
--rotate` revokes it and makes a new one; a revoked one is replaced on the next start.

A join token runs out, as kubeadm's bootstrap tokens do: its token.created event carries when it
expires and how many devices may join with it (`token join --rotate --ttl 24h --uses 10`; the
one `serve` makes: settings join_token_ttl_s and join_token_uses, 24 h and 10). Each join
appends token.used before the device is registered, only while the token's history in the log
shows it unexpired with a use left and with that history's last sequence expected, so no number
of gateways joining at once passes the cap. A join token that expired or was used up is
replaced on the next start like a revoked one; until then joins are refused, saying which.

The one-time login token (`serve` prints `http://HOST:PORT/?token=...`, `hpc-ds1 token login`
prints a fresh one) is stored only as its hash; the gateway accepts it once, mints a browser
token of role admin for the home's owner (a `token.created` event like any other: listed and
revocable with `hpc-ds1 token`) and sets it as an HttpOnly, SameSite=Strict cookie."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import hmac
import os
import re
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final, Literal

from sqlalchemy import Engine, select

from ..db import tables
from ..eventlog.bus import ConcurrencyConflict, EventBus
from ..events import Envelope, TokenCreated, TokenRevoked, TokenUsed, envelope, typed
from ..log import get_logger
from ..settings import Settings
from .tokens import HOLDER_PATTERN, new_token, new_token_id, token_hash

log = get_logger("credentials")

CREDENTIALS_DIR: Final = "credentials"
CLI_TOKEN_FILE: Final = "cli.token"
JOIN_TOKEN_FILE: Final = "join.token"
JOIN_HOLDER: Final = "fleet-join"
LOGIN_HASH_FILE: Final = "login.sha256"
_TOKEN_TEXT = re.compile(r"^[A-Za-z0-9_\-]{16,128}$")


def _setting_bounds(name: str) -> tuple[int, int]:
    """The (ge, le) bounds of a settings field: one place says what a join token may be."""
    metadata = Settings.model_fields[name].metadata
    low = next(int(m.ge) for m in metadata if getattr(m, "ge", None) is not None)
    high = next(int(m.le) for m in metadata if getattr(m, "le", None) is not None)
    return low, high


# A join token's lifetime (s) and number of uses: bounds and the defaults `serve` uses.
JOIN_TTL_S: Final = _setting_bounds("join_token_ttl_s")
JOIN_USES: Final = _setting_bounds("join_token_uses")
JOIN_TTL_DEFAULT_S: Final = float(Settings.model_fields["join_token_ttl_s"].default)
JOIN_USES_DEFAULT: Final = int(Settings.model_fields["join_token_uses"].default)
NEW_JOIN_TOKEN: Final = (
    "make a new one on the coordinator with `hpc-ds1 token join --rotate [--ttl 24h] [--uses 10]`"
)
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(?:\d{1,6}[smhd])+$")


def duration_text(seconds: float) -> str:
    """`90000` -> `1d1h`: the largest units, at most two."""
    left, parts = round(seconds), list[str]()
    for unit, size in sorted(_UNITS.items(), key=lambda kv: -kv[1]):
        if left >= size and len(parts) < 2:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def parse_ttl(text: str) -> float:
    """A join token's lifetime from `30m`, `24h`, `7d` or `1h30m` (units s, m, h, d), in
    seconds; ValueError saying what is allowed for anything else or out of bounds."""
    value = text.strip().lower()
    low, high = JOIN_TTL_S
    bounds = f"from {duration_text(low)} to {duration_text(high)}"
    if not _DURATION.match(value):
        raise ValueError(f"{text!r} is not a duration: use e.g. 30m, 24h or 7d ({bounds})")
    seconds = sum(int(n) * _UNITS[u] for n, u in re.findall(r"(\d+)([smhd])", value))
    if not low <= seconds <= high:
        raise ValueError(f"{text!r} is out of bounds: a join token lasts {bounds}")
    return float(seconds)


def parse_uses(text: str) -> int:
    """A join token's number of uses, within JOIN_USES; ValueError otherwise."""
    low, high = JOIN_USES
    try:
        uses = int(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number of uses ({low} to {high})") from None
    if not low <= uses <= high:
        raise ValueError(f"{uses} uses is out of bounds: a join token admits {low} to {high}")
    return uses


@dataclass(frozen=True)
class TokenLimits:
    """A token's expiry, cap and uses so far, from its history in the log (authoritative: what
    a join checks) or from its row in the tokens table (what is shown)."""

    token_id: str
    expires_at: datetime | None = None
    max_uses: int | None = None
    uses: int = 0
    revoked: bool = False

    @property
    def unlimited(self) -> bool:
        """Neither an expiry nor a use cap: a join token made before they existed."""
        return self.expires_at is None and self.max_uses is None

    @property
    def uses_left(self) -> int | None:
        return None if self.max_uses is None else max(0, self.max_uses - self.uses)

    def state(self, now: datetime | None = None) -> str:
        """'revoked', 'expired', 'spent' or 'active'."""
        if self.revoked:
            return "revoked"
        if self.expires_at is not None and (now or datetime.now(UTC)) >= self.expires_at:
            return "expired"
        if self.max_uses is not None and self.uses >= self.max_uses:
            return "spent"
        return "active"

    def problem(self, now: datetime | None = None) -> str | None:
        """Why the join token cannot be used now, and how to get a new one; None when it can."""
        state = self.state(now)
        what = f"the join token {self.token_id}"
        if state == "revoked":
            return f"{what} was revoked: {NEW_JOIN_TOKEN}"
        if state == "expired":
            assert self.expires_at is not None
            return f"{what} expired at {utc_text(self.expires_at)}: {NEW_JOIN_TOKEN}"
        if state == "spent":
            return f"{what} was used {self.uses} of {self.max_uses} times: {NEW_JOIN_TOKEN}"
        return None

    def describe(self, now: datetime | None = None) -> str:
        """`expires 2026-12-03 09:00:00 UTC (in 23h59m), 8 of 10 uses left`, or the problem."""
        problem = self.problem(now)
        if problem is not None:
            return problem
        parts = []
        if self.expires_at is not None:
            left = (self.expires_at - (now or datetime.now(UTC))).total_seconds()
            parts.append(f"expires {utc_text(self.expires_at)} (in {duration_text(left)})")
        else:
            parts.append("never expires")
        if self.max_uses is not None:
            parts.append(f"{self.uses_left} of {self.max_uses} uses left")
        else:
            parts.append("no cap on uses")
        return ", ".join(parts)


def utc_text(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def limits_of_history(history: list[tuple[int, Envelope]]) -> TokenLimits | None:
    """A token's limits from its events (token.created, .used, .revoked); None without its
    token.created."""
    limits: TokenLimits | None = None
    for _, env in history:
        event = typed(env)
        if isinstance(event, TokenCreated):
            limits = TokenLimits(event.token_id, event.expires_at, event.max_uses)
        elif limits is None:
            continue
        elif isinstance(event, TokenUsed):
            limits = TokenLimits(
                limits.token_id, limits.expires_at, limits.max_uses, limits.uses + 1, limits.revoked
            )
        elif isinstance(event, TokenRevoked):
            limits = TokenLimits(
                limits.token_id, limits.expires_at, limits.max_uses, limits.uses, True
            )
    return limits


def token_limits(engine: Engine, token: str) -> TokenLimits | None:
    """A registered token's limits as projected (None for an unknown token). Blocking (DB)."""
    t = tables.tokens
    query = select(t.c.token_id, t.c.expires_at, t.c.max_uses, t.c.uses, t.c.revoked).where(
        t.c.sha256 == token_hash(token)
    )
    with engine.connect() as conn:
        row = conn.execute(query).first()
    if row is None:
        return None
    return TokenLimits(row.token_id, row.expires_at, row.max_uses, row.uses, row.revoked)


class CredentialError(Exception):
    """A credential file that exists but cannot be used (wrong permissions, not a token)."""


def credentials_dir(home: Path) -> Path:
    """`$HPC_DS1_HOME/credentials`, created 0700 (and tightened to 0700 when it was wider)."""
    path = Path(home) / CREDENTIALS_DIR
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def cli_token_path(home: Path) -> Path:
    """Where the CLI reads its bearer token for this home's own server."""
    return Path(home) / CREDENTIALS_DIR / CLI_TOKEN_FILE


def owner_name() -> str:
    """The OS user running this process, as a token holder name (other characters become '_')."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "owner"
    name = re.sub(r"[^A-Za-z0-9_.@-]", "_", user)[:64] or "owner"
    return name if HOLDER_PATTERN.match(name) else "owner"


def _private_copy(path: Path, text: str) -> Path:
    """A new 0600 file beside `path` holding `text`, on disk: to be linked or renamed."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return tmp


def _write_new(path: Path, text: str) -> bool:
    """Create `path` (0600) holding `text` unless it exists: False when it already did."""
    tmp = _private_copy(path, text)
    try:
        os.link(tmp, path)  # atomic: fails when another process created it first
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    return True


def _replace(path: Path, text: str) -> None:
    """Write `path` (0600) holding `text`, replacing it atomically."""
    tmp = _private_copy(path, text)
    try:
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def read_cli_token(home: Path) -> str | None:
    """The CLI token of this home, or None when the home has none yet. Refuses a file that
    others can read (CredentialError), as ssh does with a private key."""
    return _read_token_file(cli_token_path(home))


def _read_token_file(path: Path) -> str | None:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    if mode & 0o077:
        raise CredentialError(
            f"{path} is readable by others (mode {mode & 0o777:o}): run `chmod 600 {path}`"
        )
    text = path.read_text().strip()
    if not _TOKEN_TEXT.match(text):
        raise CredentialError(f"{path} does not hold a token; delete it and restart `serve`")
    return text


def _ensure_token_file(home: Path, path: Path) -> str:
    """The token in `path`, created (0600, in a 0700 directory) when there is none."""
    credentials_dir(home)
    found = _read_token_file(path)
    if found is not None:
        return found
    _write_new(path, new_token())
    token = _read_token_file(path)
    assert token is not None
    return token


def _rotate_token_file(home: Path, path: Path) -> str:
    """Put a new token in `path` (the old one stays valid until revoked)."""
    credentials_dir(home)
    token = new_token()
    _replace(path, token)
    return token


def ensure_cli_token(home: Path) -> str:
    """The home's CLI token, created (0600, in a 0700 directory) when it has none."""
    return _ensure_token_file(home, cli_token_path(home))


def rotate_cli_token(home: Path) -> str:
    """Replace the CLI token by a new one (the old one stays valid until revoked)."""
    return _rotate_token_file(home, cli_token_path(home))


def cli_token_id(token: str) -> str:
    """The CLI token's public id: derived from its hash, so registering it is idempotent."""
    return "tok_" + token_hash(token)[:12]


def join_token_path(home: Path) -> Path:
    """Where this home keeps the fleet's join token."""
    return Path(home) / CREDENTIALS_DIR / JOIN_TOKEN_FILE


def read_join_token(home: Path) -> str | None:
    """The join token of this home, or None when it has none yet (refused like the CLI token
    when others can read the file)."""
    return _read_token_file(join_token_path(home))


def ensure_join_token(home: Path) -> str:
    """The home's join token, created (0600, in a 0700 directory) when it has none."""
    return _ensure_token_file(home, join_token_path(home))


def rotate_join_token(home: Path) -> str:
    """Replace the join token file by a new token (register it, revoke the old one)."""
    return _rotate_token_file(home, join_token_path(home))


# What a join token in the file needs to be replaced by a new one on `serve`'s start.
DEAD: Final = frozenset({"revoked", "expired", "spent"})


def current_join_token(home: Path, engine: Engine) -> str:
    """The join token to show: the file's, replaced by a new one when it was revoked, expired
    or used up (the gateway registers it when it starts). Blocking (file, DB)."""
    token = ensure_join_token(home)
    if token_state(engine, token) in DEAD:
        token = rotate_join_token(home)
    return token


def join_token_id(token: str) -> str:
    """The join token's public id, derived from its hash like the CLI token's."""
    return cli_token_id(token)


def reachable_host(bind_host: str) -> str:
    """A host other machines can use for a server bound to `bind_host`: this machine's address
    on its default route for a wildcard bind (no packet is sent), else the bind host itself."""
    if bind_host not in ("0.0.0.0", "::", ""):
        return f"[{bind_host}]" if ":" in bind_host else bind_host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the route
            address = str(probe.getsockname()[0])
        if address and not address.startswith("127.") and address != "0.0.0.0":
            return address
    except OSError:
        pass
    return socket.gethostname() or "127.0.0.1"


def join_command(server: str, token: str, ca_pin: str | None = None) -> str:
    """The command that joins a device to the coordinator at `server`; with the CA pin of an
    HTTPS coordinator (kubeadm's --discovery-token-ca-cert-hash), which the agent checks."""
    command = f"hpc-ds1 agent --server {server.rstrip('/')} --token {token}"
    return f"{command} --ca-cert-hash {ca_pin}" if ca_pin else command


def _loopback_bind(host: str) -> bool:
    return host.startswith("127.") or host in ("localhost", "::1")


def serves_tls(settings: Settings, configured_only: bool = True) -> bool:
    """Whether the gateway of these settings serves HTTPS to other machines (issue 45): bound
    beyond loopback, TLS not turned off, and (`configured_only`) a certificate in the settings,
    as `serve` puts the home's own there; without `configured_only`: whether `serve` will."""
    if settings.tls == "off" or _loopback_bind(settings.host):
        return False
    return not configured_only or settings.tls_cert is not None


def public_server(settings: Settings, port: int | None = None) -> str:
    """The URL other machines reach this gateway at: https when it serves TLS."""
    scheme = "https" if serves_tls(settings) else "http"
    port = port or settings.port
    host = reachable_host(settings.host)
    return f"{scheme}://{host}:{port}" if port else f"{scheme}://{host}"


def join_pin(settings: Settings) -> str | None:
    """The pin a join command carries: the home's CA's when the gateway serves the home's own
    certificate; None for plain HTTP and for a site certificate (agents then verify it against
    their system trust store)."""
    if not serves_tls(settings) or settings.tls_cert is None:
        return None
    from ..infra.tls import HomeTLS, home_pin

    own = HomeTLS.of(settings.home).cert
    if Path(settings.tls_cert).resolve() != own.resolve():
        return None
    return home_pin(settings.home)


def new_login_token(home: Path) -> str:
    """A fresh one-time login token; only its hash is kept (replacing any earlier one)."""
    token = new_token()
    _replace(credentials_dir(home) / LOGIN_HASH_FILE, token_hash(token))
    return token


def consume_login_token(home: Path, token: str) -> bool:
    """True exactly once for the current one-time login token; False for anything else."""
    path = Path(home) / CREDENTIALS_DIR / LOGIN_HASH_FILE
    try:
        expected = path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return False
    if not expected or not hmac.compare_digest(expected, token_hash(token)):
        return False
    # Of two requests with the right token, only the one whose unlink succeeds gets in.
    claimed = path.with_name(f".{LOGIN_HASH_FILE}.{uuid.uuid4().hex}")
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return False
    try:
        return hmac.compare_digest(claimed.read_text().strip(), token_hash(token))
    finally:
        with contextlib.suppress(FileNotFoundError):
            claimed.unlink()


def token_state(engine: Engine, token: str) -> str | None:
    """'active', 'revoked', 'expired' or 'spent' (the last two: a join token past its limits, as
    projected) for a registered token, None for an unknown one. Blocking (DB)."""
    limits = token_limits(engine, token)
    return None if limits is None else limits.state()


async def publish_token(
    bus: EventBus,
    engine: Engine,
    token: str,
    *,
    holder: str,
    role: Literal["viewer", "engineer", "admin", "agent", "join"],
    token_id: str | None = None,
    source: str = "gateway",
    wait_s: float = 10.0,
    ttl_s: float | None = None,
    max_uses: int | None = None,
) -> bool:
    """Register `token` (a token.created event) and wait up to `wait_s` for the projector to
    fold it. With a `token_id`, only when that token has no history yet (idempotent). True once
    the token is active. `ttl_s`, `max_uses`: a join token's limits (None: none)."""
    expires_at = None if ttl_s is None else datetime.now(UTC) + timedelta(seconds=ttl_s)
    event = TokenCreated(
        token_id=token_id or new_token_id(),
        holder=holder,
        role=role,
        sha256=token_hash(token),
        expires_at=expires_at,
        max_uses=max_uses,
    )
    env = envelope(event, actor=holder, source=source, prefix=bus.prefix)
    try:
        await bus.publish(env, expected_version=0 if token_id else None)
    except ConcurrencyConflict:
        pass  # registered already (another gateway of this home): wait for its projection
    return await wait_active(engine, token, wait_s)


async def wait_active(engine: Engine, token: str, wait_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        if await asyncio.to_thread(token_state, engine, token) == "active":
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.05)


async def register_cli_token(
    bus: EventBus, engine: Engine, home: Path, wait_s: float = 30.0
) -> bool:
    """Make sure the home's CLI token exists and is an active admin token of the home's owner
    (see the module docstring). True once it is active; False when the projector did not fold
    it within `wait_s` (it will later, once a projector runs)."""
    token = await asyncio.to_thread(ensure_cli_token, home)
    state = await asyncio.to_thread(token_state, engine, token)
    if state == "active":
        return True
    if state == "revoked":
        token = await asyncio.to_thread(rotate_cli_token, home)
        log.info("cli_token_rotated", reason="the previous one was revoked")
    holder = owner_name()
    active = await publish_token(
        bus,
        engine,
        token,
        holder=holder,
        role="admin",
        token_id=cli_token_id(token),
        wait_s=wait_s,
    )
    log.info("cli_token_registered", token_id=cli_token_id(token), holder=holder, active=active)
    return active


async def register_join_token(
    bus: EventBus,
    engine: Engine,
    home: Path,
    wait_s: float = 30.0,
    *,
    ttl_s: float = JOIN_TTL_DEFAULT_S,
    uses: int = JOIN_USES_DEFAULT,
) -> bool:
    """Make sure the home's join token exists and is an active token of role join, holder
    `fleet-join` (created, registered and replaced when revoked, expired, used up or without
    either limit, as one made before join tokens ran out; a new one
    lasts `ttl_s` and admits `uses` devices). True once it is active. The token itself is never
    logged; only its public id."""
    token = await asyncio.to_thread(ensure_join_token, home)
    limits = await asyncio.to_thread(token_limits, engine, token)
    state = None if limits is None else limits.state()
    if limits is not None and state == "active" and limits.unlimited:
        # registered before join tokens ran out: it would admit anyone, forever
        state = "without expiry or use cap"
    if state == "active":
        return True
    if state is not None:
        token = await asyncio.to_thread(rotate_join_token, home)
        log.info("join_token_rotated", reason=f"the previous one was {state}")
    active = await publish_token(
        bus,
        engine,
        token,
        holder=JOIN_HOLDER,
        role="join",
        token_id=join_token_id(token),
        wait_s=wait_s,
        ttl_s=ttl_s,
        max_uses=uses,
    )
    log.info("join_token_registered", token_id=join_token_id(token), active=active)
    return active


def _origin(url: str) -> tuple[str, str]:
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    return parts.scheme.lower(), parts.netloc.lower()


def bearer_for(home: Path, server: str, explicit: str | None) -> str | None:
    """The token a CLI command sends to `server`: an explicit `--token` wins; else the home's
    CLI token when `server` is this home's own gateway (never another server's); else None."""
    if explicit:
        return explicit
    from ..infra.home import running_owner

    owner = running_owner(home)
    if owner is None or not owner.gateway_url:
        return None
    if _origin(owner.gateway_url) != _origin(server):
        return None
    return read_cli_token(home)
