"""The Postgres projection: tables, engine, migrations."""

from .engine import make_engine, normalize_url
from .migrate import upgrade

__all__ = ["make_engine", "normalize_url", "upgrade"]
