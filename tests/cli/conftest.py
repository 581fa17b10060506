"""Fixtures and helpers of the CLI tests that restore into, or compare, a second home."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_ds1.infra.nats_server import EmbeddedNats
from hpc_ds1.settings import Settings
from tests.support.databases import create_database, drop_database


@pytest.fixture
def target(tmp_path: Path, settings: Settings, postgres_url: str) -> Iterator[Settings]:
    """A new home, stream and database with the source's subject prefix, on a NATS server of
    its own (one server holds one stream per subject)."""
    database_url = create_database(postgres_url, "r")
    server = EmbeddedNats(tmp_path / "target-nats", sync="default")
    yield settings.model_copy(
        update={
            "home": tmp_path / "restored",
            "nats_url": server.start(),
            "stream": f"R_{uuid.uuid4().hex[:10]}",
            "database_url": database_url,
        }
    )
    server.stop()
    drop_database(postgres_url, database_url)
