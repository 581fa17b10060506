"""join token limits: a token's expiry, its cap on uses, and the uses so far

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tokens", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("tokens", sa.Column("max_uses", sa.Integer(), nullable=True))
    op.add_column("tokens", sa.Column("uses", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("tokens", "uses")
    op.drop_column("tokens", "max_uses")
    op.drop_column("tokens", "expires_at")
