"""Schema migrations: a database made by the first schema is refused until `tinytune db upgrade`, then keeps its rows; a newer
one is refused; migrations from nothing build the same tables as the models; optuna's tables live beside ours."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from conftest import reset_postgres
from sqlalchemy import inspect

from tinytune.cli import main
from tinytune.results_db import HEAD, SCHEMA_VERSION, VERSION_TABLE, Base, Database, SchemaError, fingerprint_hash, migrate
from tinytune.results_db.migrate import REVISIONS, revision, version_table

DATA = Path(__file__).parent / "data"
FP = {"kind": "CPU", "name": "Test CPU", "arch": "x86_64-abc", "compiler": "clang", "compiler_version": "18.1", "flags": "-O3",
      "codegen_version": "1"}


def schema_diff(db: Database) -> list:
  with db.engine.connect() as conn:
    diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
  return [d for d in diff if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)]


def test_revisions_are_the_migration_files() -> None:
  script = ScriptDirectory(str(Path(migrate.__file__).with_name("migrations")))
  assert [s.revision for s in reversed(list(script.walk_revisions()))] == list(REVISIONS)
  assert script.get_current_head() == HEAD == REVISIONS[SCHEMA_VERSION - 1]


def test_first_schema_is_refused_then_upgraded(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
  shutil.copy(DATA / "schema1.db", tmp_path / "old.db")
  url = f"sqlite:///{tmp_path / 'old.db'}"
  with pytest.raises(SchemaError, match="schema version 1.*tinytune db upgrade"): Database(url)
  with pytest.raises(SchemaError, match="tinytune db upgrade"): Database(url, read_only=True)
  assert main(["db", "upgrade", "--db", url]) == 0
  assert f"0001 -> {HEAD}" in capsys.readouterr().out
  db = Database(url)
  with db.engine.connect() as conn:
    assert revision(conn) == HEAD and "alembic_version" not in inspect(conn).get_table_names()  # optuna's name stays free
  assert schema_diff(db) == []
  assert [c.opts_json for c in db.run_candidates(1)] == ["[]", '[["UPCAST", 0, 4]]', '[["LOCAL", 0, 7]]']
  entry = db.tuned("k" * 24, fingerprint_hash(FP))
  assert entry is not None and (entry.opts_json, entry.best_s, entry.kernel_name, entry.workload) == \
    ('[["UPCAST", 0, 4]]', 1.1e-3, "r_64_64_64", "matmul")
  assert entry.params == '{"k":64,"m":64,"n":64}' and len(db.baselines()) == 1
  assert db.baselines()[0].dtype == "float32" and (run := db.run(1)) is not None and run.dtype is None  # bench had no --dtype; "float" is no dtype
  run = db.run(db.start_run("matmul", {}, db.device_id(FP), "beam", {}, {}, "new"))
  assert run is not None and db.device_id(FP) == 1  # and it takes writes
  assert main(["db", "upgrade", "--db", url]) == 0 and f"already at schema revision {HEAD}" in capsys.readouterr().out


def test_schema4_gives_old_runs_their_kernels_dtype(tmp_path: Path) -> None:
  db = Database(f"sqlite:///{tmp_path / 'v3.db'}", check_schema=False)
  migrate.upgrade(db.engine, "v3", "0003")
  with db.engine.begin() as conn:
    conn.exec_driver_sql("INSERT INTO devices VALUES (1, 'h', 'CPU', '', '', '', '', '', '', '{}')")
    for i, dtypes in ((1, '["float16"]'), (2, '["float16", "int32"]')):
      conn.exec_driver_sql(f"INSERT INTO kernels VALUES ({i}, 'k{i}', 'r_{i}', '', '[8]', '{dtypes}', 8, 16)")
      conn.exec_driver_sql(f"INSERT INTO runs VALUES ({i}, 'matmul', '{{}}', 1, 'beam', '{{}}', '{{}}', 's{i}', '2026-01-01', NULL, 'done', '')")
      conn.exec_driver_sql(f"INSERT INTO candidates VALUES ({i}, {i}, {i}, 1, '[]', '', 0, 'ok', 1, 1, 0, '', '2026-01-01')")
  assert db.upgrade() == ("0003", HEAD) and schema_diff(db) == []
  assert [(r := db.run(i)) and r.dtype for i in (1, 2)] == ["float16", None]  # a kernel of one dtype tells; a mixed one does not


def test_upgrade_from_nothing_builds_the_models(tmp_path: Path) -> None:
  db = Database(f"sqlite:///{tmp_path / 'new.db'}", check_schema=False)
  assert db.upgrade() == (None, HEAD)
  assert schema_diff(db) == []
  Database(db.url.render_as_string()).device_id(FP)
  created = Database(f"sqlite:///{tmp_path / 'created.db'}")  # created from the models, stamped with the newest revision
  with created.engine.connect() as conn: assert revision(conn) == HEAD


def test_newer_database_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
  url = f"sqlite:///{tmp_path / 'future.db'}"
  db = Database(url)
  with db.engine.begin() as conn: conn.execute(version_table.update().values(version_num="0099"))
  with pytest.raises(SchemaError, match="schema version 99.*newer tinytune"): Database(url)
  assert main(["db", "upgrade", "--db", url]) == 2
  err = capsys.readouterr().err
  assert err.startswith("tinytune: error:") and "newer tinytune" in err and len(err.strip().splitlines()) == 1


def test_optuna_tables_live_beside_ours(tmp_path: Path) -> None:
  import optuna
  url = f"sqlite:///{tmp_path / 'shared.db'}"
  optuna.create_study(storage=url, study_name="s").optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
  db = Database(url)
  with db.engine.connect() as conn:
    tables = set(inspect(conn).get_table_names())
    assert {"alembic_version", VERSION_TABLE, "studies", "tuned"} <= tables and revision(conn) == HEAD
  assert db.upgrade() == (HEAD, HEAD)
  assert len(optuna.load_study(storage=url, study_name="s").trials) == 1


def test_read_only_database(tmp_path: Path) -> None:
  path = tmp_path / "ro.db"
  writer = Database(f"sqlite:///{path}")
  writer.set_tuned("key", "dev", "[]", 1.0, 2.0, None)
  writer.close()  # closed now: its last connection, garbage-collected later, would checkpoint the WAL into the file mid-test
  before = path.read_bytes()
  reader = Database(f"sqlite:///{path}", read_only=True)
  entry = reader.tuned("key", "dev")
  assert entry is not None and entry.best_s == 1.0
  with pytest.raises(Exception, match="readonly"): reader.set_tuned("key", "dev", "[]", 0.5, 2.0, None)
  (tmp_path / "empty.db").touch()
  with pytest.raises(SchemaError, match="no tinytune tables"): Database(f"sqlite:///{tmp_path / 'empty.db'}", read_only=True)
  assert path.read_bytes() == before


def test_set_tuned_keeps_the_faster_entry_unless_forced(tmp_path: Path) -> None:
  db = Database(f"sqlite:///{tmp_path / 't.db'}")
  assert db.set_tuned("key", "dev", '["a"]', 2.0, 3.0, None)
  assert not db.set_tuned("key", "dev", '["b"]', 2.5, 3.0, None)  # slower: kept the old one
  assert not db.set_tuned("key", "dev", '["b"]', 2.0, 3.0, None)  # a tie keeps the old one too
  assert db.tuned("key", "dev").opts_json == '["a"]'  # type: ignore[union-attr]
  assert db.set_tuned("key", "dev", '["c"]', 1.5, 3.0, None)
  assert db.set_tuned("key", "dev", '["d"]', 9.0, 3.0, None, force=True)
  assert db.tuned("key", "dev").opts_json == '["d"]'  # type: ignore[union-attr]


@pytest.mark.skipif(not os.getenv("TINYTUNE_TEST_POSTGRES"), reason="set TINYTUNE_TEST_POSTGRES to a PostgreSQL URL")
def test_upgrade_on_postgresql() -> None:
  url = os.environ["TINYTUNE_TEST_POSTGRES"]
  reset_postgres(url)
  db = Database(url, check_schema=False)
  assert migrate.upgrade(db.engine, "pg", "0001") == (None, "0001")
  with pytest.raises(SchemaError, match="schema version 1.*tinytune db upgrade"): Database(url)
  assert db.upgrade() == ("0001", HEAD) and schema_diff(db) == []
  assert Database(url).device_id(FP) == 1
