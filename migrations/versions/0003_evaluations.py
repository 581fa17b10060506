"""evaluations: the measured quality of each model on held-out sizes

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "evaluations",
        sa.Column("evaluation_id", sa.Text(), nullable=False),
        sa.Column("device_id", sa.Text(), nullable=False),
        sa.Column("model_version", sa.Text(), nullable=False),
        sa.Column("profile", sa.Text(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("landscape_runs", sa.Integer(), nullable=False),
        sa.Column("results", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("plots", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("evaluation_id"),
    )
    op.create_index(op.f("ix_evaluations_device_id"), "evaluations", ["device_id"], unique=False)
    op.create_index(
        op.f("ix_evaluations_model_version"), "evaluations", ["model_version"], unique=False
    )


def downgrade() -> None:

    op.drop_index(op.f("ix_evaluations_model_version"), table_name="evaluations")
    op.drop_index(op.f("ix_evaluations_device_id"), table_name="evaluations")
    op.drop_table("evaluations")
