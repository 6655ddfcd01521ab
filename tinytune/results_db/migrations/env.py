"""Alembic environment for tinytune's results database: online only, on the connection `tinytune.results_db.migrate` hands over.

Our version table is `tinytune_alembic_version`: optuna keeps its own `alembic_version` in the same database."""
from __future__ import annotations

from alembic import context

from tinytune.results_db.migrate import VERSION_TABLE
from tinytune.results_db.models import Base

context.configure(connection=context.config.attributes["connection"], target_metadata=Base.metadata, version_table=VERSION_TABLE,
                  render_as_batch=True)  # SQLite alters tables by copying them
with context.begin_transaction():
  context.run_migrations()
