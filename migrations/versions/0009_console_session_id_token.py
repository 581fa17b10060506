"""console sessions keep the ID token of a sign-in at the OpenID provider, sealed, for the
provider's sign-out (issue 45: RP-Initiated Logout's id_token_hint)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-08 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("console_sessions", sa.Column("id_token_sealed", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("console_sessions", "id_token_sealed")
