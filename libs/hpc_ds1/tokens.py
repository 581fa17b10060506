"""Bearer tokens and roles. A token is shown once at creation; only its SHA-256 is ever stored.

Roles for people are ordered viewer < engineer < admin. `agent` is a separate role for fleet
agents: it is not a person's role and satisfies only a need for `agent`."""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass
from typing import Final

from sqlalchemy import Engine, select

from .db import tables

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
    """The holder of a token that exists and is not revoked; None otherwise. Blocking (DB)."""
    if not TOKEN_PATTERN.match(token):
        return None
    t = tables.tokens
    query = select(t.c.token_id, t.c.holder, t.c.role).where(
        t.c.sha256 == token_hash(token),
        t.c.revoked.is_(False),
        t.c.role != "nats",  # a NATS subscriber's password is no bearer token
    )
    with engine.connect() as conn:
        row = conn.execute(query).first()
    if row is None:
        return None
    return Principal(name=row.holder, role=row.role, token_id=row.token_id)
