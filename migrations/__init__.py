"""Alembic migrations of the projection database; run with `hpc-ds1 db upgrade`."""
