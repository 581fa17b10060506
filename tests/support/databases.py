"""A Postgres database of its own, on the session's server: per test (tests/conftest.py's
`database_url`), per module or per package (a stack shared by a folder's tests)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy.engine import make_url


def libpq(url: str) -> str:
    """`url` as libpq takes it (SQLAlchemy's driver name dropped)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_database(postgres_url: str, prefix: str) -> str:
    """A new, empty database named `prefix`_<random hex> on the server of `postgres_url`; its
    URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_url(postgres_url).set(database=name).render_as_string(hide_password=False)


def drop_database(postgres_url: str, url: str) -> None:
    """Drop the database of `url`, whoever is still connected to it."""
    name = make_url(url).database
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def fresh_database(postgres_url: str, prefix: str) -> Iterator[str]:
    """A new database for the block, dropped after it."""
    url = create_database(postgres_url, prefix)
    try:
        yield url
    finally:
        drop_database(postgres_url, url)
