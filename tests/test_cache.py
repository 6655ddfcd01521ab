"""Tuning cache files: export, merge, import, prune, and the lookup a deployment does through TINYTUNE_CACHE. A file that is
truncated, corrupt, foreign, from a newer format or hostile costs one warning line and the default opts, never a crash."""
from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest

from tinytune import Device, Kernel, Opt, OptOps, Tensor, engine
from tinytune.results_db import Database, fingerprint_hash
from tinytune.results_db.cache import FORMAT_VERSION, CacheFile, CacheFileError, Entry, checksum, deployed, export, import_file, merge, prune, write
from tinytune.runtime import device_fingerprint

FP = {"kind": "CPU", "name": "Test CPU", "arch": "x86_64-abc", "compiler": "clang", "compiler_version": "18.1", "flags": "-O3",
      "codegen_version": "1"}
OTHER = {**FP, "name": "Other CPU"}


def database(path: Path, entries: list[tuple[str, dict, float]]) -> Database:
  """A results database whose tuning cache holds (kernel key, fingerprint, best seconds)."""
  db = Database(f"sqlite:///{path}")
  for key, fp, best_s in entries:
    db.device_id(fp)
    db.set_tuned(key, fingerprint_hash(fp), f'[["UPCAST",0,{int(best_s * 1000)}]]', best_s, 10.0, None, workload="matmul", params='{"m":64}')
  return db


def test_export_writes_entries_and_a_manifest(tmp_path: Path) -> None:
  db = database(tmp_path / "a.db", [("k1", FP, 2.0), ("k2", FP, 3.0), ("k1", OTHER, 4.0)])
  cache = export(db, tmp_path / "all.ttc")
  m = cache.manifest
  assert (m["format_version"], m["entries"]) == (str(FORMAT_VERSION), "3")
  assert json.loads(m["devices"]) == sorted([fingerprint_hash(FP), fingerprint_hash(OTHER)])
  assert m["tinytune_version"] and m["created_at"] and len(m["checksum"]) == 64
  assert [(e.kernel_key, e.best_s, e.default_s, e.workload) for e in cache.entries if e.device_hash == fingerprint_hash(FP)] == \
    [("k1", 2.0, 10.0, "matmul"), ("k2", 3.0, 10.0, "matmul")]
  assert cache.devices[fingerprint_hash(OTHER)] == OTHER
  mine = export(db, tmp_path / "mine.ttc", device_hash=fingerprint_hash(OTHER))
  assert [e.kernel_key for e in mine.entries] == ["k1"] and list(mine.devices) == [fingerprint_hash(OTHER)]
  assert export(db, tmp_path / "none.ttc", workload="conv2d").entries == []


def test_two_exports_merged_give_the_best_of_both(tmp_path: Path) -> None:
  a = database(tmp_path / "a.db", [("k1", FP, 2.0), ("k2", FP, 3.0), ("k3", OTHER, 1.0)])
  b = database(tmp_path / "b.db", [("k1", FP, 1.5), ("k2", FP, 3.5), ("k4", FP, 7.0)])
  merged = merge([export(a, tmp_path / "a.ttc").path, export(b, tmp_path / "b.ttc").path], tmp_path / "m.ttc")
  both = Database(f"sqlite:///{tmp_path / 'both.db'}")  # one database that saw both searches keeps the faster entry each time
  for f in ("a.ttc", "b.ttc"): import_file(both, tmp_path / f)
  one = export(both, tmp_path / "one.ttc", device_hash=None)
  key = lambda e: (e.kernel_key, e.device_hash, e.opts, e.best_s)  # noqa: E731
  assert sorted(map(key, merged.entries)) == sorted(map(key, one.entries))
  assert {(e.kernel_key, e.best_s) for e in merged.entries} == {("k1", 1.5), ("k2", 3.0), ("k3", 1.0), ("k4", 7.0)}
  assert import_file(both, tmp_path / "a.ttc") == (0, 3)  # nothing in a is faster than what both holds
  assert import_file(both, tmp_path / "a.ttc", force=True) == (3, 0)


def test_prune_drops_other_codegen_versions_and_old_entries(tmp_path: Path) -> None:
  from datetime import datetime, timezone
  db = database(tmp_path / "a.db", [("k1", FP, 2.0), ("k2", {**FP, "codegen_version": "0"}, 3.0)])
  cache, dropped = prune(export(db, tmp_path / "c.ttc", device_hash=None), tmp_path / "c.ttc", "1", None)
  assert dropped == 1 and [e.kernel_key for e in cache.entries] == ["k1"] and CacheFile.open(tmp_path / "c.ttc").entries == cache.entries
  assert prune(cache, tmp_path / "c.ttc", None, datetime(2999, 1, 1, tzinfo=timezone.utc))[1] == 1
  assert db.prune_tuned("1") == 1 and [t.kernel_key for t in db.tuned_entries()] == ["k1"]


# ***** bad files *****
def _truncate(p: Path) -> None: p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2])
def _corrupt(p: Path) -> None: data = bytearray(p.read_bytes()); data[100:4000] = os.urandom(3900); p.write_bytes(bytes(data))
def _not_sqlite(p: Path) -> None: p.write_bytes(b"\x80\x04\x95cos\nsystem\n" * 50)  # a pickle is only ever bytes to us
def _empty(p: Path) -> None: p.write_bytes(b"")
def _missing(p: Path) -> None: p.unlink()
def _sql(statement: str) -> Callable[[Path], None]:
  def edit(p: Path) -> None:
    with sqlite3.connect(p) as conn: conn.execute(statement)
    conn.close()
  return edit


@pytest.mark.parametrize("damage, why", [
  (_truncate, "not a readable tinytune cache file|checksum"), (_corrupt, "not a readable|checksum|bad"), (_not_sqlite, "not a readable"),
  (_empty, "not a readable"), (_missing, "not a readable"),
  (_sql("UPDATE manifest SET value = '99' WHERE key = 'format_version'"), "cache format 99 is newer"),
  (_sql("UPDATE entries SET opts = '[[\"UPCAST\",0,7]]'"), "checksum mismatch"),
  (_sql("UPDATE entries SET best_s = 1e-9"), "checksum mismatch"),
  (_sql("DELETE FROM manifest WHERE key = 'magic'"), "not a tinytune cache file"),
])
def test_bad_file_is_one_warning(tmp_path: Path, damage: Callable[[Path], None], why: str) -> None:
  path = tmp_path / "c.ttc"
  export(database(tmp_path / "a.db", [("k1", FP, 2.0)]), path)
  damage(path)
  with pytest.raises(CacheFileError, match=why): CacheFile.open(path)
  warnings: list[str] = []
  assert deployed(str(path), fingerprint_hash(FP), warnings.append) == {} and len(warnings) == 1 and str(path) in warnings[0]


def test_hostile_values_are_refused_even_with_a_good_checksum(tmp_path: Path) -> None:
  path, h = tmp_path / "c.ttc", fingerprint_hash(FP)
  good = Entry("k1", h, "r", "matmul", "{}", "[]", 1.0, 2.0, "2026-01-01T00:00:00+00:00")
  for bad in (replace(good, best_s=float("inf")), replace(good, best_s=-1.0), replace(good, default_s=0.0), replace(good, device_hash="0" * 64)):
    with pytest.raises(CacheFileError, match="bad timing|does not match its fingerprint"):
      write(path, [bad], {h: FP}) if bad.device_hash == h else _write_raw(path, bad)
      CacheFile.open(path)


def _write_raw(path: Path, entry: Entry) -> None:
  """A file whose device hash does not match its fingerprint, with a checksum that does match."""
  write(path, [replace(entry, device_hash=fingerprint_hash(FP))], {fingerprint_hash(FP): FP})
  with sqlite3.connect(path) as conn:
    conn.execute("UPDATE entries SET device_hash = ?", (entry.device_hash,))
    conn.execute("UPDATE devices SET hash = ?", (entry.device_hash,))
    rows = conn.execute("SELECT * FROM entries").fetchall()
    conn.execute("UPDATE manifest SET value = ? WHERE key = 'checksum'", (checksum(conn.execute("SELECT * FROM devices").fetchall(), rows),))
  conn.close()


def test_foreign_file_is_one_warning_and_the_fastest_entry_wins(tmp_path: Path) -> None:
  a = export(database(tmp_path / "a.db", [("k1", FP, 2.0), ("k2", FP, 1.0)]), tmp_path / "a.ttc")
  b = export(database(tmp_path / "b.db", [("k1", FP, 1.0), ("k2", FP, 5.0)]), tmp_path / "b.ttc")
  foreign = export(database(tmp_path / "c.db", [("k1", OTHER, 0.1)]), tmp_path / "c.ttc")
  warnings: list[str] = []
  found = deployed(os.pathsep.join([a.path, foreign.path, b.path]), fingerprint_hash(FP), warnings.append)
  assert {k: (p, e.best_s) for k, (p, e) in found.items()} == {"k1": (b.path, 1.0), "k2": (a.path, 1.0)}
  assert len(warnings) == 1 and "no entries for this device" in warnings[0] and foreign.path in warnings[0]


# ***** a deployed program *****
PROGRAM = """
import numpy as np
from tinytune import Tensor, Context
a, b = Tensor.rand(32, 32), Tensor.rand(32, 32)
with Context(DEBUG=3): c = (a @ b).numpy()
assert np.allclose(c, a.numpy() @ b.numpy(), atol=1e-4)
"""


def deployed_env(tmp_path: Path, cache: str) -> dict[str, str]:
  return {**os.environ, "TINYTUNE_DB": f"sqlite:///{tmp_path / 'no-such.db'}", "TINYTUNE_CACHE": cache}


def deployed_run(tmp_path: Path, cache: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=deployed_env(tmp_path, cache), timeout=120)


def matmul32() -> Kernel:
  a, b = Tensor.rand(32, 32).realize(), Tensor.rand(32, 32).realize()
  return engine.kernels((a @ b).uop, Device.DEFAULT)[0][1]


def cache_file(path: Path, opts: str, fp: dict | None = None) -> str:
  fp = fp or device_fingerprint(Device.DEFAULT)
  entry = Entry(matmul32().key, fingerprint_hash(fp), "r_32_32_32", "matmul", '{"m":32,"n":32,"k":32}', opts, 1e-6, 2e-6, "2026-01-01T00:00:00+00:00")
  try: write(path, [entry], {fingerprint_hash(fp): fp})
  except CacheFileError: pass  # written, and refused when read back: what a test of hostile opts wants
  return str(path)


def test_deployment_uses_a_read_only_cache_file(tmp_path: Path) -> None:
  folder = tmp_path / "ro"
  folder.mkdir()
  path = cache_file(folder / "tuned.ttc", '[["UPCAST",1,4],["UPCAST",0,2]]')
  before = path and Path(path).read_bytes()
  os.chmod(path, stat.S_IRUSR); os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR)
  try: run = deployed_run(tmp_path, path)
  finally: os.chmod(folder, stat.S_IRWXU)
  assert run.returncode == 0 and run.stderr == "", run.stderr
  assert "opts [Opt(UPCAST, 1, 4), Opt(UPCAST, 0, 2)]" in run.stdout
  assert sorted(os.listdir(folder)) == ["tuned.ttc"] and Path(path).read_bytes() == before  # no journal, no -wal, nothing written


@pytest.mark.parametrize("opts", ['[["UPCAST",0,7]]', '[["EXEC","import os",1]]', '{"__reduce__": ["os.system", ["touch pwned"]]}', '"not a list"',
                                  '[["UPCAST",0,99999999999999999999]]', '[["SWAP",5,-1]]', "not json"])
def test_hostile_opts_cost_one_warning_and_the_defaults(tmp_path: Path, opts: str) -> None:
  run = deployed_run(tmp_path, cache_file(tmp_path / "evil.ttc", opts))
  assert run.returncode == 0, run.stderr
  lines = run.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("tinytune: warning:") and "ignoring" in lines[0], run.stderr  # the entry, or the whole file
  assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_corrupt_and_foreign_files_cost_one_warning_each(tmp_path: Path) -> None:
  corrupt = tmp_path / "corrupt.ttc"
  corrupt.write_bytes(b"SQLite format 3\x00" + os.urandom(3000))
  foreign = cache_file(tmp_path / "foreign.ttc", "[]", {**device_fingerprint(Device.DEFAULT), "name": "a machine far away"})
  run = deployed_run(tmp_path, os.pathsep.join([str(corrupt), foreign]))
  assert run.returncode == 0, run.stderr
  lines = run.stderr.strip().splitlines()
  assert len(lines) == 2 and "corrupt.ttc" in lines[0] and "foreign.ttc" in lines[1] and "no entries for this device" in lines[1], run.stderr


def test_cache_commands(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
  from tinytune.cli import main
  from tinytune.kernels import get_workload
  from tinytune.search.tune import Tuner
  url, path = f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path / "c.ttc")
  workload = get_workload("matmul")
  params = workload.params({"m": 32, "n": 32, "k": 32})
  Tuner(Database(url), Device.DEFAULT, "beam", {"candidates": 4, "seconds": None}).tune_program(workload.instantiate(params)[0].uop, "matmul", params)
  assert main(["cache", "export", "--db", url, "--out", path]) == 0 and "1 entries for 1 device" in capsys.readouterr().out
  main(["cache", "verify", path, "--run"])
  out = capsys.readouterr().out
  assert "checksum ok" in out and "1 for this device" in out and "r_32_32_32 matmul" in out and "the default" in out and "FAILED" not in out
  assert main(["cache", "list", path]) == 0 and "r_32_32_32" in capsys.readouterr().out
  assert main(["cache", "merge", path, path, "--out", str(tmp_path / "m.ttc")]) == 0
  assert main(["cache", "import", str(tmp_path / "m.ttc"), "--db", f"sqlite:///{tmp_path / 'other.db'}"]) == 0
  assert "imported 1 entries" in capsys.readouterr().out
  assert main(["cache", "list", "--db", f"sqlite:///{tmp_path / 'other.db'}"]) == 0 and "r_32_32_32" in capsys.readouterr().out
  assert main(["cache", "prune", path, "--before", "2000-01-01"]) == 0 and "dropped 0 entries, kept 1" in capsys.readouterr().out
  Path(path).write_bytes(b"garbage")
  assert main(["cache", "verify", path]) == 2
  err = capsys.readouterr().err
  assert err.startswith("tinytune: error:") and len(err.strip().splitlines()) == 1


def test_own_database_comes_first_and_an_old_one_costs_one_warning(tmp_path: Path) -> None:
  import shutil
  kernel, device_hash = matmul32(), fingerprint_hash(device_fingerprint(Device.DEFAULT))
  path = cache_file(tmp_path / "tuned.ttc", '[["UPCAST",1,4],["UPCAST",0,2]]')
  own = Database(f"sqlite:///{tmp_path / 'own.db'}")
  own.set_tuned(kernel.key, device_hash, '[["UPCAST",1,2]]', 1e-3, 2e-3, None)
  env = {**os.environ, "TINYTUNE_DB": f"sqlite:///{tmp_path / 'own.db'}", "TINYTUNE_CACHE": path}
  run = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=120)
  assert run.returncode == 0 and run.stderr == "" and "opts [Opt(UPCAST, 1, 2)]" in run.stdout, run.stderr
  shutil.copy(Path(__file__).parent / "data" / "schema1.db", tmp_path / "old.db")  # an old schema: refused, and the file is used
  env["TINYTUNE_DB"] = f"sqlite:///{tmp_path / 'old.db'}"
  run = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=120)
  assert run.returncode == 0 and "opts [Opt(UPCAST, 1, 4), Opt(UPCAST, 0, 2)]" in run.stdout, run.stderr
  assert len(run.stderr.strip().splitlines()) == 1 and "tinytune db upgrade" in run.stderr


def hostile_files(tmp_path: Path, flips: int) -> list[Path]:
  """Broken cache files of every kind: edited manifest values, deep JSON, a BLOB, a 10 MB opts string, not-a-file kinds, and byte flips."""
  good = Path(cache_file(tmp_path / "good.ttc", '[["UPCAST",1,4]]'))
  made = []
  def variant(name: str, sql: str, *args: object) -> None:
    path = tmp_path / name
    shutil.copy(good, path)
    with sqlite3.connect(path) as conn: conn.execute(sql, args)
    conn.close()
    made.append(path)
  variant("superscript.ttc", "UPDATE manifest SET value = ? WHERE key = 'format_version'", "²")
  variant("deep.ttc", "UPDATE devices SET fingerprint = ?", "[" * 100_000 + "]" * 100_000)
  variant("blob.ttc", "UPDATE entries SET opts = ?", b"\x00\x01binary")
  variant("huge.ttc", "UPDATE entries SET opts = ?", "x" * 10_000_000)
  variant("text-time.ttc", "UPDATE entries SET best_s = 'fast'")
  (empty := tmp_path / "empty.ttc").write_bytes(b"")
  (truncated := tmp_path / "truncated.ttc").write_bytes(good.read_bytes()[:1500])
  (folder := tmp_path / "folder.ttc").mkdir()
  os.mkfifo(fifo := tmp_path / "fifo.ttc")
  made += [empty, truncated, folder, fifo, tmp_path / "missing.ttc"]
  rng = random.Random(0)
  data = good.read_bytes()
  for i in range(flips):
    flipped = bytearray(data)
    for _ in range(rng.randint(1, 8)): flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
    (path := tmp_path / f"flip{i}.ttc").write_bytes(bytes(flipped))
    made.append(path)
  return made


def test_hostile_cache_files_cost_at_most_one_short_warning(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
  from tinytune.results_db.cache import TuningCache, deployed
  kernel = matmul32()
  for path in hostile_files(tmp_path, 200):
    deployed.cache_clear()
    os.environ["TINYTUNE_CACHE"] = str(path)
    try: tuned = TuningCache().lookup(kernel, Device.DEFAULT)
    finally: del os.environ["TINYTUNE_CACHE"]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) <= 1 and all(len(line) <= 200 for line in lines), (path.name, lines)
    assert tuned is None or tuned.opts in ((Opt(OptOps.UPCAST, 1, 4),),), path.name  # a flip the checksum misses can only be harmless


def test_a_hostile_file_in_a_program_costs_a_warning_not_a_hang(tmp_path: Path) -> None:
  files = {p.name: p for p in hostile_files(tmp_path, 0)}
  procs = {name: subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=deployed_env(tmp_path, str(files[name])))
           for name in ("fifo.ttc", "deep.ttc", "superscript.ttc", "blob.ttc", "huge.ttc")}  # side by side: each is mostly a Python start
  try:
    for name, proc in procs.items():
      err = proc.communicate(timeout=120)[1]
      assert proc.returncode == 0 and "Traceback" not in err, (name, err[-400:])
      assert len(err.strip().splitlines()) == 1 and len(err.strip()) <= 200, (name, err[:400])
  finally:
    for proc in procs.values(): proc.kill(); proc.wait()


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv to drop the override of file modes")
def test_a_read_only_database_in_a_read_only_folder(tmp_path: Path) -> None:
  kernel, device_hash = matmul32(), fingerprint_hash(device_fingerprint(Device.DEFAULT))
  folder = tmp_path / "image"
  folder.mkdir()
  own = Database(f"sqlite:///{folder / 'own.db'}")
  own.set_tuned(kernel.key, device_hash, '[["UPCAST",1,2]]', 1e-3, 2e-3, None)
  own.close()
  before = sorted(os.listdir(folder))
  for p in folder.iterdir(): os.chmod(p, stat.S_IRUSR)
  os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR)
  env = {**os.environ, "TINYTUNE_DB": str(folder / "own.db"), "TINYTUNE_CACHE": ""}
  def as_plain_user(*argv: str) -> subprocess.CompletedProcess:  # root that obeys file modes, as an unprivileged user would
    caps = "-dac_override,-dac_read_search"
    return subprocess.run(["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", sys.executable, *argv], capture_output=True, text=True,
                          env=env, timeout=120)
  try:
    run = as_plain_user("-c", PROGRAM)
    assert run.returncode == 0 and run.stderr == "" and "opts [Opt(UPCAST, 1, 2)]" in run.stdout, run.stderr
    for argv in (["report", "--table", "best"], ["cache", "list"], ["db", "version"]):
      run = as_plain_user("-m", "tinytune.cli", *argv, "--db", str(folder / "own.db"))
      assert run.returncode == 0 and "Traceback" not in run.stderr, (argv, run.stderr)
  finally: os.chmod(folder, stat.S_IRWXU)
  assert sorted(os.listdir(folder)) == before  # nothing written beside it


def test_a_cache_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
  """TINYTUNE_CACHE_DIR naming a file (or a folder under one): every command says so in one line and exits non-zero, and a
  program's first kernel raises an error that says which variable to change (each was a FileExistsError traceback)."""
  (blocker := tmp_path / "file").write_text("")
  env = {**os.environ, "TINYTUNE_CACHE_DIR": str(blocker / "cache")}
  env.pop("TINYTUNE_DB", None)
  argvs = (["cache", "list"], ["db", "upgrade"], ["search", "matmul", "-p", "m=8", "-p", "n=8", "-p", "k=8", "--budget", "1"])
  procs = [subprocess.Popen([sys.executable, "-m", "tinytune.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
           for args in argvs]
  for args, proc in zip(argvs, procs):
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1 and "TINYTUNE_CACHE_DIR" in err, (args, err)
  code = "from tinytune import Tensor\ntry: (Tensor([1.0, 2.0]) * 3).numpy()\nexcept RuntimeError as e: print(e)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, "TINYTUNE_DEVICE": "CPU"},
                       timeout=120)  # the CPU's shared objects go there (EMU builds nothing on disk: its kernel runs, with a warning)
  assert out.returncode == 0 and f"{blocker / 'cache'} cannot be made" in out.stdout and "TINYTUNE_CACHE_DIR" in out.stdout, out
