"""Engine and session setup, and the one API the harness uses to read and write results.

Every public method opens its own session and commits before it returns, so a search killed at any point (even by SIGKILL)
loses at most the candidate it was timing. Rows come back as frozen dataclasses, never ORM objects bound to a closed session.

Concurrency: a `Database` is safe to share between threads. Several processes may write one SQLite file at once: write
transactions start with BEGIN IMMEDIATE, so they queue on SQLite's write lock (waiting up to `busy_timeout` seconds) instead
of failing, and get-or-create races (here or on PostgreSQL) are settled by re-reading after an IntegrityError. After a fork
the child drops the parent's pooled connections and opens its own."""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pathlib
import re
import socket
import sqlite3
import sys
import time
import urllib.parse
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Sequence, TypeVar

from sqlalchemy import create_engine, event, func, make_url, select, update
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session

from tinytune.helpers import cache_dir, db_timeout, warn_once
from tinytune.results_db import migrate, untrusted
from tinytune.results_db.migrate import SchemaError
from tinytune.results_db.models import (
  OUTCOMES,
  SCHEMA_VERSION,
  STATUSES,
  Base,
  Baseline,
  Candidate,
  Claim,
  Device,
  KernelRecord,
  Meta,
  Peak,
  SearchRun,
  Tuned,
  utcnow,
)

Row = TypeVar("Row")
Value = TypeVar("Value")


class DatabaseError(RuntimeError):
  """A database that cannot be used (a missing driver, a bad URL, a lock held too long, an unreadable file), in one line."""


def default_url() -> str:
  """$TINYTUNE_DB, or a SQLite file in tinytune's cache directory."""
  return os.getenv("TINYTUNE_DB") or f"sqlite:///{cache_dir(writable=False) / 'tinytune.db'}"


def database_url(url: str | None) -> URL:
  """A SQLAlchemy URL, or a plain file path for a SQLite database (`--db results.db`)."""
  url = url or default_url()
  try: return make_url(url if "://" in url else f"sqlite:///{pathlib.Path(url).expanduser().absolute()}")
  except ArgumentError: raise ValueError(f"{re.sub(r'//[^@/]*@', '//***@', url)!r} is not a database URL or file path") from None


def to_json(x: Any) -> str:
  """Canonical JSON: equal values give equal text, so JSON columns compare as strings."""
  return json.dumps(x, sort_keys=True, separators=(",", ":"))


def fingerprint_hash(fingerprint: dict[str, str]) -> str:
  """A stable sha256 of the fingerprint's sorted JSON: the device's identity in the tuning cache."""
  return hashlib.sha256(to_json(fingerprint).encode()).hexdigest()


def _time(x: float | None) -> float: return math.inf if x is None else x  # a failed candidate's time is inf, as in search
def _finite(x: float | None) -> float | None: return x if x is not None and math.isfinite(x) else None
def _utc(t: datetime) -> datetime: return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t  # SQLite drops the zone


@dataclass(frozen=True)
class CandidateRow:
  id: int
  run_id: int
  kernel_id: int
  device_id: int
  opts_json: str
  source_hash: str
  compile_s: float
  status: str
  min_s: float  # inf where the candidate has no timing
  median_s: float
  spread: float
  error: str
  created_at: datetime

  @staticmethod
  def of(c: Candidate) -> CandidateRow:
    return CandidateRow(c.id, c.run_id, c.kernel_id, c.device_id, c.opts, c.source_hash, c.compile_s, c.status, _time(c.min_s),
                        _time(c.median_s), c.spread if c.spread is not None else 0.0, c.error, _utc(c.created_at))


@dataclass(frozen=True)
class RunRow:
  id: int
  workload: str
  params: dict[str, Any]
  device_id: int
  strategy: str
  settings: dict[str, Any]
  budget: dict[str, Any]
  signature: str
  started_at: datetime
  ended_at: datetime | None
  outcome: str | None
  dtype: str | None = None
  worker: str = ""  # host:pid

  @staticmethod
  def of(r: SearchRun) -> RunRow:
    return RunRow(r.id, r.workload, json.loads(r.params), r.device_id, r.strategy, json.loads(r.settings), json.loads(r.budget), r.signature,
                  _utc(r.started_at), _utc(r.ended_at) if r.ended_at else None, r.outcome, r.dtype, r.worker)


@dataclass(frozen=True)
class TunedRow:
  kernel_key: str
  device_hash: str
  opts_json: str
  best_s: float
  default_s: float | None
  run_id: int | None
  updated_at: datetime
  kernel_name: str = ""
  workload: str = ""
  params: str = "{}"  # JSON

  @staticmethod
  def of(t: Tuned) -> TunedRow:
    return TunedRow(t.kernel_key, t.device_hash, t.opts, t.best_s, t.default_s, t.run_id, _utc(t.updated_at), t.kernel_name, t.workload, t.params)


@dataclass(frozen=True)
class BaselineRow:
  id: int
  device_id: int
  workload: str
  params: dict[str, Any]
  library: str
  library_version: str
  median_s: float
  min_s: float
  created_at: datetime
  dtype: str = "float32"

  @staticmethod
  def of(b: Baseline) -> BaselineRow:
    return BaselineRow(b.id, b.device_id, b.workload, json.loads(b.params), b.library, b.library_version, b.median_s, b.min_s,
                       _utc(b.created_at), b.dtype)


@dataclass(frozen=True)
class PeakRow:
  device_id: int
  gflops: float
  gbs: float
  probe: str
  created_at: datetime


def _wal_mode(cursor: Any, busy_timeout: float) -> None:
  """Switch the file to WAL (a setting stored in the file, so usually already done). SQLite fails the switch at once, without
  waiting on busy_timeout, while another connection holds the write lock, as when several processes open a fresh database together:
  retry until the first of them has switched it."""
  deadline = time.monotonic() + busy_timeout
  while cursor.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
    try: cursor.execute("PRAGMA journal_mode = WAL")
    except sqlite3.OperationalError as e:
      if "locked" not in str(e) or time.monotonic() > deadline: raise
      time.sleep(0.01)


def _sqlite_setup(engine: Engine, busy_timeout: float, on_disk: bool) -> None:
  """pysqlite defers BEGIN past reads, so a read-then-write transaction can fail at once with 'database is locked' when
  another process wrote in between; we emit BEGIN ourselves, IMMEDIATE for writes so writers queue on the lock instead."""
  @event.listens_for(engine, "connect")
  def _connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    cursor.execute("PRAGMA trusted_schema = OFF")  # functions with side effects in the schema (views, triggers) are refused
    if on_disk:
      _wal_mode(cursor, busy_timeout)  # readers never block the writer, nor it them
      cursor.execute("PRAGMA synchronous = NORMAL")  # in WAL mode a commit still survives the process being killed
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()

  @event.listens_for(engine, "begin")
  def _begin(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("tinytune_write", True) else "BEGIN")


def _check_file(path: pathlib.Path, frozen: bool, timeout: float) -> None:
  """Refuse a SQLite file holding views, triggers or virtual tables (queries that run when it is read, which tinytune never
  makes), waiting up to `timeout` seconds, and saying so, where another process holds it locked."""
  uri = f"file:{urllib.parse.quote(str(path))}?mode=ro" + ("&immutable=1" if frozen else "")
  grace = min(0.5, timeout)  # a lock held a moment (another process creating the tables) is waited for without a word
  conn = sqlite3.connect(uri, uri=True, timeout=grace, factory=untrusted.Hardened)
  try:
    try: foreign = untrusted.foreign_objects(conn)
    except sqlite3.OperationalError as e:
      if "locked" not in str(e): raise
      print(f"tinytune: waiting for the lock on {path} held by another process", file=sys.stderr, flush=True)
      conn.execute(f"PRAGMA busy_timeout = {int((timeout - grace) * 1000)}")
      try: foreign = untrusted.foreign_objects(conn)
      except sqlite3.OperationalError as e:
        if "locked" not in str(e): raise
        raise DatabaseError(f"database error: {path} stayed locked by another process for {timeout:g} s (TINYTUNE_DB_TIMEOUT)") from None
  except sqlite3.Error as e: raise DatabaseError(f"database error: {(str(e).splitlines() or [type(e).__name__])[0]} ({path})") from None
  finally: conn.close()
  if foreign: raise SchemaError(f"{path} is not a tinytune results database: it holds the {foreign[0]}, which tinytune never makes")


def _positive(x: Any) -> bool: return type(x) in (int, float) and math.isfinite(x) and x > 0


# what each JSON column holds
JSON_COLUMNS: dict[str, dict[str, type]] = {
  "tuned": {"params": dict}, "runs": {"params": dict, "settings": dict, "budget": dict}, "baselines": {"params": dict},
  "kernels": {"sizes": list, "dtypes": list}, "devices": {"fingerprint": dict}}
TIMES = {"tuned": ("best_s", "default_s"), "baselines": ("median_s", "min_s")}  # positive seconds (default_s may be NULL)


def row_problem(table: str, row: Any) -> str | None:
  """Why a row read from a table cannot be used (a wrong type, opts that are no short JSON list, JSON too large or too deeply
  nested to parse, a time that is no positive number), or None: each value is checked before it is parsed, since a database may
  hold rows from before imports were checked, or rows written by something else."""
  if table in ("candidates", "tuned") and (why := untrusted.opts_problem(row.opts, strict=False)): return why
  if table == "tuned" and not (isinstance(row.kernel_key, str) and isinstance(row.device_hash, str)): return "its key is not text"
  for column in TIMES.get(table, ()):
    if not (_positive(t := getattr(row, column)) or (t is None and column == "default_s")): return f"{column} is not a positive number"
  for column, kind in JSON_COLUMNS.get(table, {}).items():
    try: value = untrusted.loads(getattr(row, column), column)
    except (ValueError, RecursionError) as e: return str(e)[:100] or type(e).__name__
    if not isinstance(value, kind): return f"{column} is not a JSON {'object' if kind is dict else 'list'}"
  return None


def skipping(rows: list[Any], table: str, where: str) -> list[Any]:
  """The rows of `table` that row_problem passes; one warning for the others."""
  problems = [row_problem(table, r) for r in rows]
  if bad := [why for why in problems if why]: warn_once(f"skipping {len(bad)} bad row(s) of the {table} table in {where} (the first: {bad[0]})")
  return [r for r, why in zip(rows, problems) if not why]


class Database:
  """The results database at `url` (any SQLAlchemy URL; default `default_url()`). Tables are created if missing.

  `read_only=True` opens it for lookups only (SQLite in `mode=ro`, nothing created), as a deployed program does. A database of
  another schema version raises SchemaError, naming `tinytune db upgrade` where that helps; `check_schema=False` skips this
  (for the upgrade itself)."""

  def __init__(self, url: str | None = None, busy_timeout: float | None = None, read_only: bool = False, check_schema: bool = True):
    self.url, self.read_only = database_url(url), read_only
    busy_timeout = db_timeout() if busy_timeout is None else busy_timeout
    try: self._make_engine(busy_timeout, read_only)
    except ImportError as e:  # the URL's driver: a missing module, or a dialect that is not there
      raise DatabaseError(f"database error: {self!r} needs the Python package {e.name or 'of its driver'}, which is not installed") from None
    except ArgumentError as e: raise DatabaseError(f"database error: {self!r}: {(str(e).splitlines() or [type(e).__name__])[0]}") from None
    self._reader = self.engine.execution_options(tinytune_write=False)
    self._pid = os.getpid()
    if check_schema:
      try: self._open_schema()
      except DBAPIError as e:  # an unreachable server, a file SQLite cannot read: one line, not SQLAlchemy's several
        raise DatabaseError(f"database error: {(str(e.orig).splitlines() or [type(e.orig).__name__])[0]}") from None

  def _make_engine(self, busy_timeout: float, read_only: bool) -> None:
    if self.url.get_backend_name() == "sqlite":
      on_disk = self.url.database not in (None, "", ":memory:") and not self.url.query.get("uri")
      engine_url, path = self.url, pathlib.Path(str(self.url.database)).expanduser()
      # a file we cannot write (a deployed image) is read as immutable: WAL mode would need a -shm file beside it
      frozen = on_disk and path.is_file() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK))
      self.read_only = read_only = read_only or frozen
      if on_disk and path.exists():
        if not path.is_file(): raise DatabaseError(f"database error: {path} is not a regular file")  # a FIFO would block SQLite's open
        _check_file(path, frozen, busy_timeout)
      if on_disk and read_only:
        engine_url = self.url.set(database=f"file:{path}", query={"mode": "ro", "uri": "true", **({"immutable": "1"} if frozen else {})})
      elif on_disk: pathlib.Path(str(self.url.database)).expanduser().parent.mkdir(parents=True, exist_ok=True)
      self.engine = create_engine(engine_url, connect_args={"timeout": busy_timeout})
      _sqlite_setup(self.engine, busy_timeout, on_disk and not read_only)
    else: self.engine = create_engine(self.url, pool_pre_ping=True)

  def __repr__(self) -> str: return f"Database({self.url.render_as_string(hide_password=True)!r})"
  def close(self) -> None: self.engine.dispose()

  @contextlib.contextmanager
  def session(self, write: bool = True) -> Iterator[Session]:
    """One transaction: commits when the block ends, rolls back if it raises. `write=False` for reads (no write lock on SQLite)."""
    if os.getpid() != self._pid:  # forked: the parent's pooled connections are not ours to use
      self.engine.dispose(close=False)
      self._pid = os.getpid()
    with Session(self._reader if self.read_only or not write else self.engine, expire_on_commit=False) as session, session.begin():
      yield session

  def _open_schema(self) -> None:
    with self._reader.connect() as conn: rev = migrate.revision(conn)
    if rev is None and self.read_only: raise SchemaError(f"{self!r} holds no tinytune tables")
    if rev is None:
      for attempt in range(3):
        try:
          with self.engine.begin() as conn:
            Base.metadata.create_all(conn)
            migrate.stamp_head(conn)
          break
        except (IntegrityError, OperationalError, ProgrammingError):  # another process created the same tables just now (PostgreSQL)
          if attempt == 2: raise
      self._get_or_create(Meta.find, lambda: Meta(id=1, schema_version=SCHEMA_VERSION), lambda m: m.schema_version)
      with self._reader.connect() as conn: rev = migrate.revision(conn)
    migrate.check(rev or "", repr(self))

  def upgrade(self) -> tuple[str | None, str]:
    """Migrate to this tinytune's schema (`tinytune db upgrade`); (revision before or None for an empty database, revision after)."""
    return migrate.upgrade(self.engine, repr(self))

  def _get_or_create(self, find: Callable[[Session], Row | None], make: Callable[[], Row], value: Callable[[Row], Value]) -> Value:
    with self.session(write=False) as session:
      if (row := find(session)) is not None: return value(row)
    try:
      with self.session() as session:
        if (row := find(session)) is not None: return value(row)
        session.add(row := make())
        session.flush()
        return value(row)
    except IntegrityError:  # created by another process between our read and our insert
      with self.session(write=False) as session:
        if (row := find(session)) is None: raise
        return value(row)

  def _locked_upsert(self, write: Callable[[Session], Value]) -> Value:
    """`write` reads a row locked (FOR UPDATE on PostgreSQL; SQLite's writers queue anyway), compares, and updates or inserts it, in
    one transaction. Where another process inserted the same row between our read and our insert (IntegrityError), once more:
    the row is then theirs to compare with."""
    try:
      with self.session() as session: return write(session)
    except IntegrityError:
      with self.session() as session: return write(session)

  # ***** devices and kernels *****
  def device_id(self, fingerprint: dict[str, str]) -> int:
    """The id of the device with this fingerprint, added if new."""
    fp_hash = fingerprint_hash(fingerprint)
    def make() -> Device:
      cols = {c: str(fingerprint.get(c, "")) for c in ("name", "arch", "compiler", "compiler_version", "flags", "codegen_version")}
      return Device(fingerprint_hash=fp_hash, kind=str(fingerprint.get("kind", "")), fingerprint=to_json(fingerprint), **cols)
    return self._get_or_create(lambda s: Device.find(s, fp_hash), make, lambda d: d.id)

  def kernel_id(self, key: str, name: str, ast_text: str, sizes: Sequence[int], dtypes: Sequence[str], flops: int, nbytes: int) -> int:
    """The id of the kernel with this key, added if new."""
    def make() -> KernelRecord:
      return KernelRecord(key=key, name=name, ast_text=ast_text, sizes=to_json(list(sizes)), dtypes=to_json(list(dtypes)), flops=flops, nbytes=nbytes)
    return self._get_or_create(lambda s: KernelRecord.find(s, key), make, lambda k: k.id)

  # ***** search runs *****
  def start_run(self, workload: str, params: dict[str, Any], device_id: int, strategy: str, settings: dict[str, Any], budget: dict[str, Any],
                signature: str, dtype: str | None = None) -> int:
    with self.session() as session:
      run = SearchRun(workload=workload, params=to_json(params), device_id=device_id, strategy=strategy, settings=to_json(settings),
                      budget=to_json(budget), signature=signature, started_at=utcnow(), worker=f"{socket.gethostname()}:{os.getpid()}", dtype=dtype)
      session.add(run)
      session.flush()
      return run.id

  def resumable_run(self, signature: str) -> int | None:
    """The latest run with this signature that did not finish as "done" (interrupted, failed, or never marked: killed)."""
    with self.session(write=False) as session:
      run = SearchRun.latest_unfinished(session, signature)
      return run.id if run is not None else None

  def adopt_run(self, run_id: int) -> None:
    """Mark a resumed run as this process's, so that other workers of its study see its owner alive."""
    with self.session() as session:
      if (run := session.get(SearchRun, run_id)) is not None: run.worker = f"{socket.gethostname()}:{os.getpid()}"

  def run(self, run_id: int) -> RunRow | None:
    with self.session(write=False) as session:
      run = session.get(SearchRun, run_id)
      return RunRow.of(run) if run is not None else None

  def finish_run(self, run_id: int, outcome: str) -> None:
    if outcome not in OUTCOMES: raise ValueError(f"unknown run outcome {outcome!r}; known: {', '.join(OUTCOMES)}")
    with self.session() as session:
      if (run := session.get(SearchRun, run_id)) is None: raise LookupError(f"no search run with id {run_id}")
      run.outcome, run.ended_at = outcome, utcnow()

  # ***** candidates *****
  def record_candidate(self, run_id: int, kernel_id: int, device_id: int, opts_json: str, source_hash: str, compile_s: float, status: str,
                       min_s: float | None, median_s: float | None, spread: float | None, error: str = "") -> None:
    """Store one evaluated candidate and commit it now. Non-finite timings (a failure's inf) are stored as NULL."""
    if status not in STATUSES: raise ValueError(f"unknown candidate status {status!r}; known: {', '.join(STATUSES)}")
    with self.session() as session:
      session.add(Candidate(run_id=run_id, kernel_id=kernel_id, device_id=device_id, opts=opts_json, source_hash=source_hash, compile_s=compile_s,
                            status=status, min_s=_finite(min_s), median_s=_finite(median_s), spread=_finite(spread), error=error or "",
                            created_at=utcnow()))

  def stored_candidates(self, kernel_id: int, device_id: int) -> dict[str, CandidateRow]:
    """opts JSON -> the latest result stored for those opts on this kernel and device, from any run."""
    with self.session(write=False) as session:
      return {c.opts: CandidateRow.of(c) for c in Candidate.for_kernel(session, kernel_id, device_id)}

  def run_candidates(self, run_id: int) -> list[CandidateRow]:
    """Every candidate of a run in the order recorded (the same opts may appear twice: finalists are re-timed)."""
    with self.session(write=False) as session:
      return [CandidateRow.of(c) for c in Candidate.for_run(session, run_id)]

  # ***** the tuning cache *****
  def set_tuned(self, kernel_key: str, device_hash: str, opts_json: str, best_s: float, default_s: float | None, run_id: int | None,
                force: bool = False, kernel_name: str = "", workload: str = "", params: str = "") -> bool:
    """Store the best opts for (kernel key, device fingerprint hash) unless the entry there is faster; `force` replaces it anyway.
    True if stored. Both times were measured on the same fingerprint (hardware, compiler, flags, codegen version), so they
    compare: a slower result, from a smaller search or a noisier moment, never replaces a faster verified one, and workers
    that finish in any order leave the same best. `tinytune search --force` re-tunes and replaces. The kernel's name and
    the run's workload and params are filled in from this database where not given."""
    def write(session: Session) -> bool:
      entry = Tuned.find(session, kernel_key, device_hash, for_update=True)
      if entry is not None and not force and not row_problem("tuned", entry) and entry.best_s <= best_s: return False  # a bad one goes
      name, work, par = kernel_name, workload, params
      if not name and (kernel := KernelRecord.find(session, kernel_key)) is not None: name = kernel.name
      if not work and run_id is not None and (run := session.get(SearchRun, run_id)) is not None: work, par = run.workload, run.params
      if entry is None: session.add(entry := Tuned(kernel_key=kernel_key, device_hash=device_hash))
      entry.opts, entry.best_s, entry.default_s, entry.run_id, entry.updated_at = opts_json, best_s, default_s, run_id, utcnow()
      entry.kernel_name, entry.workload, entry.params = name, work, par or "{}"
      return True
    return self._locked_upsert(write)

  def tuned(self, kernel_key: str, device_hash: str) -> TunedRow | None:
    with self.session(write=False) as session:
      entry = Tuned.find(session, kernel_key, device_hash)
      if entry is not None and (why := row_problem("tuned", entry)):
        warn_once(f"skipping the bad tuning cache entry for {kernel_key[:8]} in {self!r}: {why}")
        return None
      return TunedRow.of(entry) if entry is not None else None

  def delete_tuned(self, kernel_key: str, device_hash: str) -> None:
    with self.session() as session:
      if (entry := Tuned.find(session, kernel_key, device_hash)) is not None: session.delete(entry)

  def tuned_entries(self, device_hash: str | None = None, workload: str | None = None) -> list[TunedRow]:
    """Every tuning cache entry (for one device, for one workload), in key order."""
    stmt = select(Tuned).order_by(Tuned.kernel_key, Tuned.device_hash)
    if device_hash is not None: stmt = stmt.where(Tuned.device_hash == device_hash)
    if workload is not None: stmt = stmt.where(Tuned.workload == workload)
    with self.session(write=False) as session: return [TunedRow.of(t) for t in skipping(list(session.scalars(stmt)), "tuned", repr(self))]

  def fingerprints(self) -> dict[str, dict[str, str]]:
    """Device fingerprint hash -> fingerprint, for every device this database knows."""
    with self.session(write=False) as session:
      return {d.fingerprint_hash: json.loads(d.fingerprint) for d in skipping(list(session.scalars(select(Device))), "devices", repr(self))}

  def prune_tuned(self, keep_codegen: str | None = None, before: datetime | None = None) -> int:
    """Drop tuning cache entries of devices with another codegen version (or unknown devices), or updated before `before`; how many."""
    with self.session() as session:
      entries = list(session.scalars(select(Tuned)))
      codegen = {d.fingerprint_hash: d.codegen_version for d in session.scalars(select(Device))}
      drop = [t for t in entries if (keep_codegen is not None and codegen.get(t.device_hash) != keep_codegen)
              or (before is not None and _utc(t.updated_at) < before)]
      for t in drop: session.delete(t)
      return len(drop)

  # ***** claims: workers of one study measure each candidate once *****
  def claim(self, study: str, kernel_id: int, device_id: int, source_hash: str, run_id: int) -> int:
    """Claim a candidate (by source hash) for `run_id` to measure; the run that holds the claim (ours, or the one that was first)."""
    def make() -> Claim:
      return Claim(study=study, kernel_id=kernel_id, device_id=device_id, source_hash=source_hash, run_id=run_id, claimed_at=utcnow())
    return self._get_or_create(lambda s: Claim.find(s, study, kernel_id, device_id, source_hash), make, lambda c: c.run_id)

  def claim_count(self, study: str, kernel_id: int, device_id: int) -> int:
    stmt = select(func.count()).select_from(Claim).where(Claim.study == study, Claim.kernel_id == kernel_id, Claim.device_id == device_id)
    with self.session(write=False) as session: return session.scalar(stmt) or 0

  def take_claim(self, study: str, kernel_id: int, device_id: int, source_hash: str, from_run: int, run_id: int) -> bool:
    """Move a claim whose run gave up (killed) to `run_id`; False if another run took it first. One conditional UPDATE: read
    first and then written, two runs taking it at once on PostgreSQL both got it (the second write waits for the first, then
    overwrites it)."""
    stmt = update(Claim).where(Claim.study == study, Claim.kernel_id == kernel_id, Claim.device_id == device_id,
                               Claim.source_hash == source_hash, Claim.run_id == from_run).values(run_id=run_id, claimed_at=utcnow())
    with self.session() as session: return session.connection().execute(stmt).rowcount == 1

  def last_candidate_id(self, run_id: int) -> int:
    """The id of the last candidate `run_id` recorded, 0 before its first: how a run shows it is making progress."""
    with self.session(write=False) as session:
      return session.scalar(select(func.max(Candidate.id)).where(Candidate.run_id == run_id)) or 0

  def claimed_result(self, run_id: int, kernel_id: int, device_id: int, source_hash: str) -> CandidateRow | None:
    """What `run_id` recorded for this source, once it has."""
    stmt = select(Candidate).where(Candidate.run_id == run_id, Candidate.kernel_id == kernel_id, Candidate.device_id == device_id,
                                   Candidate.source_hash == source_hash).order_by(Candidate.id.desc()).limit(1)
    with self.session(write=False) as session:
      c = session.scalars(stmt).first()
      return CandidateRow.of(c) if c is not None else None

  # ***** baselines *****
  def add_baseline(self, device_id: int, workload: str, params: dict[str, Any], library: str, library_version: str, median_s: float,
                   min_s: float, dtype: str = "float32") -> int:
    with self.session() as session:
      baseline = Baseline(device_id=device_id, workload=workload, params=to_json(params), library=library, library_version=library_version,
                          median_s=median_s, min_s=min_s, created_at=utcnow(), dtype=dtype)
      session.add(baseline)
      session.flush()
      return baseline.id

  def baselines(self, device_id: int | None = None, workload: str | None = None, params: dict[str, Any] | None = None,
                library: str | None = None, dtype: str | None = None) -> list[BaselineRow]:
    """Baselines matching every filter given, oldest first."""
    stmt = select(Baseline).order_by(Baseline.id)
    if device_id is not None: stmt = stmt.where(Baseline.device_id == device_id)
    if workload is not None: stmt = stmt.where(Baseline.workload == workload)
    if params is not None: stmt = stmt.where(Baseline.params == to_json(params))
    if library is not None: stmt = stmt.where(Baseline.library == library)
    if dtype is not None: stmt = stmt.where(Baseline.dtype == dtype)
    with self.session(write=False) as session:
      return [BaselineRow.of(b) for b in session.scalars(stmt)]

  # ***** device peaks *****
  def set_peak(self, device_id: int, gflops: float, gbs: float, probe: str) -> None:
    """Store the measured peak GFLOPS and GB/s of a device, keeping the higher of the stored and the new value of each:
    a probe that ran beside other work measures low, and a roof below the kernels it bounds is no roof."""
    def write(session: Session) -> None:
      if (peak := Peak.find(session, device_id, for_update=True)) is None: session.add(peak := Peak(device_id=device_id, gflops=0.0, gbs=0.0))
      if gflops > peak.gflops or gbs > peak.gbs: peak.probe, peak.created_at = probe, utcnow()
      peak.gflops, peak.gbs = max(peak.gflops, gflops), max(peak.gbs, gbs)
    self._locked_upsert(write)

  def peak(self, device_id: int) -> PeakRow | None:
    with self.session(write=False) as session:
      peak = Peak.find(session, device_id)
      return PeakRow(peak.device_id, peak.gflops, peak.gbs, peak.probe, _utc(peak.created_at)) if peak is not None else None
