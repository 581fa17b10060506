"""projection_set_aside: events Postgres refused, kept with the reason so the projector goes on

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "projection_set_aside",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("event_id", sa.Text(), nullable=True),
        sa.Column("type", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("raw", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
    )


def downgrade() -> None:
    op.drop_table("projection_set_aside")
