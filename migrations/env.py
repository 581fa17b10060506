"""Alembic environment: the engine from hpc_ds1 (config.attributes) or HPC_DS1_DATABASE_URL."""

from __future__ import annotations

import os

from alembic import context

from hpc_ds1.db.engine import make_engine
from hpc_ds1.db.tables import metadata

config = context.config


def run_migrations_online() -> None:
    engine = config.attributes.get("engine")
    if engine is None:
        url = os.environ.get("HPC_DS1_DATABASE_URL")
        if not url:
            raise SystemExit("set HPC_DS1_DATABASE_URL or run `hpc-ds1 db upgrade`")
        engine = make_engine(url)
    with engine.begin() as connection:
        context.configure(connection=connection, target_metadata=metadata)
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `hpc-ds1 db upgrade`")
run_migrations_online()
