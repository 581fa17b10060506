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
from pathlib import Path
from typing import Final, Literal

from sqlalchemy import Engine, select

from .bus import ConcurrencyConflict, EventBus
from .db import tables
from .events import TokenCreated, envelope
from .log import get_logger
from .tokens import HOLDER_PATTERN, new_token, new_token_id, token_hash

log = get_logger("credentials")

CREDENTIALS_DIR: Final = "credentials"
CLI_TOKEN_FILE: Final = "cli.token"
JOIN_TOKEN_FILE: Final = "join.token"
JOIN_HOLDER: Final = "fleet-join"
LOGIN_HASH_FILE: Final = "login.sha256"
_TOKEN_TEXT = re.compile(r"^[A-Za-z0-9_\-]{16,128}$")


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


def current_join_token(home: Path, engine: Engine) -> str:
    """The join token to show: the file's, replaced by a new one when it was revoked (the
    gateway registers it when it starts). Blocking (file, DB)."""
    token = ensure_join_token(home)
    if token_state(engine, token) == "revoked":
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


def join_command(server: str, token: str) -> str:
    """The command that joins a device to the coordinator at `server`."""
    return f"hpc-ds1 agent --server {server.rstrip('/')} --token {token}"


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
    """'active' or 'revoked' for a registered token, None for an unknown one. Blocking (DB)."""
    t = tables.tokens
    with engine.connect() as conn:
        row = conn.execute(select(t.c.revoked).where(t.c.sha256 == token_hash(token))).first()
    if row is None:
        return None
    return "revoked" if row.revoked else "active"


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
) -> bool:
    """Register `token` (a token.created event) and wait up to `wait_s` for the projector to
    fold it. With a `token_id`, only when that token has no history yet (idempotent). True once
    the token is active."""
    event = TokenCreated(
        token_id=token_id or new_token_id(), holder=holder, role=role, sha256=token_hash(token)
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
    bus: EventBus, engine: Engine, home: Path, wait_s: float = 30.0
) -> bool:
    """Make sure the home's join token exists and is an active token of role join, holder
    `fleet-join` (created, registered and replaced when revoked like the CLI token). True once
    it is active. The token itself is never logged; only its public id."""
    token = await asyncio.to_thread(ensure_join_token, home)
    state = await asyncio.to_thread(token_state, engine, token)
    if state == "active":
        return True
    if state == "revoked":
        token = await asyncio.to_thread(rotate_join_token, home)
        log.info("join_token_rotated", reason="the previous one was revoked")
    active = await publish_token(
        bus,
        engine,
        token,
        holder=JOIN_HOLDER,
        role="join",
        token_id=join_token_id(token),
        wait_s=wait_s,
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
    from .infra.home import running_owner

    owner = running_owner(home)
    if owner is None or not owner.gateway_url:
        return None
    if _origin(owner.gateway_url) != _origin(server):
        return None
    return read_cli_token(home)
