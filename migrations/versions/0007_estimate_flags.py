"""estimate flags: a finished task far from its device's own estimate, and the device's count

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("off_estimate", sa.Text(), nullable=True))
    op.add_column(
        "devices",
        sa.Column("off_estimates", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column("devices", sa.Column("off_estimate", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("devices", "off_estimate")
    op.drop_column("devices", "off_estimates")
    op.drop_column("tasks", "off_estimate")
