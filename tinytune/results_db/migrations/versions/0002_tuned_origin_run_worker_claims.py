"""Schema 2: tuned entries carry the kernel name, workload and params that made them (so a cache file can be re-run elsewhere);
runs record their worker (host:pid) and their signature becomes TEXT (signatures outgrew 256 characters, which PostgreSQL
enforces); workers sharing a study claim candidates in `claims` before measuring them.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
  with op.batch_alter_table("tuned") as batch:
    batch.add_column(sa.Column("kernel_name", sa.String(256), nullable=False, server_default=""))
    batch.add_column(sa.Column("workload", sa.String(128), nullable=False, server_default=""))
    batch.add_column(sa.Column("params", sa.Text, nullable=False, server_default="{}"))
  with op.batch_alter_table("runs") as batch:
    batch.add_column(sa.Column("worker", sa.String(256), nullable=False, server_default=""))
    batch.alter_column("signature", type_=sa.Text, existing_type=sa.String(256), existing_nullable=False)
  op.create_table("claims", sa.Column("id", sa.Integer, primary_key=True), sa.Column("study", sa.String(256), nullable=False),
                  sa.Column("kernel_id", sa.Integer, sa.ForeignKey("kernels.id"), nullable=False),
                  sa.Column("device_id", sa.Integer, sa.ForeignKey("devices.id"), nullable=False),
                  sa.Column("source_hash", sa.String(64), nullable=False),
                  sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), nullable=False),
                  sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
                  sa.UniqueConstraint("study", "kernel_id", "device_id", "source_hash", name="uq_claims_study_kernel_device_source"))
  # fill in what the old entries' runs and kernels know
  op.execute("UPDATE tuned SET workload = (SELECT runs.workload FROM runs WHERE runs.id = tuned.run_id), "
             "params = (SELECT runs.params FROM runs WHERE runs.id = tuned.run_id) WHERE run_id IN (SELECT id FROM runs)")
  op.execute("UPDATE tuned SET kernel_name = (SELECT kernels.name FROM kernels WHERE kernels.key = tuned.kernel_key) "
             "WHERE kernel_key IN (SELECT key FROM kernels)")
  op.execute("UPDATE meta SET schema_version = 2")


def downgrade() -> None:
  op.drop_table("claims")
  with op.batch_alter_table("runs") as batch:
    batch.drop_column("worker")
    batch.alter_column("signature", type_=sa.String(256), existing_type=sa.Text, existing_nullable=False)
  with op.batch_alter_table("tuned") as batch:
    for column in ("params", "workload", "kernel_name"): batch.drop_column(column)
  op.execute("UPDATE meta SET schema_version = 1")
