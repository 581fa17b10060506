from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect

from hpc_ds1.db.migrate import alembic_config, current
from hpc_ds1.db.tables import metadata


def test_migrations_build_exactly_the_tables_the_code_uses(engine: Engine) -> None:
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []


def test_migrations_go_down_and_up_again(engine: Engine) -> None:
    config = alembic_config(engine)
    command.downgrade(config, "base")
    assert "events" not in inspect(engine).get_table_names()
    command.upgrade(config, "head")
    assert current(engine) == "0009"
    assert {"sessions", "approvals", "tokens", "evaluations", "tasks"} <= set(
        inspect(engine).get_table_names()
    )
