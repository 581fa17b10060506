"""Engines for the projection database."""

from __future__ import annotations

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url


def normalize_url(url: str) -> str:
    """Accept postgres://, postgresql:// or postgresql+psycopg:// and use psycopg 3."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1))
    if parsed.drivername not in ("postgresql", "postgresql+psycopg"):
        raise ValueError(
            f"database URL scheme {parsed.drivername!r} is not supported: use postgresql://"
        )
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def make_engine(url: str, pool_size: int = 5) -> Engine:
    return create_engine(normalize_url(url), pool_size=pool_size, pool_pre_ping=True)
