"""The hostile-input suite: cache files, results databases, output paths, environments and database URLs that a hostile or unlucky
user points tinytune at. Each input runs in a process of its own under a timeout and must give the right result with at most one
warning line of at most 200 characters (or, for a command it makes fail, one error line and a non-zero exit): no traceback, no hang.

The inputs run in children forked from one runner process that has imported tinytune, pandas and SQLAlchemy once, so a hundred
of them cost seconds, not minutes; a child that runs past its timeout is killed and its input fails as a hang."""
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

TIMEOUT = 15  # seconds per input: each finishes in well under one when handled; a hang is cut here and fails its test
GOOD_OPTS = '[["UPCAST",1,4]]'
NEVER_ENDS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT t.* FROM {0}, c WHERE c.x < 0"
PROGRAM = """
import numpy as np
from tinytune import Tensor
a, b = Tensor.rand(32, 32), Tensor.rand(32, 32)
assert np.allclose((a @ b).numpy(), a.numpy() @ b.numpy(), atol=1e-4), "wrong result"
"""

# Reads a JSON list of inputs, {"id", "env", "timeout", "steps": [[name, "cli", argv] or [name, "code", python]]}, from the file
# its argument names. Each input runs in a forked child, which sets the environment and runs the steps in order, each as a fresh
# process would (no warnings shown yet), writing [name, exit code or "traceback", stderr] per step; the runner prints {"id",
# "steps", "hung"} per input.
RUNNER = textwrap.dedent("""
  import contextlib, io, json, os, select, signal, sys, time, traceback
  import numpy, pandas, rich.console, rich.table, sqlalchemy, tinytune, tinytune.cli, tinytune.kernels, tinytune.reports, tinytune.results_db.cache
  # (what every child needs, imported once)
  from tinytune import helpers
  def run_step(kind, what):
    if kind == "cli": return tinytune.cli.main(what)
    exec(compile(what, "<input>", "exec"), {})
    return 0
  def child(case, w):
    os.environ.update(case["env"])
    for name, kind, what in case["steps"]:
      helpers._warned.clear()
      err = io.StringIO()
      try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as out: rc = run_step(kind, what)
      except SystemExit as e: rc = e.code
      except BaseException: rc, err = "traceback", io.StringIO(traceback.format_exc())
      os.write(w, (json.dumps([name, rc, err.getvalue()[-2000:]]) + "\\n").encode())
  for case in json.load(open(sys.argv[1])):
    r, w = os.pipe()
    if (pid := os.fork()) == 0:
      os.close(r)
      try: child(case, w)
      finally: os._exit(0)
    os.close(w)
    data, deadline, hung = b"", time.monotonic() + case["timeout"], False
    while True:
      if not select.select([r], [], [], max(0.0, deadline - time.monotonic()))[0]:
        hung = True
        os.kill(pid, signal.SIGKILL)
        break
      if not (chunk := os.read(r, 1 << 16)): break
      data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    print(json.dumps({"id": case["id"], "steps": [json.loads(line) for line in data.decode().splitlines()], "hung": hung}), flush=True)
""")


def run_inputs(cases: list[dict[str, Any]], folder: Path, env: dict[str, str] | None = None, runners: int = 2) -> dict[str, dict[str, Any]]:
  """id -> {"steps": {name: (rc, stderr)}, "hung": bool} for each input, run by `runners` RUNNERs side by side (one per core)."""
  procs = []
  for i in range(runners):
    (inputs := folder / f"inputs{i}.json").write_text(json.dumps([{"timeout": TIMEOUT, **c} for c in cases[i::runners]]))
    procs.append(subprocess.Popen([sys.executable, "-c", RUNNER, str(inputs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, **(env or {})}))
  results = {}
  for proc in procs:
    out, err = proc.communicate(timeout=TIMEOUT * len(cases) + 60)
    assert proc.returncode == 0, err[-2000:]
    results.update({r["id"]: {"steps": {name: (rc, e) for name, rc, e in r["steps"]}, "hung": r["hung"]} for r in map(json.loads, out.splitlines())})
  return results


def one_line(err: str, kind: str) -> bool:
  lines = err.strip().splitlines()
  return len(lines) == 1 and lines[0].startswith(f"tinytune: {kind}:") and len(lines[0]) <= 200


def matmul32_key() -> str:
  from tinytune import Device, Tensor, engine
  a, b = Tensor.rand(32, 32).realize(), Tensor.rand(32, 32).realize()
  return engine.kernels((a @ b).uop, Device.DEFAULT)[0][1].key


def cache_file(path: Path, opts: Any = GOOD_OPTS, key: Any = None, best_s: Any = 1e-6) -> Path:
  """A cache file with one entry for the 32x32 matmul on the default device here, its checksum matching whatever the entry holds."""
  from tinytune import Device
  fp = device_fingerprint(Device.DEFAULT)
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


def bad_row_database(path: Path, table: str, columns: dict[str, Any]) -> Path:
  """A results database with a row of each kind, then one row edited to hold `columns`."""
  db = Database(f"sqlite:///{path}")
  fp = device_fingerprint("CPU")
  device = db.device_id(fp)
  kernel = db.kernel_id("good", "r_32_32_32", "ast", [32, 32, 32], ["float32"], 65536, 12288)
  run = db.start_run("matmul", {"m": 32}, device, "beam", {}, {"candidates": 1}, "sig", "float32")
  db.record_candidate(run, kernel, device, GOOD_OPTS, "h", 0.1, "ok", 1e-3, 1e-3, 0.0)
  db.add_baseline(device, "matmul", {"m": 32, "n": 32, "k": 32}, "numpy", "2", 1e-3, 1e-3)
  for key in ("good", "bad"): db.set_tuned(key, fingerprint_hash(fp), GOOD_OPTS, 1e-3, 2e-3, run, workload="matmul", params='{"m":32}')
  db.close()
  with sqlite3.connect(path) as conn:
    conn.execute(f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in columns)}" + (" WHERE kernel_key = 'bad'" if table == "tuned" else ""),
                 list(columns.values()))
  conn.close()
  return path


FOREIGN_DATABASES = {  # what tinytune never puts in a results database
  "view": "CREATE VIEW v AS " + NEVER_ENDS.format("tuned"),
  "trigger": "CREATE TRIGGER t AFTER INSERT ON runs BEGIN SELECT 1; END",
  "tuned view, recursive": "ALTER TABLE tuned RENAME TO t2; CREATE VIEW tuned AS " + NEVER_ENDS.format("t2"),
}
ENVIRONMENTS = [("DEBUG", "abc"), ("DEBUG", "1.5"), ("NOOPT", "abc"), ("WINO", "abc"), ("BEAM", "x"), ("TINYTUNE_BUDGET", "-1"),
                ("TINYTUNE_POOL_BYTES", "lots"), ("TINYTUNE_DB_TIMEOUT", "soon"), ("TINYTUNE_OPENCL_DEVICE", "first")]
URLS = ["mysql://u:p@localhost/x", "sqlite://user:pw@/tmp/x.db", "postgresql+psycopg://u:secret@127.0.0.1:1/x", "nosuchdriver://x"]
TUNE = """
import tinytune
from tinytune import Tensor
try: tinytune.tune(Tensor.rand(8, 8) @ Tensor.rand(8, 8), budget=1, quiet=True)
except Exception as e:
  import sys
  lines = str(e).splitlines()
  assert len(lines) == 1 and "secret" not in lines[0] and "sqlalche.me" not in lines[0], lines
  print(f"tinytune: error: {lines[0]}", file=sys.stderr)
  raise SystemExit(2)
"""


def _device(p: Path) -> None: os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own


OUTPUTS: dict[str, Callable[[Path], Any]] = {
  "FIFO": lambda p: os.mkfifo(p), "folder": lambda p: p.mkdir(),
  "symlink": lambda p: p.symlink_to(p.with_name("target.ttc")), "dangling symlink": lambda p: p.symlink_to(p.with_name("nowhere")),
  "read-only file": lambda p: (cache_file(p), os.chmod(p, 0o444)),
  **({"character device": _device} if os.geteuid() == 0 else {}),  # mknod of a device needs root
}


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
  """Every input made, run, and its results by id; plus what the tests compare against."""
  root = tmp_path_factory.mktemp("hostile")
  good = cache_file(root / "good.ttc")
  cases: list[dict[str, Any]] = [{"id": "control", "env": {"TINYTUNE_CACHE": str(good)}, "steps": file_steps(good, good, root / "control")}]
  for i, (name, make) in enumerate(HOSTILE_FILES.items()):
    (folder := root / f"file{i}").mkdir()
    hostile = make(folder / "hostile.ttc")
    cases.append({"id": f"file:{name}", "env": {"TINYTUNE_CACHE": str(hostile)}, "steps": file_steps(hostile, good, folder)})
  for i, (name, (table, columns)) in enumerate(BAD_ROWS.items()):
    (folder := root / f"row{i}").mkdir()
    db = str(bad_row_database(folder / "r.db", table, columns))
    cases.append({"id": f"row:{name}", "env": {}, "steps": [
      ("report", "cli", ["report", "--db", db]), ("cache list", "cli", ["cache", "list", "--db", db]),
      ("cache export", "cli", ["cache", "export", "--all", "--db", db, "--out", f"{folder}/o.ttc"])]})
  for i, (name, sql) in enumerate(FOREIGN_DATABASES.items()):
    Database(f"sqlite:///{(db := root / f'foreign{i}.db')}").close()
    with sqlite3.connect(db) as conn: conn.executescript(sql)
    conn.close()
    cases.append({"id": f"foreign:{name}", "env": {"TINYTUNE_DB": str(db)}, "steps": [
      *[(" ".join(argv), "cli", [*argv, "--db", str(db)]) for argv in (["report"], ["cache", "list"], ["db", "version"])],
      ("program", "code", PROGRAM)]})
  os.mkfifo(fifo := root / "fifo.db")
  cases.append({"id": "fifo database", "env": {}, "steps": [(" ".join(argv), "cli", [*argv, "--db", str(fifo)])
                                                            for argv in (["report"], ["db", "version"], ["cache", "list"])]})
  cases += [{"id": f"env:{var}={value}", "env": {var: value}, "steps": [("kernels", "cli", ["kernels"])]} for var, value in ENVIRONMENTS]
  cases += [{"id": f"url:{url}", "env": {"TINYTUNE_DB": url}, "steps": [("db version", "cli", ["db", "version", "--db", url]),
                                                                        ("report", "cli", ["report", "--db", url]), ("tune()", "code", TUNE)]}
            for url in URLS]
  for i, (name, make) in enumerate(OUTPUTS.items()):
    (folder := root / f"out{i}").mkdir()
    (folder / "target.ttc").write_bytes(b"the link's target")
    make(out := folder / "out.ttc")
    cases.append({"id": f"out:{name}", "env": {}, "lstat": os.lstat(out), "steps": [
      ("cache merge", "cli", ["cache", "merge", str(good), str(good), "--out", str(out)]), ("cache prune", "cli", ["cache", "prune", str(out)])]})
  mode = root / "mode.ttc"
  cases.append({"id": "mode", "env": {}, "steps": [("cache merge", "cli", ["cache", "merge", str(good), str(good), "--out", str(mode)]),
                                                   ("chmod", "code", f"import os; os.chmod({str(mode)!r}, 0o600)"),
                                                   ("cache prune", "cli", ["cache", "prune", str(mode)]),
                                                   ("cache merge again", "cli", ["cache", "merge", str(good), str(good), "--out", str(mode)])]})
  Database(f"sqlite:///{(locked := root / 'locked.db')}").close()
  holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
    import sqlite3, sys, time
    conn = sqlite3.connect({str(locked)!r}, isolation_level=None)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    time.sleep(120)
  """)], stdout=subprocess.PIPE, text=True)
  cases.append({"id": "locked", "env": {"TINYTUNE_DB_TIMEOUT": "1"}, "steps": [(" ".join(argv), "cli", [*argv, "--db", str(locked)])
                                                                               for argv in (["db", "version"], ["report"])]})
  try:
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    results = run_inputs([{k: v for k, v in c.items() if k != "lstat"} for c in cases], root, {"TINYTUNE_DB": f"sqlite:///{root / 'none.db'}"})
  finally:
    holder.kill()
    holder.wait()
  return {"results": results, "cases": {c["id"]: c for c in cases}, "root": root, "locked": locked, "mode": mode}


def file_steps(path: Path, good: Path, folder: Path) -> list[tuple[str, str, Any]]:
  folder.mkdir(exist_ok=True)
  db = f"sqlite:///{folder}/imported.db"
  return [("program", "code", PROGRAM), ("cache list", "cli", ["cache", "list", str(path)]), ("cache verify", "cli", ["cache", "verify", str(path)]),
          ("cache merge", "cli", ["cache", "merge", str(path), str(good), "--out", f"{folder}/merged.ttc"]),
          ("cache import", "cli", ["cache", "import", str(path), "--db", db]), ("cache list --db", "cli", ["cache", "list", "--db", db]),
          ("report", "cli", ["report", "--db", db, "--table", "best"])]


def steps(suite: dict[str, Any], case: str) -> dict[str, tuple[Any, str]]:
  result = suite["results"][case]
  assert not result["hung"], f"{case} hung after {list(result['steps'])}"
  assert all(rc != "traceback" for rc, _ in result["steps"].values()), result["steps"]
  return result["steps"]


def test_the_good_file_runs_clean(suite: dict[str, Any]) -> None:
  """The control: the same steps on an untouched file all succeed with nothing on stderr."""
  done = steps(suite, "control")
  assert len(done) == 7 and all(rc == 0 and err == "" for rc, err in done.values()), done


@pytest.mark.parametrize("name", list(HOSTILE_FILES))
def test_hostile_cache_file(suite: dict[str, Any], name: str) -> None:
  """A program runs right with one warning; the commands that read the file refuse it in one line; nothing reaches the database."""
  done = steps(suite, f"file:{name}")
  assert done["program"][0] == 0 and one_line(done["program"][1], "warning"), done["program"]
  for step in ("cache list", "cache verify", "cache merge", "cache import"):
    assert done[step][0] == 2 and one_line(done[step][1], "error"), (step, done[step])
  for step in ("cache list --db", "report"): assert done[step] == (0, ""), (step, done[step])


@pytest.mark.parametrize("name", list(BAD_ROWS))
def test_a_bad_row_in_a_database_is_skipped(suite: dict[str, Any], name: str) -> None:
  """`report`, `cache list` and `cache export` of a database holding a bad row (in the tuning cache, or any table a report
  reads) warn once at most and go on with the good rows."""
  done = steps(suite, f"row:{name}")
  assert all(rc == 0 and (err == "" or one_line(err, "warning")) for rc, err in done.values()), done
  assert any(err for _, err in done.values()), done  # the bad row was noticed


@pytest.mark.parametrize("name", list(FOREIGN_DATABASES))
def test_a_database_with_views_or_triggers_is_refused(suite: dict[str, Any], name: str) -> None:
  done = steps(suite, f"foreign:{name}")
  for step in ("report", "cache list", "db version"):
    assert done[step][0] == 2 and one_line(done[step][1], "error") and "not a tinytune" in done[step][1], (step, done[step])
  assert done["program"][0] == 0 and one_line(done["program"][1], "warning"), done["program"]


def test_a_database_that_is_a_fifo_is_one_line(suite: dict[str, Any]) -> None:
  for step, (rc, err) in steps(suite, "fifo database").items(): assert rc == 2 and one_line(err, "error") and "not a regular file" in err, (step, err)


@pytest.mark.parametrize("var, value", ENVIRONMENTS)
def test_a_bad_environment_variable_is_one_line_naming_it(suite: dict[str, Any], var: str, value: str) -> None:
  rc, err = steps(suite, f"env:{var}={value}")["kernels"]
  assert rc == 2 and one_line(err, "error") and f"{var}={value!r}" in err, err


@pytest.mark.parametrize("url", URLS)
def test_a_database_url_that_cannot_work_is_one_line(suite: dict[str, Any], url: str) -> None:
  """From the CLI and from tinytune.tune(): one line, no password, no SQLAlchemy link (a missing driver was a traceback)."""
  for step, (rc, err) in steps(suite, f"url:{url}").items():
    *warning, error = err.strip().splitlines() or [""]  # tune()'s program may warn once that the database it reads is unusable
    assert rc == 2 and one_line(error, "error") and len(warning) <= int(step == "tune()") and "secret" not in err, (step, err)
    assert all(one_line(line, "warning") for line in warning), (step, err)


def test_a_locked_database_is_waited_for_then_one_line(suite: dict[str, Any]) -> None:
  """Another process holds the file in an exclusive transaction: tinytune says it waits, gives up after TINYTUNE_DB_TIMEOUT."""
  for step, (rc, err) in steps(suite, "locked").items():
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 2, (step, err)
    assert lines[0] == f"tinytune: waiting for the lock on {suite['locked']} held by another process", lines
    assert lines[1].startswith("tinytune: error:") and "locked" in lines[1] and len(lines[1]) <= 200, lines


@pytest.mark.parametrize("name", list(OUTPUTS))
def test_an_output_that_is_not_ours_to_replace_is_refused(suite: dict[str, Any], name: str) -> None:
  """merge --out and prune of a path that is a device, FIFO, folder, link or read-only file: one line, exit 2, the path as it was."""
  done, case = steps(suite, f"out:{name}"), suite["cases"][f"out:{name}"]
  assert all(rc == 2 and one_line(err, "error") for rc, err in done.values()), done
  out, before = Path(case["steps"][1][2][2]), case["lstat"]
  after = os.lstat(out)
  assert (after.st_mode, after.st_ino, after.st_size) == (before.st_mode, before.st_ino, before.st_size)
  assert (out.parent / "target.ttc").read_bytes() == b"the link's target"
  assert sorted(p.name for p in out.parent.iterdir()) == ["out.ttc", "target.ttc"]


def test_a_rewritten_file_keeps_its_mode(suite: dict[str, Any]) -> None:
  assert all(rc == 0 for rc, _ in steps(suite, "mode").values()) and stat.S_IMODE(os.stat(suite["mode"]).st_mode) == 0o600


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
                         timeout=60, env={**os.environ, "TINYTUNE_CACHE_DIR": str(folder), "TINYTUNE_DB": str(tmp_path / "none.db"),
                                          "TINYTUNE_DEVICE": "CPU"})  # the CPU's compiler writes there (EMU builds nothing on disk)
  finally: os.chmod(folder, 0o755)
  assert run.returncode == 0 and one_line(run.stderr, "warning") and "cannot be written" in run.stderr, run.stderr[-600:]
  assert list(folder.iterdir()) == []


def test_a_query_past_its_bound_is_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
  """The backstop behind the schema check: any query on an untrusted connection stops at QUERY_SECONDS."""
  import time

  from tinytune.results_db import untrusted
  monkeypatch.setattr(untrusted, "QUERY_SECONDS", 0.2)
  conn = sqlite3.connect(":memory:", factory=untrusted.Hardened)
  start = time.monotonic()
  with pytest.raises(sqlite3.OperationalError, match="interrupted"):
    conn.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c").fetchall()
  assert time.monotonic() - start < 5 and conn.execute("PRAGMA trusted_schema").fetchone() == (0,)
