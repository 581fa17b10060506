"""Run the alembic migrations of migrations/ (installed as hpc_ds1.migrations)."""

from __future__ import annotations

import importlib.util

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine


def script_location() -> str:
    """The folder of the migration scripts, which alembic loads itself. Found, not imported:
    the scripts import the tables (db), so migrations sit above db in the layers."""
    spec = importlib.util.find_spec("hpc_ds1.migrations")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("hpc_ds1.migrations is not installed: reinstall hpc-ds1")
    return str(next(iter(spec.submodule_search_locations)))


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", script_location())
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    command.upgrade(alembic_config(engine), revision)


def current(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
