"""Fixtures and helpers of the CLI tests that restore into, or compare, a second home."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from hpc_ds1.infra.nats_server import EmbeddedNats
from hpc_ds1.settings import Settings


@pytest.fixture
def target(tmp_path: Path, settings: Settings, postgres_url: str) -> Iterator[Settings]:
    """A new home, stream and database with the source's subject prefix, on a NATS server of
    its own (one server holds one stream per subject)."""
    name = f"r_{uuid.uuid4().hex[:12]}"
    libpq = make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    server = EmbeddedNats(tmp_path / "target-nats", sync="default")
    yield settings.model_copy(
        update={
            "home": tmp_path / "restored",
            "nats_url": server.start(),
            "stream": f"R_{uuid.uuid4().hex[:10]}",
            "database_url": make_url(postgres_url).set(database=name).render_as_string(False),
        }
    )
    server.stop()
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
