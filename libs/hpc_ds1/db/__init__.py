"""The Postgres projection: tables, engine, migrations."""

from . import tables
from .engine import make_engine, normalize_url
from .migrate import upgrade

__all__ = ["make_engine", "normalize_url", "tables", "upgrade"]
