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


# libpq waits on a connect for as long as the OS does (minutes, to an address that stopped
# answering); a service stopping beside its database must not hang on one.
CONNECT_TIMEOUT_S = 10


def make_engine(url: str, pool_size: int = 5) -> Engine:
    """An engine with pre-pinged connections and a bounded connect (the URL's own
    connect_timeout wins)."""
    normalized = normalize_url(url)
    timeout = (
        {}
        if "connect_timeout" in make_url(normalized).query
        else {"connect_timeout": CONNECT_TIMEOUT_S}
    )
    return create_engine(normalized, pool_size=pool_size, pool_pre_ping=True, connect_args=timeout)
