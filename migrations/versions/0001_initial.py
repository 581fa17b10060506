"""initial projection: raw events, checkpoint, devices, measurements, models, decisions

Revision ID: 0001
Revises:
Create Date: 2026-11-30 03:25:36.144364
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "decisions",
        sa.Column("decision_id", sa.Text(), nullable=False),
        sa.Column("device_id", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("workload", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("config", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("choice", sa.Text(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("reasons", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("alternatives", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("model_version", sa.Text(), nullable=True),
        sa.Column("session_id", sa.Text(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("decision_id"),
    )
    op.create_index(op.f("ix_decisions_device_id"), "decisions", ["device_id"], unique=False)
    op.create_index(op.f("ix_decisions_session_id"), "decisions", ["session_id"], unique=False)
    op.create_table(
        "devices",
        sa.Column("device_id", sa.Text(), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("fingerprint", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("local", sa.Boolean(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("device_id"),
    )
    op.create_table(
        "events",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("event_id", sa.Text(), nullable=True),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("correlation_id", sa.Text(), nullable=True),
        sa.Column("causation_id", sa.Text(), nullable=True),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("valid", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("raw", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("event_id"),
    )
    op.create_index(op.f("ix_events_correlation_id"), "events", ["correlation_id"], unique=False)
    op.create_index(op.f("ix_events_subject"), "events", ["subject"], unique=False)
    op.create_index(op.f("ix_events_type"), "events", ["type"], unique=False)
    op.create_table(
        "measurements",
        sa.Column("measurement_id", sa.Text(), nullable=False),
        sa.Column("device_id", sa.Text(), nullable=False),
        sa.Column("workload", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("config", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("runtime_s", sa.Float(), nullable=True),
        sa.Column("throughput", sa.Float(), nullable=True),
        sa.Column("throughput_unit", sa.Text(), nullable=True),
        sa.Column("repeats", sa.Integer(), nullable=False),
        sa.Column("spread", sa.Float(), nullable=True),
        sa.Column("check_ok", sa.Boolean(), nullable=True),
        sa.Column("check_error", sa.Float(), nullable=True),
        sa.Column("held_out", sa.Boolean(), nullable=False),
        sa.Column("purpose", sa.Text(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("measurement_id"),
    )
    op.create_index(op.f("ix_measurements_device_id"), "measurements", ["device_id"], unique=False)
    op.create_index(op.f("ix_measurements_workload"), "measurements", ["workload"], unique=False)
    op.create_table(
        "models",
        sa.Column("model_version", sa.Text(), nullable=False),
        sa.Column("device_id", sa.Text(), nullable=False),
        sa.Column("artifact", sa.Text(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("metrics", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("trained_on", sa.Integer(), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("model_version"),
    )
    op.create_index(op.f("ix_models_device_id"), "models", ["device_id"], unique=False)
    op.create_table(
        "projection_checkpoint",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "projection_gaps",
        sa.Column("from_seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("to_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("from_seq"),
    )


def downgrade() -> None:

    op.drop_table("projection_gaps")
    op.drop_table("projection_checkpoint")
    op.drop_index(op.f("ix_models_device_id"), table_name="models")
    op.drop_table("models")
    op.drop_index(op.f("ix_measurements_workload"), table_name="measurements")
    op.drop_index(op.f("ix_measurements_device_id"), table_name="measurements")
    op.drop_table("measurements")
    op.drop_index(op.f("ix_events_type"), table_name="events")
    op.drop_index(op.f("ix_events_subject"), table_name="events")
    op.drop_index(op.f("ix_events_correlation_id"), table_name="events")
    op.drop_table("events")
    op.drop_table("devices")
    op.drop_index(op.f("ix_decisions_session_id"), table_name="decisions")
    op.drop_index(op.f("ix_decisions_device_id"), table_name="decisions")
    op.drop_table("decisions")
