"""Schema 3: `peaks`, each device's peak GFLOPS and GB/s as tinytune's probe measured them (the roof of a report's roofline).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
  op.create_table("peaks", sa.Column("id", sa.Integer, primary_key=True),
                  sa.Column("device_id", sa.Integer, sa.ForeignKey("devices.id"), nullable=False, unique=True),
                  sa.Column("gflops", sa.Float, nullable=False), sa.Column("gbs", sa.Float, nullable=False),
                  sa.Column("probe", sa.Text, nullable=False, server_default=""),
                  sa.Column("created_at", sa.DateTime(timezone=True), nullable=False))
  op.execute("UPDATE meta SET schema_version = 3")


def downgrade() -> None:
  op.drop_table("peaks")
  op.execute("UPDATE meta SET schema_version = 2")
