"""The hostile-input suite: cache files, results databases, environments and database URLs that a hostile or unlucky user points
tinytune at. Each input runs in a subprocess under a timeout and must give the right result with at most one warning line of at
most 200 characters (or, for a command it makes fail, one error line and a non-zero exit): no traceback, no hang."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

from tinytune.results_db import Database, fingerprint_hash
from tinytune.results_db.cache import CacheFileError, Entry, write
from tinytune.runtime import device_fingerprint

TIMEOUT = 30  # every input here finishes in a few seconds when handled; a hang is cut here and fails its test
GOOD_OPTS = '[["UPCAST",1,4]]'
NEVER_ENDS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT t.* FROM {0}, c WHERE c.x < 0"

# Runs a program with TINYTUNE_CACHE=FILE, then the cache commands on FILE, each step printing one JSON line as it ends, so a
# hang names its step. A step that raises out of main() is a traceback.
DRIVER = textwrap.dedent("""
  import contextlib, io, json, os, sys, traceback
  path, good, tmp = sys.argv[1:4]
  os.environ["TINYTUNE_CACHE"] = path
  def step(name, fn):
    err = io.StringIO()
    try:
      with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()): rc = fn()
    except BaseException: rc, err = "traceback", io.StringIO(traceback.format_exc())
    print(json.dumps([name, rc, err.getvalue()]), flush=True)
  def program():
    import numpy as np
    from tinytune import Tensor
    a, b = Tensor.rand(32, 32), Tensor.rand(32, 32)
    return 0 if np.allclose((a @ b).numpy(), a.numpy() @ b.numpy(), atol=1e-4) else "wrong result"
  from tinytune.cli import main
  db = f"sqlite:///{tmp}/imported.db"
  step("program", program)
  step("cache list", lambda: main(["cache", "list", path]))
  step("cache verify", lambda: main(["cache", "verify", path]))
  step("cache merge", lambda: main(["cache", "merge", path, good, "--out", f"{tmp}/merged.ttc"]))
  step("cache import", lambda: main(["cache", "import", path, "--db", db]))
  step("cache list --db", lambda: main(["cache", "list", "--db", db]))
  step("report", lambda: main(["report", "--db", db, "--table", "best"]))
""")


def matmul32_key() -> str:
  from tinytune import Device, Kernel, Tensor
  from tinytune.engine.schedule import create_schedule
  a, b = Tensor.rand(32, 32).realize(), Tensor.rand(32, 32).realize()
  return Kernel(create_schedule((a @ b).uop, "CPU")[0][0].ast, Device["CPU"].caps).key


def cache_file(path: Path, opts: Any = GOOD_OPTS, key: Any = None, best_s: Any = 1e-6) -> Path:
  """A cache file with one entry for the 32x32 matmul here, its checksum matching whatever the entry holds."""
  fp = device_fingerprint("CPU")
  entry = Entry(key if key is not None else matmul32_key(), fingerprint_hash(fp), "r_32_32_32", "matmul", '{"m":32,"n":32,"k":32}', opts,
                best_s, 2e-6, "2026-01-01T00:00:00+00:00")
  try: write(path, [entry], {fingerprint_hash(fp): fp})
  except CacheFileError: pass  # written, then refused when read back: the file is what the test wants
  return path


def edited(path: Path, *statements: str) -> Path:
  with sqlite3.connect(path) as conn:
    for s in statements: conn.execute(s)
  conn.close()
  return path


def view_over(table: str, columns: str) -> Callable[[Path], Path]:
  """The table replaced by a view over a recursive query that never ends (SQLite has no bound on it)."""
  return lambda p: edited(p, f"ALTER TABLE {table} RENAME TO t", f"CREATE VIEW {table} ({columns}) AS " + NEVER_ENDS.format("t"))


ENTRY_COLUMNS = "kernel_key, device_hash, kernel_name, workload, params, opts, best_s, default_s, updated_at"
HOSTILE_FILES: dict[str, Callable[[Path], Path]] = {
  "entries view, recursive": lambda p: view_over("entries", ENTRY_COLUMNS)(cache_file(p)),
  "manifest view, recursive": lambda p: view_over("manifest", "key, value")(cache_file(p)),
  "trigger": lambda p: edited(cache_file(p), "CREATE TRIGGER t AFTER INSERT ON manifest BEGIN SELECT 1; END"),
  "virtual table": lambda p: edited(cache_file(p), "CREATE VIRTUAL TABLE v USING rtree(id, a, b)"),
  "extra column": lambda p: edited(cache_file(p), "ALTER TABLE entries ADD COLUMN x TEXT"),
  "million-entry opts": lambda p: cache_file(p, json.dumps([["SWAP", 0, 1]] * 1_000_000)),
  "200,000-deep opts": lambda p: cache_file(p, "[" * 200_000 + "]" * 200_000),
  "10 MB opts string": lambda p: cache_file(p, json.dumps(["x" * 10_000_000])),
  "100-entry opts": lambda p: cache_file(p, json.dumps([["SWAP", 0, 1]] * 100)),
  "integer key": lambda p: cache_file(p, key=12345),
  "text best time": lambda p: cache_file(p, best_s="fast"),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
  return cache_file(tmp_path_factory.mktemp("good") / "good.ttc")


def run_driver(file: Path, good: Path, tmp: Path) -> dict[str, tuple[Any, str]]:
  try: out = subprocess.run([sys.executable, "-c", DRIVER, str(file), str(good), str(tmp)], capture_output=True, text=True, timeout=TIMEOUT,
                            env={**os.environ, "TINYTUNE_DB": f"sqlite:///{tmp / 'none.db'}"}).stdout
  except subprocess.TimeoutExpired as e: out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
  return {name: (rc, err) for name, rc, err in map(json.loads, out.splitlines())}


def one_line(err: str, kind: str) -> bool:
  lines = err.strip().splitlines()
  return len(lines) == 1 and lines[0].startswith(f"tinytune: {kind}:") and len(lines[0]) <= 200


@pytest.mark.parametrize("name", list(HOSTILE_FILES))
def test_hostile_cache_file(tmp_path: Path, good: Path, name: str) -> None:
  """A program runs right with one warning; the commands that read the file refuse it in one line; nothing reaches the database."""
  results = run_driver(HOSTILE_FILES[name](tmp_path / "hostile.ttc"), good, tmp_path)
  assert "report" in results, f"hung after {list(results)}"
  rc, err = results["program"]
  assert rc == 0 and one_line(err, "warning"), err[-600:]
  for step in ("cache list", "cache verify", "cache merge", "cache import"):
    rc, err = results[step]
    assert rc == 2 and one_line(err, "error"), (step, rc, err[-600:])
  for step in ("cache list --db", "report"):
    rc, err = results[step]
    assert rc == 0 and err == "", (step, rc, err[-600:])
  assert not (tmp_path / "merged.ttc").exists()


def test_the_good_file_runs_clean(tmp_path: Path, good: Path) -> None:
  """The control: the same steps on an untouched file all succeed with nothing on stderr."""
  results = run_driver(good, good, tmp_path)
  assert all(rc == 0 and err == "" for rc, err in results.values()) and len(results) == 7, results


# ***** rows already in a results database, from before imports were checked *****
BAD_ROWS: dict[str, tuple[str, dict[str, Any]]] = {  # (table, new values): a tuned row is the one keyed "bad", other tables' every row
  "200,000-deep opts": ("tuned", {"opts": "[" * 200_000 + "]" * 200_000}),
  "million-entry opts": ("tuned", {"opts": json.dumps([["SWAP", 0, 1]] * 1_000_000)}),
  "not JSON": ("tuned", {"opts": "not json"}),
  "text best time": ("tuned", {"best_s": "fast"}),
  "negative time": ("tuned", {"best_s": -1.0}),
  "101 opts": ("tuned", {"opts": json.dumps([["UPCAST", 0, 2]] * 101)}),
  "blob params": ("tuned", {"params": b"\x00\x01"}),
  "candidate opts 10 MB": ("candidates", {"opts": json.dumps(["x" * 10_000_000])}),
  "run params deep": ("runs", {"params": "[" * 200_000 + "]" * 200_000}),
  "kernel dtypes not JSON": ("kernels", {"dtypes": "float32"}),
  "baseline time text": ("baselines", {"median_s": "slow"}),
  "device fingerprint a list": ("devices", {"fingerprint": "[1, 2]"}),
}


@pytest.mark.parametrize("name", list(BAD_ROWS))
def test_a_bad_row_in_a_database_is_skipped(tmp_path: Path, name: str) -> None:
  """`report`, `cache list` and `cache export` of a database holding a bad row (in the tuning cache, or any table a report
  reads) warn once and go on with the good rows."""
  path = tmp_path / "r.db"
  db = Database(f"sqlite:///{path}")
  fp = device_fingerprint("CPU")
  device = db.device_id(fp)
  kernel = db.kernel_id("good", "r_32_32_32", "ast", [32, 32, 32], ["float32"], 65536, 12288)
  run = db.start_run("matmul", {"m": 32}, device, "beam", {}, {"candidates": 1}, "sig", "float32")
  db.record_candidate(run, kernel, device, GOOD_OPTS, "h", 0.1, "ok", 1e-3, 1e-3, 0.0)
  db.add_baseline(device, "matmul", {"m": 32, "n": 32, "k": 32}, "numpy", "2", 1e-3, 1e-3)
  for key in ("good", "bad"): db.set_tuned(key, fingerprint_hash(fp), GOOD_OPTS, 1e-3, 2e-3, run, workload="matmul", params='{"m":32}')
  db.close()
  table, columns = BAD_ROWS[name]
  with sqlite3.connect(path) as conn:
    conn.execute(f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in columns)}" + (" WHERE kernel_key = 'bad'" if table == "tuned" else ""),
                 list(columns.values()))
  conn.close()
  code = textwrap.dedent(f"""
    import sys
    from tinytune import helpers
    from tinytune.cli import main
    for argv in (["report"], ["cache", "list"], ["cache", "export", "--all", "--out", {str(tmp_path / 'out.ttc')!r}]):
      helpers._warned.clear()  # each command warns as a process of its own would
      rc = main([*argv, "--db", {str(path)!r}])
      print("rc", rc, flush=True)
      print("--", file=sys.stderr, flush=True)
  """)
  run_ = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
  assert run_.stdout.count("rc 0") == 3 and "Traceback" not in run_.stderr, run_.stderr[-600:]
  errs = run_.stderr.split("--\n")[:3]
  assert all(err == "" or one_line(err, "warning") for err in errs) and any(errs), run_.stderr[-600:]
  assert "r_32_32_32" in run_.stdout  # the good rows are shown


# ***** results databases that are not ours *****
@pytest.mark.parametrize("name, sql", [
  ("view", "CREATE VIEW v AS " + NEVER_ENDS.format("tuned")),
  ("trigger", "CREATE TRIGGER t AFTER INSERT ON runs BEGIN SELECT 1; END"),
  ("tuned view, recursive", "ALTER TABLE tuned RENAME TO t2; CREATE VIEW tuned AS " + NEVER_ENDS.format("t2")),
])
def test_a_database_with_views_or_triggers_is_refused(tmp_path: Path, name: str, sql: str) -> None:
  path = tmp_path / "r.db"
  Database(f"sqlite:///{path}").close()
  with sqlite3.connect(path) as conn: conn.executescript(sql)
  conn.close()
  for argv in (["report", "--db", str(path)], ["cache", "list", "--db", str(path)], ["db", "version", "--db", str(path)]):
    run = subprocess.run([sys.executable, "-m", "tinytune.cli", *argv], capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode == 2 and one_line(run.stderr, "error") and "not a tinytune" in run.stderr, (argv, run.stderr[-600:])
  code = "import numpy as np\nfrom tinytune import Tensor\nassert np.allclose((Tensor([1.0, 2.0]) * 3).numpy(), [3, 6])"
  run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, "TINYTUNE_DB": str(path)})
  assert run.returncode == 0 and one_line(run.stderr, "warning"), run.stderr[-600:]


# ***** the environment and database URLs *****
@pytest.mark.parametrize("var, value", [("DEBUG", "abc"), ("DEBUG", "1.5"), ("NOOPT", "abc"), ("WINO", "abc"), ("BEAM", "x"),
                                        ("TINYTUNE_BUDGET", "-1"), ("TINYTUNE_POOL_BYTES", "lots"), ("TINYTUNE_DB_TIMEOUT", "soon")])
def test_a_bad_environment_variable_is_one_line_naming_it(var: str, value: str) -> None:
  run = subprocess.run([sys.executable, "-m", "tinytune.cli", "kernels"], capture_output=True, text=True, timeout=TIMEOUT,
                       env={**os.environ, var: value})
  assert run.returncode == 2 and one_line(run.stderr, "error") and f"{var}={value!r}" in run.stderr, run.stderr[-600:]


@pytest.mark.parametrize("url", ["mysql://u:p@localhost/x", "sqlite://user:pw@/tmp/x.db", "postgresql+psycopg://u:secret@127.0.0.1:1/x",
                                 "nosuchdriver://x"])
def test_a_database_url_that_cannot_work_is_one_line(url: str) -> None:
  for argv in (["db", "version", "--db", url], ["report", "--db", url]):
    run = subprocess.run([sys.executable, "-m", "tinytune.cli", *argv], capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode == 2 and one_line(run.stderr, "error") and "secret" not in run.stderr, (argv, run.stderr[-600:])
  code = textwrap.dedent("""
    import tinytune
    from tinytune import Tensor
    try: tinytune.tune(Tensor.rand(8, 8) @ Tensor.rand(8, 8), budget=1, quiet=True)
    except Exception as e: print(type(e).__name__, str(e))
  """)
  run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, "TINYTUNE_DB": url})
  assert run.returncode == 0 and len(run.stdout.strip().splitlines()) == 1 and "Traceback" not in run.stderr, (run.stdout, run.stderr[-600:])
  assert "secret" not in run.stdout and "sqlalche.me" not in run.stdout, run.stdout


def test_a_locked_database_is_waited_for_then_one_line(tmp_path: Path) -> None:
  """Another process holds the file in an exclusive transaction: tinytune says it waits, gives up after TINYTUNE_DB_TIMEOUT."""
  path = tmp_path / "r.db"
  Database(f"sqlite:///{path}").close()
  holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
    import sqlite3, sys, time
    conn = sqlite3.connect({str(path)!r}, isolation_level=None)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    time.sleep(60)
  """)], stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    for argv in (["db", "version"], ["report"]):
      run = subprocess.run([sys.executable, "-m", "tinytune.cli", *argv, "--db", str(path)], capture_output=True, text=True, timeout=TIMEOUT,
                           env={**os.environ, "TINYTUNE_DB_TIMEOUT": "1"})
      lines = run.stderr.strip().splitlines()
      assert run.returncode == 2 and len(lines) == 2 and "Traceback" not in run.stderr, (argv, run.stderr[-600:])
      assert lines[0] == f"tinytune: waiting for the lock on {path} held by another process" and lines[1].startswith("tinytune: error:"), lines
      assert "locked" in lines[1] and len(lines[1]) <= 200, lines
  finally:
    holder.kill()
    holder.wait()


# ***** what cache export, merge and prune write over *****
def _device(p: Path) -> None: os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own


OUTPUTS: dict[str, Callable[[Path], None]] = {
  "character device": _device, "FIFO": lambda p: os.mkfifo(p), "folder": lambda p: p.mkdir(),
  "symlink": lambda p: p.symlink_to(p.with_name("target.ttc")), "dangling symlink": lambda p: p.symlink_to(p.with_name("nowhere")),
  "read-only file": lambda p: (cache_file(p), os.chmod(p, 0o444)),
}


@pytest.mark.parametrize("name", list(OUTPUTS))
def test_an_output_that_is_not_ours_to_replace_is_refused(tmp_path: Path, good: Path, name: str) -> None:
  """merge --out and prune of a path that is a device, FIFO, folder, link or read-only file: one line, exit 2, the path as it was."""
  if name == "character device" and os.geteuid() != 0: pytest.skip("mknod of a device needs root")
  (target := tmp_path / "target.ttc").write_bytes(b"the link's target")
  out = tmp_path / "out.ttc"
  OUTPUTS[name](out)
  before = os.lstat(out)
  code = textwrap.dedent(f"""
    from tinytune.cli import main
    print(main(["cache", "merge", {str(good)!r}, {str(good)!r}, "--out", {str(out)!r}]), flush=True)
    print(main(["cache", "prune", {str(out)!r}]), flush=True)
  """)
  run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
  assert run.stdout.split() == ["2", "2"] and "Traceback" not in run.stderr, (run.stdout, run.stderr[-600:])
  assert all(one_line(line, "error") for line in run.stderr.strip().splitlines()), run.stderr
  after = os.lstat(out)
  assert (after.st_mode, after.st_ino, after.st_size) == (before.st_mode, before.st_ino, before.st_size)
  assert target.read_bytes() == b"the link's target" and sorted(p.name for p in tmp_path.iterdir()) == ["out.ttc", "target.ttc"]


def test_a_rewritten_file_keeps_its_mode(tmp_path: Path, good: Path) -> None:
  from tinytune.cli import main
  out = tmp_path / "out.ttc"
  assert main(["cache", "merge", str(good), str(good), "--out", str(out)]) == 0
  os.chmod(out, 0o600)
  assert main(["cache", "prune", str(out)]) == 0 and main(["cache", "merge", str(good), str(good), "--out", str(out)]) == 0
  assert stat.S_IMODE(os.stat(out).st_mode) == 0o600


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv to drop the override of file modes")
def test_an_unwritable_cache_folder_is_one_warning(tmp_path: Path) -> None:
  """TINYTUNE_CACHE_DIR naming a folder that is there but read-only: a program warns once and compiles into a temporary folder
  (it was a PermissionError traceback)."""
  (folder := tmp_path / "cache").mkdir()
  os.chmod(folder, 0o555)
  caps = "-dac_override,-dac_read_search"  # root that obeys file modes, as an unprivileged user would
  code = "import numpy as np\nfrom tinytune import Tensor\nassert np.allclose((Tensor([1.0, 2.0]) * 7).numpy(), [7, 14])"
  try:
    run = subprocess.run(["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=TIMEOUT, env={**os.environ, "TINYTUNE_CACHE_DIR": str(folder), "TINYTUNE_DB": str(tmp_path / "none.db")})
  finally: os.chmod(folder, 0o755)
  assert run.returncode == 0 and one_line(run.stderr, "warning") and "cannot be written" in run.stderr, run.stderr[-600:]
  assert list(folder.iterdir()) == []
