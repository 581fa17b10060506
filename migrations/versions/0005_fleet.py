"""fleet: tasks, and the devices' draining flag and liveness

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 12:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "devices", sa.Column("draining", sa.Boolean(), nullable=False, server_default="false")
    )
    op.add_column("devices", sa.Column("liveness", sa.Text(), nullable=True))
    op.add_column("devices", sa.Column("liveness_reason", sa.Text(), nullable=True))
    op.create_table(
        "tasks",
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("workload", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("submitted_by", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("device_id", sa.Text(), nullable=True),
        sa.Column("config", postgresql.JSONB(), nullable=True),
        sa.Column("expected_s", sa.Float(), nullable=True),
        sa.Column("queue_s", sa.Float(), nullable=True),
        sa.Column("basis", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("runner_up", sa.Text(), nullable=True),
        sa.Column("placement", postgresql.JSONB(), nullable=True),
        sa.Column("runtime_s", sa.Float(), nullable=True),
        sa.Column("measurement_id", sa.Text(), nullable=True),
        sa.Column("failures", postgresql.JSONB(), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("placed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("task_id"),
    )
    op.create_index("ix_tasks_status", "tasks", ["status"])
    op.create_index("ix_tasks_device_id", "tasks", ["device_id"])


def downgrade() -> None:
    op.drop_index("ix_tasks_device_id", table_name="tasks")
    op.drop_index("ix_tasks_status", table_name="tasks")
    op.drop_table("tasks")
    op.drop_column("devices", "liveness_reason")
    op.drop_column("devices", "liveness")
    op.drop_column("devices", "draining")
