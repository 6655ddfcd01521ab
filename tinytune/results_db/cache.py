"""Tuning cache files: the best verified opts per (kernel key, device fingerprint), in a standalone SQLite file with a manifest.

`export` writes one from a results database, `merge` joins several (the fastest entry per kernel and device wins), and a
deployment lists them in TINYTUNE_CACHE=path1:path2. Files are read read-only and immutable, so a read-only filesystem works,
and everything in them is data: opts are JSON that the kernel validates before use; nothing is unpickled or executed. A file
that is missing, truncated, corrupt, from a newer format, or edited by hand (the checksum covers every entry and device) fails
to open with CacheFileError, which a lookup turns into one warning line and the default opts."""
from __future__ import annotations

import functools
import hashlib
import math
import os
import pathlib
import sqlite3
import stat
from dataclasses import astuple, dataclass, fields
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from tinytune.results_db import untrusted
from tinytune.results_db.db import Database, database_url, fingerprint_hash, to_json

FORMAT_VERSION = 1
MAGIC = "tinytune tuning cache"
SCHEMA = """
CREATE TABLE manifest (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE devices (hash TEXT PRIMARY KEY, fingerprint TEXT NOT NULL);
CREATE TABLE entries (kernel_key TEXT NOT NULL, device_hash TEXT NOT NULL REFERENCES devices (hash), kernel_name TEXT NOT NULL,
                      workload TEXT NOT NULL, params TEXT NOT NULL, opts TEXT NOT NULL, best_s REAL NOT NULL, default_s REAL,
                      updated_at TEXT NOT NULL, PRIMARY KEY (kernel_key, device_hash));
"""


TABLES = {"manifest": [("key", "TEXT"), ("value", "TEXT")], "devices": [("hash", "TEXT"), ("fingerprint", "TEXT")],
          "entries": [("kernel_key", "TEXT"), ("device_hash", "TEXT"), ("kernel_name", "TEXT"), ("workload", "TEXT"), ("params", "TEXT"),
                      ("opts", "TEXT"), ("best_s", "REAL"), ("default_s", "REAL"), ("updated_at", "TEXT")]}  # what SCHEMA makes


class CacheFileError(ValueError):
  """A cache file that cannot be used: the message says why, in one line."""


def regular_file(path: str | os.PathLike, what: str, error: type[Exception]) -> None:
  """Raise `error` unless `path` is a regular file: a FIFO, a device or a folder would block or fail deep inside SQLite."""
  try: mode = os.stat(path).st_mode
  except OSError as e: raise error(f"{path} is not a readable {what} ({e.strerror})") from None
  if not stat.S_ISREG(mode): raise error(f"{path}: the {what} is not a regular file")


@dataclass(frozen=True)
class Entry:
  """One tuned kernel on one device. `params` and `opts` are JSON text; times in seconds; `updated_at` ISO 8601 in UTC."""
  kernel_key: str
  device_hash: str
  kernel_name: str
  workload: str
  params: str
  opts: str
  best_s: float
  default_s: float | None
  updated_at: str

  @property
  def speedup(self) -> float | None: return self.default_s / self.best_s if self.default_s else None


@dataclass(frozen=True)
class CacheFile:
  path: str
  manifest: dict[str, Any]
  devices: dict[str, dict[str, str]]  # fingerprint hash -> fingerprint
  entries: list[Entry]

  @staticmethod
  def open(path: str | os.PathLike) -> CacheFile:
    """Read and check a whole cache file; CacheFileError if it is not one this tinytune can trust."""
    regular_file(path, "tinytune cache file", CacheFileError)
    try:
      conn = untrusted.open_file(path, TABLES, "tinytune cache file", lambda why: CacheFileError(f"{path}: {why}"))
      try:
        manifest = dict(conn.execute("SELECT key, value FROM manifest").fetchall())
        devices = conn.execute("SELECT hash, fingerprint FROM devices ORDER BY hash").fetchall()
        rows = conn.execute(f"SELECT {', '.join(f.name for f in fields(Entry))} FROM entries ORDER BY kernel_key, device_hash").fetchall()
      finally: conn.close()
      return _checked(str(path), manifest, devices, rows)
    except CacheFileError: raise
    except Exception as e:  # whatever a damaged or hostile file makes SQLite or the checks raise, it is one kind of error
      raise CacheFileError(f"{path} is not a readable tinytune cache file ({type(e).__name__}: {str(e)[:80]})") from None

  def for_device(self, device_hash: str) -> dict[str, Entry]: return {e.kernel_key: e for e in self.entries if e.device_hash == device_hash}


def _checked(path: str, manifest: dict[str, Any], devices: list[tuple], rows: list[tuple]) -> CacheFile:
  def check(cond: bool, why: str) -> None:
    if not cond: raise CacheFileError(f"{path}: {why}")
  check(manifest.get("magic") == MAGIC, "not a tinytune cache file (no manifest)")
  version = manifest.get("format_version", "")
  check(isinstance(version, str) and version.isascii() and version.isdigit(), f"bad format version {version!r:.40}")
  check(int(version) <= FORMAT_VERSION, f"cache format {version} is newer than this tinytune reads ({FORMAT_VERSION}): upgrade tinytune")
  check(manifest.get("checksum") == checksum(devices, rows), "checksum mismatch: the file is damaged or was edited")
  fingerprints: dict[str, dict[str, str]] = {}
  for h, text in devices:
    try: fp = untrusted.loads(text, "a fingerprint")
    except ValueError: fp = None
    check(isinstance(h, str) and isinstance(fp, dict) and fingerprint_hash(fp) == h, f"device {str(h)[:12]} does not match its fingerprint")
    fingerprints[h] = fp  # type: ignore[assignment]
  entries = []
  for row in rows:
    check(len(row) == len(fields(Entry)) and all(isinstance(x, str) for i, x in enumerate(row) if i not in (6, 7)), f"bad entry {row!r:.80}")
    best_s, default_s = row[6], row[7]
    check(_positive(best_s) and (default_s is None or _positive(default_s)), f"bad timing in entry {row!r:.80}")
    check(row[1] in fingerprints, f"entry {row[0][:12]} names an unknown device")
    if why := untrusted.entry_problem(row[5], row[4]): check(False, f"entry {row[0][:12]}: {why}")
    entries.append(Entry(row[0], row[1], row[2], row[3], row[4], row[5], float(best_s), None if default_s is None else float(default_s), row[8]))
  return CacheFile(path, manifest, fingerprints, entries)


def _positive(x: Any) -> bool: return type(x) in (int, float) and math.isfinite(x) and x > 0


def checksum(devices: Iterable[tuple], rows: Iterable[tuple]) -> str:
  """sha256 of the devices and entries as canonical JSON, both sorted by key."""
  return hashlib.sha256(to_json({"devices": sorted(map(list, devices)), "entries": sorted(map(list, rows))}).encode()).hexdigest()


def write(path: str | os.PathLike, entries: Iterable[Entry], devices: dict[str, dict[str, str]]) -> CacheFile:
  """Write a cache file (replacing `path` atomically); only devices that have entries are kept."""
  from tinytune import __version__
  entries = sorted(entries, key=lambda e: (e.kernel_key, e.device_hash))
  device_rows = sorted((h, to_json(devices[h])) for h in {e.device_hash for e in entries})
  rows = [astuple(e) for e in entries]
  manifest = {"magic": MAGIC, "format_version": str(FORMAT_VERSION), "tinytune_version": __version__,
              "created_at": datetime.now(timezone.utc).isoformat(), "entries": str(len(rows)),
              "devices": to_json([h for h, _ in device_rows]), "checksum": checksum(device_rows, rows)}
  mode = _replaceable(path)
  tmp = pathlib.Path(f"{path}.tmp{os.getpid()}")
  try:
    tmp.unlink(missing_ok=True)
    with sqlite3.connect(tmp) as conn:
      conn.executescript(SCHEMA)
      conn.executemany("INSERT INTO manifest VALUES (?, ?)", manifest.items())
      conn.executemany("INSERT INTO devices VALUES (?, ?)", device_rows)
      conn.executemany(f"INSERT INTO entries VALUES ({', '.join('?' * len(fields(Entry)))})", rows)
    conn.close()
    if mode is not None: os.chmod(tmp, mode)  # a rewritten file keeps its mode
    os.replace(tmp, path)
  except (OSError, sqlite3.Error) as e:
    tmp.unlink(missing_ok=True)
    raise CacheFileError(f"cannot write {path}: {e}") from None
  return CacheFile.open(path)


def _replaceable(path: str | os.PathLike) -> int | None:
  """The mode of the regular, writable file at `path` that a write may replace (None where there is none); CacheFileError for
  anything else there: a link, a folder, a device or a FIFO is never replaced by a file, and a read-only file is not rewritten."""
  try: st = os.lstat(path)
  except FileNotFoundError: return None
  except OSError as e: raise CacheFileError(f"cannot write {path}: {e.strerror}") from None
  if not stat.S_ISREG(st.st_mode): raise CacheFileError(f"{path} exists and is not a regular file (a link, folder, device or FIFO): not replacing it")
  if not st.st_mode & 0o222 or not os.access(path, os.W_OK): raise CacheFileError(f"{path} is read-only: not rewriting it")
  return stat.S_IMODE(st.st_mode)


def fastest(entries: Iterable[Entry]) -> list[Entry]:
  """One entry per (kernel, device): the one measured fastest (the newer one on a tie)."""
  best: dict[tuple[str, str], Entry] = {}
  for e in entries:
    old = best.get((e.kernel_key, e.device_hash))
    if old is None or (e.best_s, old.updated_at) < (old.best_s, e.updated_at): best[e.kernel_key, e.device_hash] = e
  return list(best.values())


# ***** files from and into a results database *****
def export(db: Database, path: str | os.PathLike, device_hash: str | None = None, workload: str | None = None) -> CacheFile:
  """The database's tuning cache (for one device fingerprint hash, for one workload) as a cache file."""
  entries = [Entry(t.kernel_key, t.device_hash, t.kernel_name, t.workload, t.params, t.opts_json, t.best_s, t.default_s, t.updated_at.isoformat())
             for t in db.tuned_entries(device_hash, workload)]
  fingerprints = db.fingerprints()
  return write(path, [e for e in entries if e.device_hash in fingerprints], fingerprints)


def merge(paths: Iterable[str | os.PathLike], out: str | os.PathLike) -> CacheFile:
  files = [CacheFile.open(p) for p in paths]
  return write(out, fastest(e for f in files for e in f.entries), {h: fp for f in files for h, fp in f.devices.items()})


def import_file(db: Database, path: str | os.PathLike, force: bool = False) -> tuple[int, int]:
  """Add a file's entries to the database's tuning cache; (stored, kept because the database's entry was faster)."""
  cache = CacheFile.open(path)
  for fp in cache.devices.values(): db.device_id(fp)
  stored = sum(db.set_tuned(e.kernel_key, e.device_hash, e.opts, e.best_s, e.default_s, None, force, e.kernel_name, e.workload, e.params)
               for e in cache.entries)
  return stored, len(cache.entries) - stored


def prune(cache: CacheFile, out: str | os.PathLike, keep_codegen: str | None, before: datetime | None) -> tuple[CacheFile, int]:
  """The file without entries for other codegen versions or updated before `before`; (the new file, entries dropped)."""
  def keep(e: Entry) -> bool:
    if keep_codegen is not None and cache.devices[e.device_hash].get("codegen_version") != keep_codegen: return False
    return before is None or datetime.fromisoformat(e.updated_at) >= before
  kept = [e for e in cache.entries if keep(e)]
  return write(out, kept, cache.devices), len(cache.entries) - len(kept)


# ***** lookup for deployments *****
@functools.lru_cache(maxsize=16)
def deployed(paths: str, device_hash: str, warn: Callable[[str], None]) -> dict[str, tuple[str, Entry]]:
  """kernel key -> (file, the fastest entry on this device) over the files in `paths` (TINYTUNE_CACHE, colon separated).
  A file that cannot be used, or has nothing for this device, costs one warning and is skipped."""
  found: dict[str, tuple[str, Entry]] = {}
  for path in filter(None, paths.split(os.pathsep)):
    try: cache = CacheFile.open(path)
    except CacheFileError as error:
      warn(f"{error}; ignoring it")
      continue
    if not (mine := cache.for_device(device_hash)):
      theirs = ", ".join(h[:12] for h in cache.devices) or "none"
      warn(f"the cache file {path} holds no entries for this device (fingerprint {device_hash[:12]}; it has {theirs}); ignoring it")
    for key, e in mine.items():
      if key not in found or e.best_s < found[key][1].best_s: found[key] = (path, e)
  return found


@dataclass(frozen=True)
class Tuned:
  """What the tuning cache has for a kernel on a device: validated opts, their timings, and where they came from."""
  opts: tuple
  best_s: float
  default_s: float | None
  where: str


class TuningCache:
  """The one answer to "which tuned opts does this kernel have here". With a Database: that database's tuning cache. Without:
  the user's own database ($TINYTUNE_DB or the default file, read only, never created), then the entry measured fastest on this
  device among the cache files in $TINYTUNE_CACHE. Entries whose opts the kernel refuses, and unusable databases or files, cost
  one warning line each and are skipped."""

  def __init__(self, db: Database | None = None): self.db = db

  def lookup(self, kernel: Any, device: str) -> Tuned | None:
    from tinytune.codegen.opts import opts_from_json
    from tinytune.helpers import warn_once
    from tinytune.runtime import device_fingerprint
    device_hash = fingerprint_hash(device_fingerprint(device))
    for where, opts_json, best_s, default_s in self._entries(kernel.key, device_hash, warn_once):
      try:
        opts = tuple(opts_from_json(opts_json))
        kernel.copy().apply_opts(opts)
        return Tuned(opts, best_s, default_s, where)
      except Exception as e:  # KernelOptError or ValueError for a bad entry; anything else from a hostile one is no better
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        warn_once(f"ignoring the tuning cache entry for {kernel.name} ({kernel.key[:8]}) in {where}: {why}")
    return None

  def _entries(self, key: str, device_hash: str, warn: Callable[[str], None]) -> list[tuple[str, str, float, float | None]]:
    if self.db is not None:
      row = self.db.tuned(key, device_hash)
      return [] if row is None else [(repr(self.db), row.opts_json, row.best_s, row.default_s)]
    found = []
    shown = os.getenv("TINYTUNE_DB") or "the default database"
    try:  # $TINYTUNE_DB or the default file, read only: a program never creates it
      parsed = database_url(None)
      shown = parsed.render_as_string()
      sqlite_file = parsed.database if parsed.get_backend_name() == "sqlite" and parsed.database else None
      if not (sqlite_file and not os.path.exists(sqlite_file)):
        if sqlite_file: regular_file(sqlite_file, "database", ValueError)
        if isinstance(reader := _reader(parsed.render_as_string(hide_password=False)), Exception): raise reader
        if (row := reader.tuned(key, device_hash)) is not None:
          found.append((shown, row.opts_json, row.best_s, row.default_s))
    except Exception as e:  # an unusable database costs a warning, never the program
      warn(f"the tuning cache {shown} is unusable ({(str(e).splitlines() or [type(e).__name__])[0]}); not using it")
    if (cached := deployed(os.getenv("TINYTUNE_CACHE", ""), device_hash, warn).get(key)) is not None:
      path, entry = cached
      found.append((path, entry.opts, entry.best_s, entry.default_s))
    return found


@functools.lru_cache(maxsize=8)
def _reader(url: str) -> Database | Exception:
  """The database a program reads, or why it cannot: kept, so a locked or unusable database is waited for once, not per kernel."""
  try: return Database(url, read_only=True)
  except Exception as e: return e
