"""Schema versions: which revision a database is at, refusing the wrong one, and the upgrade behind `tinytune db upgrade`.

A database made before migrations existed (schema 1) has no version table; its `meta` row says which schema it holds. New
databases are created from the models and stamped with the newest revision, so opening one never runs Alembic."""
from __future__ import annotations

import pathlib

from sqlalchemy import Column, Connection, Engine, MetaData, String, Table, inspect, select

from tinytune.results_db.models import SCHEMA_VERSION, Meta

VERSION_TABLE = "tinytune_alembic_version"  # not alembic_version: optuna keeps its own in the same database
REVISIONS = ("0001", "0002", "0003", "0004")  # the files in migrations/versions, oldest first: revision N is schema version N, zero-padded
HEAD = REVISIONS[SCHEMA_VERSION - 1]
version_table = Table(VERSION_TABLE, MetaData(), Column("version_num", String(32), primary_key=True))  # the layout Alembic uses


class SchemaError(RuntimeError):
  """The database was made by another version of tinytune's schema."""


def revision(conn: Connection) -> str | None:
  """The database's revision; None where it has no tinytune tables yet (or another process is creating them now)."""
  tables = set(inspect(conn).get_table_names())
  if VERSION_TABLE in tables and (rev := conn.execute(select(version_table.c.version_num)).scalar()) is not None: return rev
  if "meta" not in tables or (version := conn.execute(select(Meta.schema_version).where(Meta.id == 1)).scalar()) is None: return None
  return f"{version:04d}"


def check(rev: str, where: str) -> None:
  if rev == HEAD: return
  if rev in REVISIONS:
    raise SchemaError(f"{where} has results schema version {REVISIONS.index(rev) + 1}, this tinytune uses {SCHEMA_VERSION}: "
                      f"upgrade the database with `tinytune db upgrade --db URL` (back it up first)")
  version = int(rev) if rev.isdigit() else f"revision {rev!r}"
  raise SchemaError(f"{where} has results schema version {version}, made by a newer tinytune "
                    f"than this one (schema {SCHEMA_VERSION}): upgrade tinytune")


def stamp_head(conn: Connection) -> None:
  version_table.create(conn, checkfirst=True)
  if conn.execute(select(version_table.c.version_num)).first() is None: conn.execute(version_table.insert().values(version_num=HEAD))


def upgrade(engine: Engine, where: str, target: str = HEAD) -> tuple[str | None, str]:
  """Migrate the database to the newest schema, or `target` (creating it if empty); (revision before, revision after)."""
  from alembic import command
  from alembic.config import Config
  with engine.connect() as conn:
    sqlite = conn.dialect.name == "sqlite"
    if sqlite: conn.connection.driver_connection.execute("PRAGMA foreign_keys = OFF")  # type: ignore[union-attr]  # batch mode copies tables
    try:
      with conn.begin():
        before = revision(conn)
        if before is not None and before not in REVISIONS: check(before, where)  # newer than this tinytune: refuse
        config = Config()
        config.set_main_option("script_location", str(pathlib.Path(__file__).with_name("migrations")))
        config.attributes["connection"] = conn
        stamped = VERSION_TABLE in inspect(conn).get_table_names() and conn.execute(select(version_table.c.version_num)).first() is not None
        if before is not None and not stamped: command.stamp(config, before)  # from before migrations: record what its meta row says
        command.upgrade(config, target)
    finally:
      if sqlite: conn.connection.driver_connection.execute("PRAGMA foreign_keys = ON")  # type: ignore[union-attr]
  return before, target
