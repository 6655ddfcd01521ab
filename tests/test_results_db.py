"""The results database: round trips of every method, upserts, resume, schema version, and several processes writing one SQLite file.

Runs on SQLite files in tmp_path; set TINYTUNE_TEST_POSTGRES to a PostgreSQL URL to run the contract tests there too."""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from conftest import reset_postgres
from sqlalchemy import func, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from tinytune.results_db import (
  SCHEMA_VERSION,
  Candidate,
  Claim,
  Database,
  Device,
  KernelRecord,
  Meta,
  Peak,
  SchemaError,
  SearchRun,
  Tuned,
  default_url,
  fingerprint_hash,
)
from tinytune.results_db.migrate import version_table

FP = {"kind": "CPU", "name": "Test CPU", "arch": "x86_64-abc", "compiler": "clang", "compiler_version": "18.1", "flags": "-O3"}
KERNEL: dict[str, Any] = dict(key="k" * 24, name="r_64_64_64", ast_text="0 BUFFER float [] buf0:4096", sizes=[64, 64, 64], dtypes=["float", "float"],
              flops=2 * 64**3, nbytes=3 * 64 * 64 * 4)
BACKENDS = ["sqlite"] + (["postgresql"] if os.getenv("TINYTUNE_TEST_POSTGRES") else [])


def sqlite_url(path: Path) -> str: return f"sqlite:///{path}"


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
  if request.param == "sqlite": url = sqlite_url(tmp_path / "results.db")
  else:
    url = os.environ["TINYTUNE_TEST_POSTGRES"]
    reset_postgres(url)
  database = Database(url)
  yield database
  database.close()


@pytest.fixture
def ids(db: Database) -> tuple[int, int, int]:
  """(device, kernel, run) ids for tests that record candidates."""
  device = db.device_id(FP)
  return device, db.kernel_id(**KERNEL), db.start_run("matmul", {"n": 64}, device, "beam", {"width": 4}, {"candidates": 100}, "sig")


def count(db: Database, model: type) -> int:
  with db.session(write=False) as session: return session.scalar(select(func.count()).select_from(model)) or 0


# ***** urls, engine, schema *****
def test_default_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
  monkeypatch.delenv("TINYTUNE_DB", raising=False)
  monkeypatch.setenv("TINYTUNE_CACHE_DIR", str(tmp_path / "cache"))
  assert default_url() == f"sqlite:///{tmp_path / 'cache' / 'tinytune.db'}"
  monkeypatch.setenv("TINYTUNE_DB", "postgresql://u@h/tinytune")
  assert default_url() == "postgresql://u@h/tinytune"
  monkeypatch.setenv("TINYTUNE_DB", sqlite_url(tmp_path / "env" / "env.db"))  # a missing parent folder is created
  Database().device_id(FP)
  assert (tmp_path / "env" / "env.db").exists()


def test_sqlite_pragmas(tmp_path: Path) -> None:
  db = Database(sqlite_url(tmp_path / "p.db"), busy_timeout=7)
  with db.engine.connect() as conn:
    assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 7000
    assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_in_memory_sqlite() -> None:
  db = Database("sqlite://")
  assert db.device_id(FP) == db.device_id(FP) == 1


def test_reopen_keeps_rows_and_schema_version(tmp_path: Path) -> None:
  url = sqlite_url(tmp_path / "r.db")
  device = Database(url).device_id(FP)
  db = Database(url)
  assert db.device_id(FP) == device
  with db.session(write=False) as session: assert session.get(Meta, 1).schema_version == SCHEMA_VERSION  # type: ignore[union-attr]


@pytest.mark.parametrize("version", [SCHEMA_VERSION - 1, SCHEMA_VERSION + 1])
def test_other_schema_version_is_refused(tmp_path: Path, version: int) -> None:
  url = sqlite_url(tmp_path / "v.db")
  with Database(url).session() as session:
    session.execute(update(Meta).values(schema_version=version))
    session.execute(update(version_table).values(version_num=f"{version:04d}"))
  with pytest.raises(SchemaError, match=f"schema version {version}"): Database(url)


def test_session_commits_or_rolls_back(db: Database) -> None:
  with pytest.raises(RuntimeError):
    with db.session() as session:
      session.add(Device(fingerprint_hash="h", kind="CPU", fingerprint="{}"))
      session.flush()
      raise RuntimeError("boom")
  assert count(db, Device) == 0
  with db.session() as session: session.add(Device(fingerprint_hash="h", kind="CPU", fingerprint="{}"))
  assert count(db, Device) == 1


# ***** devices and kernels *****
def test_fingerprint_hash_is_stable() -> None:
  h = fingerprint_hash(FP)
  assert len(h) == 64 and h == fingerprint_hash(dict(reversed(list(FP.items()))))
  assert h == hashlib.sha256(json.dumps(FP, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
  assert fingerprint_hash({**FP, "compiler_version": "19.1"}) != h


def test_device_get_or_create(db: Database) -> None:
  device = db.device_id(FP)
  assert db.device_id(dict(reversed(list(FP.items())))) == device
  other = db.device_id({**FP, "codegen_version": "2"})
  assert other != device and count(db, Device) == 2
  with db.session(write=False) as session:
    row = Device.find(session, fingerprint_hash({**FP, "codegen_version": "2"}))
    assert row is not None and row.id == other
    assert (row.kind, row.name, row.arch, row.compiler, row.compiler_version, row.flags, row.codegen_version) == \
      ("CPU", "Test CPU", "x86_64-abc", "clang", "18.1", "-O3", "2")


def test_get_or_create_race_is_settled_by_rereading(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
  device = db.device_id(FP)
  real_find, misses = Device.find.__func__, iter(range(2))  # type: ignore[attr-defined]
  def find(cls: type[Device], session: Session, fp_hash: str) -> Device | None:  # misses the row twice, as if another process inserted it just now
    return None if next(misses, None) is not None else real_find(cls, session, fp_hash)
  monkeypatch.setattr(Device, "find", classmethod(find))
  assert db.device_id(FP) == device and count(db, Device) == 1


def test_kernel_get_or_create(db: Database) -> None:
  kernel = db.kernel_id(**KERNEL)
  assert db.kernel_id(**KERNEL) == kernel
  assert db.kernel_id(**{**KERNEL, "key": "other"}) != kernel
  with db.session(write=False) as session:
    row = KernelRecord.find(session, KERNEL["key"])  # type: ignore[arg-type]
    assert row is not None and row.id == kernel
    assert (row.name, row.ast_text, row.sizes, row.dtypes, row.flops, row.nbytes) == \
      ("r_64_64_64", KERNEL["ast_text"], "[64,64,64]", '["float","float"]', 2 * 64**3, 3 * 64 * 64 * 4)


def test_kernel_flops_beyond_32_bits(db: Database) -> None:
  kernel = db.kernel_id(**{**KERNEL, "flops": 2 * 8192**3, "nbytes": 3 * 8192**2 * 4})
  with db.session(write=False) as session: assert session.get(KernelRecord, kernel).flops == 2 * 8192**3  # type: ignore[union-attr]


# ***** runs *****
def test_run_round_trip(db: Database) -> None:
  device = db.device_id(FP)
  run_id = db.start_run("matmul", {"n": 64, "dtype": "float"}, device, "beam", {"width": 4}, {"candidates": 100, "seconds": 60.0}, "sig")
  run = db.run(run_id)
  assert run is not None and run.id == run_id and run.device_id == device
  assert (run.workload, run.params, run.strategy, run.settings, run.budget, run.signature) == \
    ("matmul", {"n": 64, "dtype": "float"}, "beam", {"width": 4}, {"candidates": 100, "seconds": 60.0}, "sig")
  assert run.started_at.tzinfo is not None and run.ended_at is None and run.outcome is None
  db.finish_run(run_id, "interrupted")
  run = db.run(run_id)
  assert run is not None and run.outcome == "interrupted" and run.ended_at is not None and run.ended_at >= run.started_at
  assert db.run(run_id + 100) is None
  with pytest.raises(ValueError, match="unknown run outcome"): db.finish_run(run_id, "finished")
  with pytest.raises(LookupError): db.finish_run(run_id + 100, "done")


def test_resumable_run(db: Database) -> None:
  device = db.device_id(FP)
  def start(signature: str) -> int: return db.start_run("matmul", {}, device, "beam", {}, {}, signature)
  assert db.resumable_run("sig") is None
  first = start("sig")
  assert db.resumable_run("sig") == first  # never finished: killed, or still running
  db.finish_run(first, "failed")
  assert db.resumable_run("sig") == first
  second = start("sig")
  other = start("other")
  db.finish_run(second, "interrupted")
  assert db.resumable_run("sig") == second and db.resumable_run("other") == other
  db.finish_run(second, "done")
  assert db.resumable_run("sig") == first  # the latest one that is not done
  db.finish_run(first, "done")
  assert db.resumable_run("sig") is None and db.resumable_run("other") == other


# ***** candidates *****
def test_candidates_round_trip(db: Database, ids: tuple[int, int, int]) -> None:
  device, kernel, run = ids
  db.record_candidate(run, kernel, device, "[]", "h0", 0.1, "ok", 2e-3, 2.5e-3, 0.2, "")
  db.record_candidate(run, kernel, device, '[["UPCAST",0,4]]', "h1", 0.2, "ok", 1e-3, 1.1e-3, 0.09, "")
  db.record_candidate(run, kernel, device, '[["LOCAL",0,7]]', "", 0.0, "invalid", math.inf, math.inf, 0.0, "7 does not divide 64")
  db.record_candidate(run, kernel, device, '[["UPCAST",0,4]]', "h1", 0.2, "ok", 0.9e-3, 1.0e-3, 0.1, "")  # a finalist re-timed
  rows = db.run_candidates(run)
  assert [r.opts_json for r in rows] == ["[]", '[["UPCAST",0,4]]', '[["LOCAL",0,7]]', '[["UPCAST",0,4]]']
  first = rows[0]
  assert (first.run_id, first.kernel_id, first.device_id, first.source_hash, first.compile_s, first.status, first.min_s, first.median_s,
          first.spread, first.error) == (run, kernel, device, "h0", 0.1, "ok", 2e-3, 2.5e-3, 0.2, "")
  assert first.created_at.tzinfo is not None
  failed = rows[2]
  assert failed.status == "invalid" and failed.min_s == failed.median_s == math.inf and failed.error == "7 does not divide 64"
  with db.session(write=False) as session:  # a failure's inf is stored as NULL
    assert session.scalars(select(Candidate.min_s).where(Candidate.status == "invalid")).one() is None
  stored = db.stored_candidates(kernel, device)
  assert set(stored) == {"[]", '[["UPCAST",0,4]]', '[["LOCAL",0,7]]'}
  assert stored['[["UPCAST",0,4]]'].median_s == 1.0e-3  # the latest result for those opts
  with pytest.raises(FrozenInstanceError): first.status = "wrong"  # type: ignore[misc]


def test_stored_candidates_span_runs_and_stay_per_kernel_and_device(db: Database, ids: tuple[int, int, int]) -> None:
  device, kernel, run = ids
  other_device, other_kernel = db.device_id({**FP, "name": "other"}), db.kernel_id(**{**KERNEL, "key": "other"})
  later = db.start_run("matmul", {"n": 64}, device, "random", {}, {}, "sig2")
  db.record_candidate(run, kernel, device, "[]", "h", 0.1, "ok", 1.0, 1.0, 0.0, "")
  db.record_candidate(later, kernel, device, '[["UNROLL",2,4]]', "h2", 0.1, "wrong", None, None, None, "max abs error 0.5")
  db.record_candidate(run, other_kernel, device, '[["X",0,1]]', "h", 0.1, "ok", 1.0, 1.0, 0.0, "")
  db.record_candidate(run, kernel, other_device, '[["Y",0,1]]', "h", 0.1, "ok", 1.0, 1.0, 0.0, "")
  stored = db.stored_candidates(kernel, device)
  assert set(stored) == {"[]", '[["UNROLL",2,4]]'} and stored['[["UNROLL",2,4]]'].run_id == later
  assert stored['[["UNROLL",2,4]]'].spread == 0.0 and stored['[["UNROLL",2,4]]'].min_s == math.inf
  assert set(db.stored_candidates(other_kernel, device)) == {'[["X",0,1]]'}
  assert db.stored_candidates(other_kernel, other_device) == {}
  assert [c.opts_json for c in db.run_candidates(later)] == ['[["UNROLL",2,4]]']


def test_candidate_status_is_checked(db: Database, ids: tuple[int, int, int]) -> None:
  device, kernel, run = ids
  with pytest.raises(ValueError, match="unknown candidate status"): db.record_candidate(run, kernel, device, "[]", "", 0, "fast", 1, 1, 0, "")
  for status in ("ok", "wrong", "crashed", "timeout", "compile_error", "invalid"):
    db.record_candidate(run, kernel, device, "[]", "", 0.0, status, None, None, None, status)
  assert [r.status for r in db.run_candidates(run)] == ["ok", "wrong", "crashed", "timeout", "compile_error", "invalid"]


def test_claims_have_one_owner(db: Database, ids: tuple[int, int, int]) -> None:
  device, kernel, run = ids
  runs = [run] + [db.start_run("matmul", {}, device, "optuna", {}, {}, f"w{i}") for i in range(5)]
  owners: list[int] = []
  threads = [threading.Thread(target=lambda r=r: owners.append(db.claim("study", kernel, device, "src", r))) for r in runs]
  for t in threads: t.start()
  for t in threads: t.join()
  assert len(owners) == 6 and len(set(owners)) == 1 and db.claim("other study", kernel, device, "src", runs[1]) == runs[1]
  owner, other = owners[0], next(r for r in runs if r != owners[0])
  assert db.claimed_result(owner, kernel, device, "src") is None
  db.record_candidate(owner, kernel, device, "[]", "src", 0.1, "ok", 1.0, 1.0, 0.0)
  assert db.claimed_result(owner, kernel, device, "src").opts_json == "[]"  # type: ignore[union-attr]
  assert db.take_claim("study", kernel, device, "src", owner, other) and not db.take_claim("study", kernel, device, "src", owner, other)
  assert db.claim("study", kernel, device, "src", run) == other


def read_together(monkeypatch: pytest.MonkeyPatch, model: Any, n: int) -> None:
  """Make n threads' reads of `model` rows wait for each other before any of them writes (SQLite's write lock, or a row lock,
  queues them instead: the wait then gives up after a second)."""
  read_all, find = threading.Barrier(n, timeout=1), model.find
  def find_together(session: Any, *key: Any, **kw: Any) -> Any:
    row = find(session, *key, **kw)
    with contextlib.suppress(threading.BrokenBarrierError): read_all.wait()
    return row
  monkeypatch.setattr(model, "find", staticmethod(find_together))


def run_together(calls: list[Callable[[], Any]]) -> list[Any]:
  """Each call in its own thread, at once; what each returned or raised."""
  out: list[Any] = [None] * len(calls)
  def one(i: int) -> None:
    try: out[i] = calls[i]()
    except Exception as e: out[i] = e
  threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
  for t in threads: t.start()
  for t in threads: t.join()
  return out


def test_a_dead_runs_claim_goes_to_one_taker(db: Database, ids: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch) -> None:
  """Several runs take over a dead run's claim at once, each having read it as the dead run's: one of them gets it (two did on
  PostgreSQL, where the second update waited for the first and then overwrote it, so both measured the candidate)."""
  device, kernel, dead = ids
  takers = [db.start_run("matmul", {}, device, "beam", {}, {}, f"w{i}") for i in range(4)]
  db.claim("study", kernel, device, "src", dead)
  read_together(monkeypatch, Claim, len(takers))
  took = run_together([lambda r=r: db.take_claim("study", kernel, device, "src", dead, r) for r in takers])
  monkeypatch.undo()
  assert took.count(True) == 1 and db.claim("study", kernel, device, "src", dead) == takers[took.index(True)]


def test_peaks_probed_at_once_keep_the_highest(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
  """Probes storing a device's peaks at once, each having read the row before the others wrote: the first store of a new device
  does not fail, and no probe's higher value is lost (on PostgreSQL one insert raised IntegrityError and the last write won)."""
  device = db.device_id(FP)
  for first in (10.0, 100.0):  # a device with no peaks yet, then one with peaks
    read_together(monkeypatch, Peak, 4)
    stored = run_together([lambda i=i: db.set_peak(device, first + i, first + 3 - i, f"probe {i}") for i in range(4)])
    monkeypatch.undo()
    peak = db.peak(device)
    assert stored == [None] * 4 and peak is not None and (peak.gflops, peak.gbs) == (first + 3, first + 3)


def test_tuned_entries_stored_at_once_keep_the_fastest(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
  """Searches storing one kernel's best at once, each having read the entry before the others wrote: no store fails and the
  fastest stays (set_tuned locked and retried already; this guards the upsert it now shares with set_peak)."""
  for first in (1e-3, 1e-4):  # a new entry, then one to improve on
    read_together(monkeypatch, Tuned, 4)
    stored = run_together([lambda i=i: db.set_tuned("key", "dev", f"[{i}]", first * (4 - i), None, None) for i in range(4)])
    monkeypatch.undo()
    entry = db.tuned("key", "dev")
    assert not any(isinstance(x, Exception) for x in stored) and entry is not None and (entry.opts_json, entry.best_s) == ("[3]", first)


# ***** tuning cache and baselines *****
def test_tuned_upsert(db: Database) -> None:
  h = fingerprint_hash(FP)
  assert db.tuned("key", h) is None
  db.set_tuned("key", h, '[["UPCAST",0,4]]', 1e-3, 4e-3, None)
  first = db.tuned("key", h)
  assert first is not None and (first.kernel_key, first.device_hash, first.opts_json, first.best_s, first.default_s, first.run_id) == \
    ("key", h, '[["UPCAST",0,4]]', 1e-3, 4e-3, None)
  run = db.start_run("matmul", {}, db.device_id(FP), "beam", {}, {}, "s")
  db.set_tuned("key", h, '[["UPCAST",0,8]]', 0.5e-3, 4e-3, run)
  second = db.tuned("key", h)
  assert second is not None and (second.opts_json, second.best_s, second.run_id) == ('[["UPCAST",0,8]]', 0.5e-3, run)
  assert second.updated_at >= first.updated_at
  db.set_tuned("key", "other-device", "[]", 2e-3, None, None)
  assert count(db, Tuned) == 2 and db.tuned("key", "nope") is None


def test_baselines(db: Database) -> None:
  device, other = db.device_id(FP), db.device_id({**FP, "name": "other"})
  torch_id = db.add_baseline(device, "matmul", {"n": 64, "dtype": "float"}, "torch", "2.13.0", 1e-4, 0.9e-4)
  db.add_baseline(device, "matmul", {"n": 128}, "numpy", "2.1", 5e-4, 4e-4)
  db.add_baseline(other, "softmax", {"n": 64}, "torch", "2.13.0", 1e-5, 1e-5)
  row = db.baselines(device, "matmul", {"dtype": "float", "n": 64})[0]
  assert (row.id, row.device_id, row.workload, row.params, row.library, row.library_version, row.median_s, row.min_s) == \
    (torch_id, device, "matmul", {"n": 64, "dtype": "float"}, "torch", "2.13.0", 1e-4, 0.9e-4)
  assert row.created_at.tzinfo is not None
  assert len(db.baselines()) == 3 and len(db.baselines(device)) == 2 and len(db.baselines(library="torch")) == 2
  assert [b.library for b in db.baselines(device, "matmul")] == ["torch", "numpy"] and db.baselines(workload="conv2d") == []


# ***** several processes, killed processes *****
WRITER = textwrap.dedent("""
  import sys, time
  from tinytune.results_db import Database
  url, worker, n, start_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
  time.sleep(max(0.0, start_at - time.time()))  # all writers start together, racing even to create the tables
  db = Database(url)
  device = db.device_id({fp!r})
  kernel = db.kernel_id(**{kernel!r})
  run = db.start_run("matmul", {{"n": 64}}, device, "random", {{"worker": worker}}, {{}}, f"sig-{{worker}}")
  for i in range(n):
    db.record_candidate(run, kernel, device, f'[["UPCAST",{{worker}},{{i}}]]', f"h{{i}}", 0.01, "ok", 1e-3, 1e-3, 0.0, "")
    if i == n // 2: db.set_tuned("kkk", "hhh", f"[{{worker}}]", 1e-3, None, run)
    print(i, flush=True)
  if len(sys.argv) > 5: import os, signal; os.kill(os.getpid(), signal.SIGKILL)
  db.finish_run(run, "done")
""").format(fp=FP, kernel=KERNEL)


def writer(url: str, worker: int, n: int, start_at: float, kill_self: bool = False) -> subprocess.Popen:
  args = [sys.executable, "-c", WRITER, url, str(worker), str(n), str(start_at)] + (["kill"] if kill_self else [])
  return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_fresh_file_opened_while_another_process_writes(tmp_path: Path) -> None:
  # SQLite fails a switch to WAL at once, ignoring busy_timeout, while another connection holds the write lock: four processes
  # opening a fresh file together hit this in CI
  path = tmp_path / "fresh.db"
  other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
  other.execute("CREATE TABLE t (x)")
  other.execute("BEGIN IMMEDIATE")
  release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
  release.start()
  db = Database(sqlite_url(path))
  release.join()
  assert db.device_id(FP) == 1
  assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_writer_processes(tmp_path: Path, backend: str) -> None:
  url, workers, n = sqlite_url(tmp_path / "shared.db"), 4, 100
  if backend == "postgresql":
    url = os.environ["TINYTUNE_TEST_POSTGRES"]
    reset_postgres(url)
  procs = [writer(url, w, n, time.time() + 1.5) for w in range(workers)]
  for p in procs:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and err == "", err
    assert out.split() == [str(i) for i in range(n)]
  db = Database(url)
  assert (count(db, Device), count(db, KernelRecord), count(db, SearchRun), count(db, Candidate), count(db, Tuned)) == (1, 1, workers, workers * n, 1)
  for w in range(workers):
    run = db.resumable_run(f"sig-{w}")
    assert run is None  # every writer finished its run
  with db.session(write=False) as session:
    runs = session.scalars(select(SearchRun)).all()
    assert all(r.outcome == "done" for r in runs)
    assert sorted(len(db.run_candidates(r.id)) for r in runs) == [n] * workers
    device = session.scalars(select(Device)).one()
    kernel = session.scalars(select(KernelRecord)).one()
  assert len(db.stored_candidates(kernel.id, device.id)) == workers * n


def test_killed_writer_loses_nothing_committed(tmp_path: Path) -> None:
  url, n = sqlite_url(tmp_path / "killed.db"), 40
  proc = writer(url, 0, n, 0.0, kill_self=True)  # records n candidates, then SIGKILLs itself before finishing the run
  out, _ = proc.communicate(timeout=60)
  assert proc.returncode == -9 and len(out.split()) == n
  db = Database(url)
  run = db.resumable_run("sig-0")
  assert run is not None and len(db.run_candidates(run)) == n and db.tuned("kkk", "hhh") is not None
  run_row = db.run(run)
  assert run_row is not None and run_row.outcome is None and run_row.ended_at is None


def test_writer_killed_mid_stream(tmp_path: Path) -> None:
  url = sqlite_url(tmp_path / "mid.db")
  proc = writer(url, 0, 100_000, 0.0)
  assert proc.stdout is not None
  seen = [proc.stdout.readline() for _ in range(30)]  # each line is printed after its candidate committed
  proc.kill()
  proc.wait(timeout=10)
  db = Database(url)
  run = db.resumable_run("sig-0")
  assert run is not None
  assert len(db.run_candidates(run)) >= len(seen) == 30
  with sqlite3.connect(tmp_path / "mid.db") as conn: assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
  db.record_candidate(run, db.kernel_id(**KERNEL), db.device_id(FP), "[]", "", 0.0, "ok", 1.0, 1.0, 0.0, "")  # and it takes writes again


def test_writer_waits_for_the_lock(tmp_path: Path) -> None:
  path = tmp_path / "busy.db"
  db, impatient = Database(sqlite_url(path)), Database(sqlite_url(path), busy_timeout=0.1)
  device = db.device_id(FP)
  holder = sqlite3.connect(path, isolation_level=None)
  holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock
  errors: list[BaseException] = []
  def write() -> None:
    try: db.add_baseline(device, "matmul", {}, "numpy", "2", 1.0, 1.0)
    except BaseException as e: errors.append(e)
  thread = threading.Thread(target=write)
  thread.start()
  with pytest.raises(OperationalError, match="locked"): impatient.add_baseline(device, "matmul", {}, "numpy", "2", 1.0, 1.0)
  time.sleep(0.3)
  assert thread.is_alive()  # waiting, not failed
  holder.execute("COMMIT")
  thread.join(timeout=10)
  assert not thread.is_alive() and errors == [] and len(db.baselines()) == 1


def _record_in_child(db: Database, run: int, kernel: int, device: int) -> None:
  db.record_candidate(run, kernel, device, '["child"]', "", 0.0, "ok", 1.0, 1.0, 0.0, "")


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_database_used_after_fork(tmp_path: Path) -> None:
  db = Database(sqlite_url(tmp_path / "fork.db"))
  device, kernel = db.device_id(FP), db.kernel_id(**KERNEL)
  run = db.start_run("matmul", {}, device, "beam", {}, {}, "s")
  child = multiprocessing.get_context("fork").Process(target=_record_in_child, args=(db, run, kernel, device))
  child.start()
  child.join(timeout=30)
  assert child.exitcode == 0 and [c.opts_json for c in db.run_candidates(run)] == ['["child"]']
