"""console sessions, sign-ins at the OpenID provider under way, tokens' last use (issue 45)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07 13:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("sha256", sa.Text(), primary_key=True),
        sa.Column("session_id", sa.Text(), nullable=False, unique=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("token_id", sa.Text(), nullable=True),
        sa.Column("identity", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_why", sa.Text(), nullable=True),
    )
    op.create_index("ix_console_sessions_ended_at", "console_sessions", ["ended_at"])
    op.create_table(
        "oidc_logins",
        sa.Column("state_sha256", sa.Text(), primary_key=True),
        sa.Column("verifier", sa.Text(), nullable=False),
        sa.Column("nonce", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_oidc_logins_created_at", "oidc_logins", ["created_at"])
    op.create_table(
        "token_activity",
        sa.Column("token_id", sa.Text(), primary_key=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("token_activity")
    op.drop_index("ix_oidc_logins_created_at", "oidc_logins")
    op.drop_table("oidc_logins")
    op.drop_index("ix_console_sessions_ended_at", "console_sessions")
    op.drop_table("console_sessions")
