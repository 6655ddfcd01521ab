"""The first schema (SCHEMA_VERSION 1): devices, kernels, runs, candidates, tuned, baselines, meta.

Revision ID: 0001
Revises:
Create Date: 2026-11-22"""
from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STATUSES = ("ok", "wrong", "crashed", "timeout", "compile_error", "invalid")


def col(name: str, kind: Any, *args: Any, null: bool = False, **kwargs: Any) -> sa.Column:
  return sa.Column(name, kind, *args, nullable=null, **kwargs)


def upgrade() -> None:
  i, s, text, t = sa.Integer, sa.String, sa.Text, sa.DateTime(timezone=True)
  op.create_table("meta", col("id", i, primary_key=True), col("schema_version", i))
  op.create_table("devices", col("id", i, primary_key=True), col("fingerprint_hash", s(64), unique=True), col("kind", s(32)), col("name", s(256)),
                  col("arch", s(128)), col("compiler", s(256)), col("compiler_version", s(256)), col("flags", text), col("codegen_version", s(64)),
                  col("fingerprint", text))
  op.create_table("kernels", col("id", i, primary_key=True), col("key", s(64), unique=True), col("name", s(256)), col("ast_text", text),
                  col("sizes", text), col("dtypes", text), col("flops", sa.BigInteger), col("nbytes", sa.BigInteger))
  op.create_table("tuned", col("id", i, primary_key=True), col("kernel_key", s(64)), col("device_hash", s(64)), col("opts", text),
                  col("best_s", sa.Float), col("default_s", sa.Float, null=True), col("run_id", i, null=True), col("updated_at", t),
                  sa.UniqueConstraint("kernel_key", "device_hash", name="uq_tuned_kernel_device"))
  op.create_table("runs", col("id", i, primary_key=True), col("workload", s(128)), col("params", text),
                  col("device_id", i, sa.ForeignKey("devices.id")), col("strategy", s(64)), col("settings", text), col("budget", text),
                  col("signature", s(256)), col("started_at", t), col("ended_at", t, null=True), col("outcome", s(32), null=True))
  op.create_index("ix_runs_device_id", "runs", ["device_id"])
  op.create_index("ix_runs_signature", "runs", ["signature"])
  op.create_table("candidates", col("id", i, primary_key=True), col("run_id", i, sa.ForeignKey("runs.id")),
                  col("kernel_id", i, sa.ForeignKey("kernels.id")), col("device_id", i, sa.ForeignKey("devices.id")), col("opts", text),
                  col("source_hash", s(64)), col("compile_s", sa.Float), col("status", s(16)), col("min_s", sa.Float, null=True),
                  col("median_s", sa.Float, null=True), col("spread", sa.Float, null=True), col("error", text), col("created_at", t),
                  sa.CheckConstraint(f"status IN ({', '.join(repr(x) for x in STATUSES)})", name="ck_candidates_status"))
  op.create_index("ix_candidates_kernel_device_opts", "candidates", ["kernel_id", "device_id", "opts"])
  op.create_index("ix_candidates_run_id", "candidates", ["run_id"])
  op.create_table("baselines", col("id", i, primary_key=True), col("device_id", i, sa.ForeignKey("devices.id")), col("workload", s(128)),
                  col("params", text), col("library", s(64)), col("library_version", s(64)), col("median_s", sa.Float), col("min_s", sa.Float),
                  col("created_at", t))
  op.create_index("ix_baselines_device_workload", "baselines", ["device_id", "workload"])
  op.execute("INSERT INTO meta (id, schema_version) VALUES (1, 1)")


def downgrade() -> None:
  for table in ("baselines", "candidates", "runs", "tuned", "kernels", "devices", "meta"): op.drop_table(table)
