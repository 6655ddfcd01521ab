"""Schema 4: search runs and baselines record the dtype they computed in (`tinytune bench --dtype`, `compare --dtype`).

Baselines from before were all float32 (bench and compare had no --dtype); a run from before takes its kernels' dtype where they
all have one that tinytune knows (the dtypes its kernels record), and stays NULL (unknown) otherwise.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23"""
from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

from tinytune.dtype import dtypes

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
  with op.batch_alter_table("baselines") as batch: batch.add_column(sa.Column("dtype", sa.String(32), nullable=False, server_default="float32"))
  with op.batch_alter_table("runs") as batch: batch.add_column(sa.Column("dtype", sa.String(32), nullable=True))
  known = {d.name for d in dtypes.all}
  conn = op.get_bind()
  found: dict[int, set[str]] = {}
  query = "SELECT DISTINCT candidates.run_id, kernels.dtypes FROM candidates JOIN kernels ON kernels.id = candidates.kernel_id"
  for run_id, kernel_dtypes in conn.execute(sa.text(query)):
    names = json.loads(kernel_dtypes) if kernel_dtypes else []
    found.setdefault(run_id, set()).update(names if len(names) == 1 and names[0] in known else ["?", "??"])  # mixed or unknown: says nothing
  for run_id, names in found.items():
    if len(names) == 1: conn.execute(sa.text("UPDATE runs SET dtype = :dtype WHERE id = :id"), {"dtype": names.pop(), "id": run_id})
  op.execute("UPDATE meta SET schema_version = 4")


def downgrade() -> None:
  with op.batch_alter_table("runs") as batch: batch.drop_column("dtype")
  with op.batch_alter_table("baselines") as batch: batch.drop_column("dtype")
  op.execute("UPDATE meta SET schema_version = 3")
