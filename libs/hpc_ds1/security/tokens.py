"""Bearer tokens and roles. A token is shown once at creation; only its SHA-256 is ever stored.

Roles for people are ordered viewer < engineer < admin. `agent` is a separate role for fleet
agents: it is not a person's role and satisfies only a need for `agent`."""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from sqlalchemy import Engine, func, or_, select

from ..db import tables

TOKEN_PREFIX: Final = "hds1_"
ROLES: Final[tuple[str, ...]] = ("viewer", "engineer", "admin", "agent", "join")
PERSON_ROLES: Final[tuple[str, ...]] = ("viewer", "engineer", "admin")
_RANK: Final[dict[str, int]] = {"viewer": 1, "engineer": 2, "admin": 3}
HOLDER_PATTERN: Final = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
HOLDER_RULE: Final = "1 to 64 of letters, digits, '_', '.', '@' or '-'"
# What a bearer token can look like (ours are hds1_ + 43 url-safe characters): anything else is
# refused before it is hashed or looked up.
TOKEN_PATTERN: Final = re.compile(r"^[A-Za-z0-9_\-]{16,128}$")


@dataclass(frozen=True)
class Principal:
    """Who a request or command acts as: the holder of a registered, unrevoked token. There is
    no anonymous principal: every API call but health and the login exchange carries a token."""

    name: str
    role: str
    token_id: str
    # When the token stops working (None: never); the gateway's cache keeps it no longer.
    expires_at: datetime | None = None
    # A console session (the browser's cookie): its public id, and the person's identity at
    # the site's OpenID provider ('<issuer>#<sub>') when signed in there. Approvals record it.
    session_id: str | None = None
    identity: str | None = None


def new_token() -> str:
    """A fresh bearer token (256 bits of randomness)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_token_id() -> str:
    """A public id for a token: safe to show, list and log (a subject token, too)."""
    return "tok_" + uuid.uuid4().hex[:12]


def token_hash(token: str) -> str:
    """The SHA-256 hex digest under which a token is stored and looked up."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def role_allows(have: str, need: str) -> bool:
    """Whether a holder of role `have` may do what needs `need`."""
    if have == need:
        return need in ROLES
    if have in _RANK and need in _RANK:
        return _RANK[have] >= _RANK[need]
    return False


def lookup(engine: Engine, token: str) -> Principal | None:
    """The holder of a token that exists, is not revoked and has not expired; None otherwise.
    Blocking (DB). A join token's expiry is the join route's to tell (with its own message,
    from the token's history: services/gateway/api/fleet.py)."""
    if not TOKEN_PATTERN.match(token):
        return None
    t = tables.tokens
    query = select(t.c.token_id, t.c.holder, t.c.role, t.c.expires_at).where(
        t.c.sha256 == token_hash(token),
        t.c.revoked.is_(False),
        t.c.role != "nats",  # a NATS subscriber's password is no bearer token
        # The database's clock: one clock for every gateway replica.
        or_(t.c.role == "join", t.c.expires_at.is_(None), t.c.expires_at > func.now()),
    )
    with engine.connect() as conn:
        row = conn.execute(query).first()
    if row is None:
        return None
    expires = row.expires_at if row.role != "join" else None
    return Principal(name=row.holder, role=row.role, token_id=row.token_id, expires_at=expires)


# A token's expiry (`hpc-ds1 token create --expires`, issue 45): a duration from now, or a
# UTC date or time.
EXPIRY_RULE: Final = (
    "a duration from now such as 30m, 12h, 30d, 8w or 1d12h (units s, m, h, d, w; 1 minute to "
    "5 years), or a date or time such as 2027-06-30 or 2027-06-30T18:00Z (UTC unless a zone "
    "is given)"
)
_DURATION: Final = re.compile(r"^(?:\d{1,6}[smhdw])+$")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
EXPIRY_MIN_S: Final = 60
EXPIRY_MAX_S: Final = 5 * 366 * 86400


def parse_expiry(text: str, now: datetime | None = None) -> datetime:
    """When a token made now with `--expires TEXT` stops working (aware, UTC); ValueError
    naming what was wrong and what is accepted."""
    now = now or datetime.now(UTC)
    value = text.strip().lower()
    if _DURATION.match(value):
        seconds = sum(int(n) * _UNIT_S[u] for n, u in re.findall(r"(\d+)([smhdw])", value))
        when = now + timedelta(seconds=seconds)
    else:
        try:
            when = datetime.fromisoformat(text.strip().replace("z", "Z"))
        except ValueError:
            raise ValueError(f"{text!r} is not an expiry: use {EXPIRY_RULE}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        when = when.astimezone(UTC)
    ahead = (when - now).total_seconds()
    if ahead < EXPIRY_MIN_S:
        raise ValueError(f"{text!r} is in the past or under a minute away: use {EXPIRY_RULE}")
    if ahead > EXPIRY_MAX_S:
        raise ValueError(f"{text!r} is more than 5 years away: use {EXPIRY_RULE}")
    return when
