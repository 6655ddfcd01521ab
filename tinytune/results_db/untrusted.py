"""SQLite files and JSON text from outside, read as untrusted: only our own tables with the expected columns (no views, triggers,
virtual tables or generated columns, which can run any query when read), SQLite's own defences on, every query cut off past a
time bound, and every value's size and nesting bounded before it is parsed."""
from __future__ import annotations

import os
import re
import sqlite3
import time
import urllib.parse
from typing import Any, Callable

QUERY_SECONDS = 5.0  # no query on a file we made takes near this long; one that does is hostile
MAX_ROW = 1 << 20  # bytes of one row: an entry with the longest opts JSON (64 Ki characters) fits many times over
MAX_ROWS = 200_000
MAX_DEPTH = 4  # JSON nesting: opts are a list of lists, params and fingerprints a dict of scalars or lists


def foreign_objects(conn: sqlite3.Connection) -> list[str]:
  """The views, triggers and virtual tables a database holds ("view 'v'"): each can run any query when the file is read."""
  rows = conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
  return [f"{kind} {name!r}" for kind, name, sql in rows
          if kind in ("view", "trigger") or (kind == "table" and re.match(r"\s*CREATE\s+VIRTUAL\b", sql or "", re.I))]


class Hardened(sqlite3.Connection):
  """A connection where functions in the schema may not have side effects, the schema cannot be written, and any one query is
  interrupted after QUERY_SECONDS."""

  def __init__(self, *args: Any, **kwargs: Any):
    super().__init__(*args, **kwargs)
    self.deadline = 0.0
    self.set_progress_handler(lambda: time.monotonic() > self.deadline, 10_000)  # a true return aborts the query ("interrupted")
    self.execute("PRAGMA trusted_schema = OFF")
    if hasattr(self, "setconfig") and hasattr(sqlite3, "SQLITE_DBCONFIG_DEFENSIVE"):  # Python 3.12+; 3.11 has no way to set it
      self.setconfig(sqlite3.SQLITE_DBCONFIG_DEFENSIVE, True)

  def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
    self.deadline = time.monotonic() + QUERY_SECONDS
    return super().execute(sql, parameters)


def open_file(path: str | os.PathLike, tables: dict[str, list[tuple[str, str]]], what: str, error: Callable[[str], Exception]) -> sqlite3.Connection:
  """A read-only connection to a SQLite file whose schema is exactly `tables` (name -> [(column, declared type)], in order) with
  their automatic indexes, and whose rows are within MAX_ROWS and MAX_ROW; `error(why)` is raised otherwise."""
  uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro&immutable=1"  # immutable: no locks, no -wal or -shm files
  conn = sqlite3.connect(uri, uri=True, factory=Hardened)
  try:
    if foreign := foreign_objects(conn): raise error(f"not a {what}: it holds the {foreign[0]}")
    for kind, name, table in conn.execute("SELECT type, name, tbl_name FROM sqlite_master").fetchall():
      ok = name in tables if kind == "table" else kind == "index" and table in tables and name.startswith(f"sqlite_autoindex_{table}_")
      if not ok: raise error(f"not a {what}: it holds the {kind} {name!r}")
    for name, columns in tables.items():
      found = [(c[1], c[2].upper(), c[6]) for c in conn.execute(f"PRAGMA table_xinfo({name})").fetchall()]
      if not found: raise error(f"not a readable {what} (no table {name!r})")
      if found != [(c, t, 0) for c, t in columns]: raise error(f"not a {what}: its table {name!r} has other columns")
      sizes = " + ".join(f"ifnull(length(CAST({c} AS BLOB)), 0)" for c, _ in columns)
      rows, largest = conn.execute(f"SELECT count(*), max({sizes}) FROM {name}").fetchone()
      if rows > MAX_ROWS: raise error(f"its table {name!r} has {rows} rows, more than a {what} holds ({MAX_ROWS})")
      if (largest or 0) > MAX_ROW: raise error(f"its table {name!r} has a row of {largest} bytes, more than a {what} holds ({MAX_ROW})")
    return conn
  except BaseException:
    conn.close()
    raise


def json_depth(text: str) -> int:
  """How deep the JSON text's lists and objects nest, counted without parsing it (strings do not count)."""
  depth = deepest = 0
  for bracket in re.findall(r"[\[\]{}]", re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)):
    depth += 1 if bracket in "[{" else -1
    deepest = max(deepest, depth)
  return deepest


def loads(text: Any, what: str, max_len: int = MAX_ROW, max_depth: int = MAX_DEPTH) -> Any:
  """json.loads of a bounded text; ValueError (naming `what`) for a value that is not text, too long or too deeply nested."""
  import json
  if not isinstance(text, str): raise ValueError(f"{what} is {type(text).__name__}, not JSON text")
  if len(text) > max_len: raise ValueError(f"{what} is {len(text)} characters long, more than {max_len}")
  if json_depth(text) > max_depth: raise ValueError(f"{what} nests deeper than {max_depth}")
  return json.loads(text)


MAX_OPTS = 64  # opts in one entry: a search adds a few per axis; a longer list is no kernel's


def opts_problem(opts: Any, strict: bool = True) -> str | None:
  """Why a stored opts text cannot be a kernel's opts, checked for size and nesting before it is parsed; `strict=False` asks only
  for a short JSON list (what a report shows), not valid opts (which the kernel checks where they are used). None if it can."""
  from tinytune.codegen.opts import MAX_OPTS_JSON, opts_from_json
  try:
    parsed = opts_from_json(opts) if strict else loads(opts, "opts", MAX_OPTS_JSON, 2)
    if not isinstance(parsed, list): return "opts are not a JSON list"
    if len(parsed) > MAX_OPTS: return f"{len(parsed)} opts, more than a kernel takes ({MAX_OPTS})"
  except (ValueError, TypeError, RecursionError) as e: return str(e)[:100] or type(e).__name__
  return None


def entry_problem(opts: Any, params: Any, strict: bool = True) -> str | None:
  """Why a tuning cache entry's opts and params cannot be a kernel's, or None."""
  if why := opts_problem(opts, strict): return why
  try:
    if not isinstance(loads(params, "params"), dict): return "params are not a JSON object"
  except (ValueError, RecursionError) as e: return str(e)[:100] or type(e).__name__
  return None
