"""A home of embedded servers for the infra tests: its settings, whatever HPC_DS1_* the environment
sets, and its database URLs as libpq (psycopg) reads them. Shared by the tests of this folder."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url

from hpc_ds1.settings import Settings


def home_settings(home: Path) -> Settings:
    """Embedded servers on `home`, whatever HPC_DS1_* the environment sets."""
    return Settings(
        home=home,
        nats_url=None,
        database_url=None,
        nats_sync="default",
        port=0,
        log_json=True,
        log_level="warning",
    )


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
