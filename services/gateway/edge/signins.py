"""The console's sessions: what the browser's cookie names, kept in Postgres (issue 45).

The cookie holds a random session id (256 bits), never a bearer token: a stolen cookie is one
session, which ends by itself, and signing out ends it everywhere. Postgres keeps only the
id's SHA-256 and who the session acts as, so every gateway replica sees a sign-in, a sign-out
and an expiry at once (a signed cookie would need a key shared by the replicas and could not be
signed out).

A session ends
- when it was unused for HPC_DS1_CONSOLE_IDLE_S (default 30 min),
- HPC_DS1_CONSOLE_MAX_S after its sign-in (default 12 h), however busy,
- at sign-out (POST /signout),
- when the token it was opened with (a person's API token pasted in the sign-in form) is
  revoked or expires.

Every check and its extension are one statement (`UPDATE ... WHERE <alive> RETURNING`) on the
database's clock: a session found over is never extended, and is marked ended with why, so it
stays refused. Blocking (DB): call in a thread.

A session opened by a sign-in at the OpenID provider keeps that sign-in's ID token, for the
provider's sign-out (its `id_token_hint`, oidc.py): sealed with AES-GCM under a key derived
from the cookie's secret (which Postgres never holds), bound to the session's id, and cleared
the moment the session ends. A database dump reads no ID token, as it opens no session."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Final, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import Engine, delete, func, insert, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from hpc_ds1.db import tables
from hpc_ds1.log import get_logger
from hpc_ds1.security.tokens import Principal

log = get_logger("gateway.auth")

Via = Literal["token", "login-link", "oidc"]
# What a session id looks like (secrets.token_urlsafe(32)): anything else is refused unasked.
SECRET_PATTERN: Final = re.compile(r"^[A-Za-z0-9_\-]{43}$")
# Ended and expired rows are deleted this long after (kept a while: `why` answers a browser
# that comes back with an old cookie).
KEEP_ENDED_S: Final = 86400.0


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


# --- the ID token, sealed with the cookie's secret ---------------------------------------------

_SEAL_LABEL: Final = b"hpc-ds1 console session: id_token v1"
_SEAL_PREFIX: Final = "v1."


def _seal_key(secret: str) -> bytes:
    # Not the stored SHA-256 of the secret: another function of it, which the row never holds.
    return hmac.new(secret.encode("ascii"), _SEAL_LABEL, hashlib.sha256).digest()


def seal_id_token(secret: str, session_id: str, id_token: str) -> str:
    """`id_token` encrypted for this session only (AES-256-GCM, the session's id as associated
    data): readable again with the cookie's secret alone."""
    nonce = secrets.token_bytes(12)
    sealed = AESGCM(_seal_key(secret)).encrypt(
        nonce, id_token.encode("utf-8"), session_id.encode("ascii")
    )
    return _SEAL_PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")


def unseal_id_token(secret: str, session_id: str, sealed: str | None) -> str | None:
    """The ID token `seal_id_token` sealed; None when there is none or it does not open (another
    session's, tampered with, an unknown format)."""
    if not sealed or not sealed.startswith(_SEAL_PREFIX):
        return None
    try:
        raw = base64.urlsafe_b64decode(sealed[len(_SEAL_PREFIX) :].encode("ascii"))
        opened = AESGCM(_seal_key(secret)).decrypt(raw[:12], raw[12:], session_id.encode("ascii"))
    except (ValueError, InvalidTag):
        return None
    return opened.decode("utf-8", "replace")


@dataclass(frozen=True)
class Session:
    session_id: str  # public: safe to log
    name: str
    role: str
    via: str
    token_id: str | None = None
    identity: str | None = None

    def principal(self) -> Principal:
        """Who a request with this session acts as: the token's id when it was opened with a
        token (revoking it ends the session), else the session's own public id."""
        return Principal(
            name=self.name,
            role=self.role,
            token_id=self.token_id or self.session_id,
            session_id=self.session_id,
            identity=self.identity,
        )


# Alive: not ended, used within idle_s, opened within max_s, and its token (if any) active.
_ALIVE = """
    s.ended_at IS NULL
    AND s.last_seen_at > now() - make_interval(secs => :idle_s)
    AND s.created_at > now() - make_interval(secs => :max_s)
    AND (s.token_id IS NULL OR EXISTS (
        SELECT 1 FROM tokens t
        WHERE t.token_id = s.token_id AND NOT t.revoked
          AND (t.expires_at IS NULL OR t.expires_at > now())))
"""
_COLUMNS = "s.session_id, s.name, s.role, s.via, s.token_id, s.identity"
_TOUCH = text(
    f"UPDATE console_sessions s SET last_seen_at = now() WHERE s.sha256 = :sha256 AND {_ALIVE} "
    f"RETURNING {_COLUMNS}"
)
_PEEK = text(f"SELECT {_COLUMNS} FROM console_sessions s WHERE s.sha256 = :sha256 AND {_ALIVE}")
# Why a session is not alive (first match), for the sign-in page and the 401.
_WHY = text(
    """
    SELECT CASE
      WHEN s.ended_at IS NOT NULL THEN coalesce(s.ended_why, 'ended')
      WHEN s.created_at <= now() - make_interval(secs => :max_s) THEN 'expired'
      WHEN s.last_seen_at <= now() - make_interval(secs => :idle_s) THEN 'idle'
      ELSE 'token revoked'
    END AS why
    FROM console_sessions s WHERE s.sha256 = :sha256
    """
)

WHY_TEXT: Final[dict[str, str]] = {
    "signed out": "This browser signed out.",
    "expired": "The session reached its longest life (HPC_DS1_CONSOLE_MAX_S).",
    "idle": "The session was unused too long (HPC_DS1_CONSOLE_IDLE_S).",
    "token revoked": "The token this session was opened with was revoked or expired.",
    "ended": "The session was ended.",
    "replaced": "This browser signed in again since.",
    "unknown": "This browser's session is not known here.",
}


class SessionStore:
    def __init__(self, engine: Engine, idle_s: float, max_s: float) -> None:
        self.engine = engine
        self.idle_s = float(idle_s)
        self.max_s = float(max_s)

    def _binds(self, secret: str) -> dict[str, object]:
        return {"sha256": _hash(secret), "idle_s": self.idle_s, "max_s": self.max_s}

    def open(
        self,
        *,
        name: str,
        role: str,
        via: Via,
        token_id: str | None = None,
        identity: str | None = None,
        id_token: str | None = None,
    ) -> tuple[str, Session]:
        """A new session: (the cookie's secret, the session). Old ended rows are swept here.
        `id_token`: the ID token of a sign-in at the provider, kept sealed for its sign-out."""
        secret = secrets.token_urlsafe(32)
        session = Session("ses_" + uuid.uuid4().hex[:16], name, role, via, token_id, identity)
        sealed = seal_id_token(secret, session.session_id, id_token) if id_token else None
        cs = tables.console_sessions
        with self.engine.begin() as conn:
            conn.execute(
                insert(cs).values(
                    sha256=_hash(secret),
                    session_id=session.session_id,
                    name=name,
                    role=role,
                    via=via,
                    token_id=token_id,
                    identity=identity,
                    id_token_sealed=sealed,
                    created_at=func.now(),
                    last_seen_at=func.now(),
                )
            )
            conn.execute(
                delete(cs).where(
                    text("created_at < now() - make_interval(secs => :gone_s)").bindparams(
                        gone_s=self.max_s + KEEP_ENDED_S
                    )
                )
            )
        return secret, session

    def check(self, secret: str, *, touch: bool = True) -> Session | str:
        """The session, alive, and (touch) used now; else why not (a key of WHY_TEXT). A
        session found over is marked ended: it never comes back."""
        if not SECRET_PATTERN.match(secret):
            return "unknown"
        binds = self._binds(secret)
        with self.engine.begin() as conn:
            row = conn.execute(_TOUCH if touch else _PEEK, binds).first()
            if row is not None:
                return Session(
                    row.session_id, row.name, row.role, row.via, row.token_id, row.identity
                )
            why = conn.execute(_WHY, binds).scalar()
            if why is None:
                return "unknown"
            cs = tables.console_sessions
            conn.execute(
                update(cs)
                .where(cs.c.sha256 == binds["sha256"], cs.c.ended_at.is_(None))
                .values(ended_at=func.now(), ended_why=why, id_token_sealed=None)
            )
            return str(why)

    def end(self, secret: str, why: str = "signed out") -> Session | None:
        """End a session (sign-out); the session it was, or None when none was alive."""
        ended = self.sign_out(secret, why)
        return None if ended is None else ended[0]

    def sign_out(self, secret: str, why: str = "signed out") -> tuple[Session, str | None] | None:
        """End a session: the session it was and the ID token of its sign-in at the provider
        (None: it was not opened there), which the row forgets in the same statement; None when
        no session was alive."""
        if not SECRET_PATTERN.match(secret):
            return None
        with self.engine.begin() as conn:
            row = conn.execute(_END, {"sha256": _hash(secret), "why": why}).first()
        if row is None:
            return None
        session = Session(row.session_id, row.name, row.role, row.via, row.token_id, row.identity)
        return session, unseal_id_token(secret, session.session_id, row.id_token_sealed)


# Ends a session and hands back its sealed ID token as it was before the row forgets it
# (RETURNING gives the new row's values: the old one comes from the locked subquery).
_END = text(
    f"""
    UPDATE console_sessions s
    SET ended_at = now(), ended_why = :why, id_token_sealed = NULL
    FROM (SELECT sha256, id_token_sealed FROM console_sessions
          WHERE sha256 = :sha256 AND ended_at IS NULL FOR UPDATE) old
    WHERE s.sha256 = old.sha256
    RETURNING {_COLUMNS}, old.id_token_sealed
    """
)


# --- tokens' last use -------------------------------------------------------------------------

USE_RESOLUTION_S: Final = 60.0  # a token's last use is written at most this often per replica


def record_use(engine: Engine, token_id: str) -> None:
    """Note that `token_id` was used now (the database's clock). Blocking (DB)."""
    ta = tables.token_activity
    statement = pg_insert(ta).values(token_id=token_id, last_used_at=func.now())
    statement = statement.on_conflict_do_update(
        index_elements=[ta.c.token_id], set_={"last_used_at": statement.excluded.last_used_at}
    )
    with engine.begin() as conn:
        conn.execute(statement)


class UseLog:
    """Each token's last use, written at most every USE_RESOLUTION_S per token by this gateway,
    off the request's path (a write that fails is logged by the caller's task and retried at
    the next use)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._written: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def note(self, token_id: str) -> None:
        now = time.monotonic()
        if now - self._written.get(token_id, float("-inf")) < USE_RESOLUTION_S:
            return
        if len(self._written) > 100_000:  # bounded: forget, at worst one write more per token
            self._written.clear()
        self._written[token_id] = now
        task = asyncio.get_running_loop().create_task(self._write(token_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, token_id: str) -> None:
        try:
            await asyncio.to_thread(record_use, self.engine, token_id)
        except Exception as error:  # the next use tries again
            self._written.pop(token_id, None)
            log.warning("token_use_not_recorded", token_id=token_id, error=type(error).__name__)
