from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tomllib
from typing import Any

import pandas as pd
import pytest

from tinytune import engine, runtime
from tinytune.cli import build_parser, main
from tinytune.kernels import WORKLOADS
from tinytune.results_db import Database


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("COLUMNS", "200")  # tables fit the terminal: make it the same wherever the tests run


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
  """The exit code, stdout and stderr, less the note an emulated default device adds (TINYTUNE_DEVICE=EMU; test_emu checks it)."""
  code = main(list(argv))
  out, err = capsys.readouterr()
  return code, out, re.sub(r"tinytune: note: \w+ is an emulator: its times are its host seconds, not a GPU's speed\n", "", err)


def torch_runs_here() -> bool:
  """PyTorch is installed and runs on the default device (a CUDA build does on CUDA; none runs on OPENCL)."""
  from tinytune.kernels.baselines import torch_device
  try: torch_device(runtime.Device.DEFAULT)
  except RuntimeError: return False
  return True


def table(text: str, name: str) -> list[dict[str, Any]]:
  data = json.loads(text)
  assert data["schema_version"] == 1
  return data[name]


def test_kernels_every_format(capsys: pytest.CaptureFixture[str]) -> None:
  code, out, _ = run(capsys, "kernels", "--format", "json")
  by_name = {r["workload"]: r for r in table(out, "workloads")}
  assert code == 0 and list(by_name) == list(WORKLOADS) and by_name["matmul"]["params"]["m"] == 512 and run(capsys, "kernels", "--json")[1] == out
  assert by_name["matmul"]["gpu_params"] == {"m": 4096, "n": 4096, "k": 4096} and by_name["softmax"]["gpu_params"]["rows"] == 8192
  assert set(pd.read_csv(io.StringIO(run(capsys, "kernels", "--format", "csv")[1]))["workload"]) == set(WORKLOADS)
  assert "| conv2d |" in run(capsys, "kernels", "--format", "md")[1]
  assert "attention" in run(capsys, "kernels")[1] and "<table" in run(capsys, "kernels", "--format", "html")[1]


def test_devices_lists_present_and_missing(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setitem(runtime._BACKENDS, "NOPE", "tinytune.runtime.nope:NopeDevice")
  code, out, _ = run(capsys, "devices", "--format", "json")
  rows = {r["device"]: r for r in table(out, "devices")}
  assert code == 0 and rows["CPU"]["present"] is True and len(rows["CPU"]["fingerprint"]) == 16
  assert rows["NOPE"]["present"] is False and "nope" in rows["NOPE"]["missing"]


@pytest.mark.parametrize("fmt", ["table", "csv", "md", "json", "html"])
def test_report_every_format(capsys: pytest.CaptureFixture[str], report_db: str, tmp_path: Any, fmt: str) -> None:
  out_file = tmp_path / f"report.{fmt}"
  code, out, err = run(capsys, "report", "--db", report_db, "--format", fmt, "--out", str(out_file))
  text = out_file.read_text()
  assert code == 0 and out == "" and "wrote" in err and "r_64_64_64" in text
  if fmt == "json": assert len(json.loads(text)["best"]) == 2 and {"m": 64, "n": 64, "k": 64} in [r["params"] for r in json.loads(text)["best"]]
  if fmt == "csv": assert "# history" in text and len(pd.read_csv(io.StringIO(text.split("# best\n")[1].split("\n\n")[0]))) == 2
  if fmt == "html":
    assert text.count("<table") == 5 + text.count("<details>")  # each search's candidates fold under its row
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", text) and "https://" not in text
    if importlib.util.find_spec("matplotlib"): assert text.count("data:image/png;base64,") == 3


def test_report_filters_to_stdout(capsys: pytest.CaptureFixture[str], report_db: str) -> None:
  code, out, _ = run(capsys, "report", "--db", report_db, "--workload", "matmul", "--device", "cpu", "--table", "best", "--format", "csv")
  assert code == 0 and len(pd.read_csv(io.StringIO(out))) == 2
  assert pd.read_csv(io.StringIO(run(capsys, "report", "--db", report_db, "--workload", "softmax", "--table", "best", "--format", "csv")[1])).empty


@pytest.mark.parametrize("argv,message", [
  (["report", "--workload", "nope"], "unknown workload"),
  (["report", "--format", "xml"], "unknown format"),
  (["report", "--table", "nope"], "unknown table"),
  (["report", "--out", "/nonexistent-dir/r.html", "--format", "html"], "cannot write /nonexistent-dir/r.html"),
  (["compare", "matmul", "--sweep", "n=64,x"], "bad --sweep"),
  (["compare", "matmul", "--sweep", "q=64"], "has no parameter q"),
  (["compare", "nope", "--sweep", "n=8"], "unknown workload"),
  (["compare", "matmul", "--sweep", "n=8", "--against", "jax"], "unknown baseline jax"),
  (["bench", "matmul", "--format", "pdf"], "unknown format"),
  (["bench", "matmul", "-p", "m=x"], "bad parameter"),
  (["kernels", "--format", "yaml"], "unknown format"),
  (["bench", "matmul", "-p", "m=0"], "bad matmul parameter m=0: sizes are at least 1"),
  (["bench", "conv2d", "-p", "padding=-1"], "padding at least 0"),
  (["search", "matmul", "-p", "m=1000000000000", "-p", "n=1000000000000"], "out of memory"),
  (["cache", "export"], "cache export needs --out FILE"),
  (["cache", "merge", "a.db", "--out", "c.db"], "cache merge takes two or more files"),
  (["cache", "import"], "cache import takes one cache file"),
  (["cache", "verify", "a.db", "b.db"], "cache verify takes one cache file"),
  (["cache", "prune", "--before", "2020-13-45"], "bad --before '2020-13-45': write a date"),
  (["cache", "export", "--out", "x.db", "--json"], "--format and --json are for cache list, not cache export"),
  (["search", "matmul", "--format", "xml"], "unknown format"),
  (["report", "--device", "nosuch"], "no device in the database matches --device 'nosuch'"),
  (["search", "matmul", "--workers", "99999"], "add --oversubscribe"),
  (["search", "matmul", "--workers", "99999", "--oversubscribe"], "is more than 4 per core"),  # it once started them all
  (["bench", "softmax", "--dtype", "int32"], "softmax does not compute in int32; it takes float16, bfloat16, float32"),
  (["compare", "matmul", "--dtype", "nope"], "unsupported dtype 'nope'; use one of bool, int8, uint8"),
  (["search", "train_step", "--dtype", "float16"], "train_step does not compute in float16; it takes bfloat16, float32"),
  (["report", "--kernel", "r_9_9"], "no tuned kernel or search matches --kernel 'r_9_9'"),
  (["search", "matmul", "--strategy", "optuna", "--sampler", "nonsense"], "optuna option sampler='nonsense' is not one of tpe, cmaes, gp"),
  (["search", "matmul", "--option", "depth=3"], "beam has no option 'depth'; it takes width, min_gain"),
  (["search", "matmul", "--option", "width=wide"], "beam option width='wide' is not a whole number"),
  (["search", "matmul", "--option", "width"], "bad --option 'width': write KEY=VALUE"),
  (["search", "matmul", "--strategy", "random", "--beam-width", "2"], "random has no option 'width'"),
])
def test_bad_input_one_line(capsys: pytest.CaptureFixture[str], report_db: str, argv: list[str], message: str) -> None:
  code, out, err = run(capsys, *argv, *(["--db", report_db] if argv[0] != "kernels" else []))
  assert code == 2 and err.count("\n") == 1 and err.startswith("tinytune: error: ") and message in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["report"], ["bench", "matmul", "-p", "m=8", "--no-peak"], ["compare", "matmul", "--sweep", "n=8"],
                                  ["devices", "--probe"], ["search", "matmul", "-p", "m=8"], ["cache", "list"], ["db", "version"]])
@pytest.mark.parametrize("db,message", [("garbage://x", "Can't load plugin"), ("not a database", "file is not a database"),
                                        ("postgresql+psycopg://u:p@127.0.0.1:1/x", "Connection refused")])
def test_unusable_database_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch, argv: list[str], db: str,
                                    message: str) -> None:
  if db.startswith("postgresql") and importlib.util.find_spec("psycopg") is None: pytest.skip("psycopg is missing")
  monkeypatch.setitem(sys.modules, "torch", None)  # as on a fresh machine: no PyTorch, and no note about it before the error
  if db == "not a database":
    (tmp_path / "junk.db").write_text("not a database")
    db = str(tmp_path / "junk.db")
  code, out, err = run(capsys, *argv, "--db", db)
  assert code == 2 and err.count("\n") == 1 and err.startswith("tinytune: error: database error: ") and message in err, err


def test_db_is_a_plain_path(capsys: pytest.CaptureFixture[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.chdir(tmp_path)
  code, out, err = run(capsys, "report", "--db", "typo.db")
  assert code == 2 and "there is no results database at" in err and not (tmp_path / "typo.db").exists()  # a typo creates nothing
  Database(str(tmp_path / "results.db")).close()
  code, out, err = run(capsys, "report", "--db", "results.db", "--format", "json")
  assert code == 0 and Database(str(tmp_path / "results.db"), read_only=True).tuned_entries() == []


@pytest.mark.parametrize("argv,message", [
  (["search", "matmul", "--seconds", "0"], "argument --seconds: 0 is not a time limit"),
  (["search", "matmul", "--seconds", "nan"], "argument --seconds: nan is not a time limit"),
  (["search", "matmul", "--seconds", "-1"], "argument --seconds: -1 is not a time limit"),
  (["search", "matmul", "--budget", "0"], "argument --budget: 0 is too small"),
  (["search", "matmul", "--workers", "0"], "argument --workers: 0 is too small"),
  (["compare", "matmul", "--sweep", "n=8", "--tune", "--budget", "0"], "argument --budget: 0 is too small"),
  (["bench", "matmul", "--repeats", "0"], "argument --repeats: 0 is too small"),
  (["bench", "matmul", "--repeats", "x"], "'x' is not a whole number"),
])
def test_bad_flag_values_are_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
  with pytest.raises(SystemExit) as exit:
    main(argv)
  err = capsys.readouterr().err
  assert exit.value.code == 2 and message in err and "Traceback" not in err
  assert err.count("\n") == 1 and err.endswith("--help)\n"), err  # argparse's usage block came first, 5-8 lines of it


def test_bench_stores_timings(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
  db = f"sqlite:///{tmp_path / 'bench.db'}"
  argv = ["bench", "matmul", "-p", "m=16", "-p", "n=16", "-p", "k=16", "--db", db, "--no-peak", "--repeats", "3", "--format", "json"]
  code, out, _ = run(capsys, *argv)
  data = json.loads(out)
  rows, kernels = {r["implementation"]: r for r in data["implementations"]}, data["kernels"]
  assert data["command"] == "bench" and data["params"] == {"m": 16, "n": 16, "k": 16}
  assert [k["opts_from"] for k in kernels] == ["defaults"] and kernels[0]["flops"] == 2 * 16 ** 3
  expected = {"tinytune-default", "tinytune-tuned", "numpy"} | ({"torch"} if torch_runs_here() else set())
  assert code == 0 and set(rows) == expected and all(r["gflops"] > 0 and r["median_ms"] > 0 for r in rows.values())
  assert rows["tinytune-tuned"]["note"].endswith("the defaults")  # an empty tuning cache: the tuned timing is the default one, not stored
  assert {b.library for b in Database(db).baselines(workload="matmul")} == expected - {"tinytune-tuned"}


def test_compare_sweep(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
  db = f"sqlite:///{tmp_path / 'compare.db'}"
  code, out, _ = run(capsys, "compare", "softmax", "--sweep", "rows=4,8", "-p", "cols=16", "--against", "numpy", "--db", db, "--repeats", "3",
                     "--format", "json")
  rows = table(out, "sizes")
  assert code == 0 and [r["params"] for r in rows] == [{"rows": 4, "cols": 16}, {"rows": 8, "cols": 16}]
  assert all(r["speedup_vs_numpy"] > 0 and r["speedup_vs_default"] == 1 and "torch_ms" not in r for r in rows)
  code, out, _ = run(capsys, "compare", "reduce", "--sweep", "rows=4,8", "--sweep", "axis=0,1", "-p", "cols=8", "--against", "numpy", "--db", db,
                     "--repeats", "3", "--format", "csv", "--no-store")
  assert code == 0 and len(pd.read_csv(io.StringIO(out))) == 4


def test_missing_torch_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
  """Without PyTorch the default baselines go on without it, with a note that says what is left out (bench's note said "its column"
  of a table with a row per implementation); --against torch asks for it, so its absence is the error."""
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name, *a))
  db = ["--db", f"sqlite:///{tmp_path / 'c.db'}", "--repeats", "3", "--format", "json"]
  code, out, err = run(capsys, "compare", "elementwise", "--sweep", "n=64", *db)
  assert code == 0 and err == 'tinytune: note: PyTorch is not installed: pip install "tinytune[torch]"; its columns are left out\n'
  assert "torch_ms" not in table(out, "sizes")[0] and "speedup_vs_torch" not in table(out, "sizes")[0]
  code, out, err = run(capsys, "bench", "elementwise", "-p", "n=64", "--no-peak", *db)
  assert code == 0 and err.endswith('pip install "tinytune[torch]"; its row is left out\n') and err.count("\n") == 1
  assert "torch" not in {r["implementation"] for r in table(out, "implementations")}
  for command in (["bench", "elementwise", "-p", "n=64", "--no-peak"], ["compare", "elementwise", "--sweep", "n=64"]):
    for against in ("torch", "torch,numpy"):
      code, out, err = run(capsys, *command, "--against", against, *db)
      assert code == 2 and out == "" and err == (f'tinytune: error: --against {against}: PyTorch is not installed: pip install "tinytune[torch]" '
                                                 "(or leave torch out of --against)\n")
  monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
  from tinytune.kernels.baselines import torch_module
  with pytest.raises(RuntimeError, match=r'pip install "tinytune\[torch\]"'): torch_module()


def test_compare_tunes_then_reports(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
  db = f"sqlite:///{tmp_path / 'tune.db'}"
  code, out, _ = run(capsys, "compare", "reduce", "--sweep", "rows=32", "-p", "cols=64", "--tune", "--budget", "3", "--against", "numpy", "--db", db,
                     "--repeats", "3", "--format", "json")
  (row,) = table(out, "sizes")
  assert code == 0 and row["params"] == {"rows": 32, "cols": 64, "axis": 1} and "not in the tuning cache" not in row["note"]
  code, out, _ = run(capsys, "report", "--db", db, "--format", "json")
  data = json.loads(out)
  assert code == 0 and len(data["best"]) == 1 and data["best"][0]["strategy"] == "beam" and 1 <= len(data["history"]) <= 4
  assert {b["library"] for b in data["baselines"]} >= {"tinytune-default", "tinytune-tuned", "numpy"}


# the README's "JSON output" section: each command's context keys, then each table's row keys
SCHEMA: dict[str, tuple[set[str], dict[str, set[str]]]] = {
  "search": ({"workload", "params", "dtype", "device", "fingerprint", "strategy", "cache_hit", "elapsed_ms"},
             {"kernels": {"kernel", "dtype", "default_ms", "tuned_ms", "spread", "speedup", "cache_hit", "candidates", "opts", "key", "note",
                                     "errors"}}),
  "bench": ({"workload", "params", "dtype", "device", "peak_gflops", "peak_gbs"},
            {"implementations": {"implementation", "dtype", "version", "median_ms", "spread", "min_ms", "gflops", "gbs", "roof_pct", "tuned_speedup",
                                 "note"},
             "kernels": {"kernel", "dtype", "flops", "bytes", "opts", "opts_from"}}),
  "compare": ({"workload", "dtype", "device", "against"}, {"sizes": {"params", "dtype", "tuned_gflops", "default_ms", "tuned_ms", "numpy_ms",
                                                                     "default_spread", "tuned_spread", "numpy_spread",
                                                                     "speedup_vs_default", "speedup_vs_numpy", "note"}}),
  "report": ({"workload", "kernel", "device"}, {
    "devices": {"id", "device", "kind", "name", "arch", "compiler_version", "codegen_version", "fingerprint_hash", "peak_gflops", "peak_gbs",
                "probe"},
    "best": {"workload", "params", "dtype", "kernel", "device", "strategy", "default_ms", "tuned_ms", "speedup", "gflops", "gbs", "flops", "nbytes",
             "opts", "key", "run_id", "updated_at"},
    "baselines": {"workload", "params", "dtype", "device", "library", "library_version", "median_ms", "spread", "min_ms", "gflops", "gbs", "flops",
                  "nbytes", "created_at"},
    "history": {"run_id", "strategy", "workload", "params", "dtype", "kernel", "device", "tried", "status", "time_ms", "spread", "best_ms",
                "opts", "error"}}),
  "devices": (set(), {"devices": {"device", "present", "name", "fingerprint", "threads", "compiler", "missing"}}),
  "kernels": (set(), {"workloads": {"workload", "params", "gpu_params", "dtypes", "gflop", "torch", "description"}}),
  "cache list": ({"source"}, {"entries": {"kernel", "workload", "params", "device", "here", "tuned_ms", "default_ms", "speedup", "updated_at", "opts",
                                          "key"}}),
}


def test_json_schema_of_every_command(capsys: pytest.CaptureFixture[str], report_db: str) -> None:
  small = ["-p", "m=8", "-p", "n=8", "-p", "k=8"]
  argvs = {"search": ["search", "matmul", *small, "--budget", "2", "--db", report_db], "kernels": ["kernels"], "devices": ["devices"],
           "bench": ["bench", "matmul", *small, "--repeats", "2", "--against", "numpy", "--db", report_db],
           "compare": ["compare", "matmul", *small, "--repeats", "2", "--against", "numpy", "--db", report_db],
           "report": ["report", "--db", report_db], "cache list": ["cache", "list", "--db", report_db]}
  for command, argv in argvs.items():
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    data = json.loads(out)
    context, tables = SCHEMA[command]
    assert set(data) == {"schema_version", "command"} | context | set(tables) and data["schema_version"] == 1 and data["command"] == command
    for name, keys in tables.items():
      assert data[name] and all(set(row) == keys for row in data[name]), (command, name, data[name][0])
      assert all(isinstance(row["params"], dict) for row in data[name] if "params" in row)
    assert set(json.loads(run(capsys, *argv, "--format", "json")[1])) == set(data)  # --json is --format json


def test_version_and_help_on_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
  with pytest.raises(SystemExit) as exit:
    main(["--version"])
  assert exit.value.code == 0 and re.fullmatch(r"tinytune \S+\n", capsys.readouterr().out)
  parsers = [build_parser()]
  for parser in parsers:
    for action in parser._actions:
      if isinstance(action, argparse._SubParsersAction): parsers += action.choices.values()
      else: assert action.help, f"{parser.prog} {'/'.join(action.option_strings) or action.dest} has no help"
  assert len(parsers) == 9


def test_version_of_a_checkout_that_is_not_installed(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
  """Run from a checkout by PYTHONPATH with no pip install (as on the first GPU machine), --version said 'unknown (not installed)'."""
  import importlib.metadata

  import tinytune
  def absent(name: str) -> str: raise importlib.metadata.PackageNotFoundError(name)
  monkeypatch.setattr(importlib.metadata, "version", absent)
  with pytest.raises(SystemExit) as exit:
    main(["--version"])
  assert exit.value.code == 0 and capsys.readouterr().out == f"tinytune {tinytune.__version__}\n"
  with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f: pyproject = tomllib.load(f)
  assert "version" in pyproject["project"]["dynamic"] and pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tinytune.__version__"}


@pytest.mark.parametrize("command", ["search", "bench", "compare"])
@pytest.mark.parametrize("flag", ["help", "help=1"])
def test_param_help_lists_the_params(capsys: pytest.CaptureFixture[str], command: str, flag: str) -> None:
  code, out, err = run(capsys, command, "conv2d", "-p", flag)
  assert code == 0 and err == "" and "  padding=1" in out and "batch=" in out
  assert run(capsys, command, "nope", "-p", "help")[0] == 2


def test_compare_one_size(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
  code, out, _ = run(capsys, "compare", "softmax", "-p", "rows=4", "-p", "cols=16", "--against", "numpy", "--db", str(tmp_path / "c.db"),
                     "--repeats", "3", "--json")
  (row,) = table(out, "sizes")
  assert code == 0 and row["params"] == {"rows": 4, "cols": 16} and row["tuned_ms"] > 0


def test_devices_table_keeps_brackets(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
  def missing(name: str) -> Any: raise RuntimeError('NOPE needs its driver: pip install -e ".[cuda]"')
  monkeypatch.setitem(runtime._BACKENDS, "NOPE", "tinytune.runtime.nope:NopeDevice")
  monkeypatch.setattr(runtime, "device_fingerprint", lambda name, f=runtime.device_fingerprint: missing(name) if name == "NOPE" else f(name))
  code, out, _ = run(capsys, "devices")
  assert code == 0 and '".[cuda]"' in out


def test_tables_fit_80_to_140_columns(capsys: pytest.CaptureFixture[str], report_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
  """Every command's tables fit the terminal with each header on one line (at 140 they wrapped) and names and numbers whole."""
  small = ["-p", "m=8", "-p", "n=8", "-p", "k=8"]
  argvs = [["report", "--db", report_db], ["report", "--db", report_db, "--table", "history"], ["kernels"], ["devices"],
           ["cache", "list", "--db", report_db], ["search", "matmul", *small, "--budget", "2", "--quiet", "--db", report_db],
           ["bench", "matmul", *small, "--repeats", "2", "--no-peak", "--db", report_db],
           ["compare", "matmul", "--sweep", "n=8,16", "-p", "m=8", "-p", "k=8", "--repeats", "2", "--db", report_db]]
  wide = []
  for columns in (200, 140, 100, 80):
    monkeypatch.setenv("COLUMNS", str(columns))
    for argv in argvs:
      code, out, err = run(capsys, *argv)
      lines = out.splitlines()
      widest = max(map(len, lines))
      assert code == 0 and (widest <= columns or columns == 200), (argv, widest, err)
      assert all(lines[i + 2].startswith("┡") for i, line in enumerate(lines) if line.startswith("┏")), (argv, columns, "a header wrapped")
      assert "…" not in out, (argv, columns)  # nothing had to be cut
      if argv[0] in ("search", "bench"): assert re.search(r"│ r_8_8_8 +│", out), (argv, columns)
      if argv[0] == "compare": assert re.search(r"│ (m=8 )?n=16\b", out) and "±" in out, (argv, columns)  # params wrap between items
      if columns == 200 and widest > 80: wide.append(argv[0])
  assert {"report", "kernels", "bench"} <= set(wide), wide  # a wide terminal gets wide tables (how wide a search's table is depends on what it found)
  assert "default_ms" in run(capsys, "search", "matmul", *small, "--db", report_db)[1]  # the columns that matter stay
  monkeypatch.setenv("COLUMNS", "80")
  assert "left out at 80 columns: key," in " ".join(run(capsys, "report", "--db", report_db, "--table", "best")[1].split())  # says what


def test_the_search_table_says_which_measurement_it_shows(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
  small = ["-p", "m=8", "-p", "n=8", "-p", "k=8", "--budget", "2", "--quiet", "--db", str(tmp_path / "m.db")]
  assert "ms: medians of the final interleaved re-time" in run(capsys, "search", "matmul", *small)[1]
  assert "cache hit: the stored times" in run(capsys, "search", "matmul", *small)[1]


def test_bench_and_compare_in_a_dtype(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
  db, small = f"sqlite:///{tmp_path / 'dtype.db'}", ["-p", "m=8", "-p", "n=8", "-p", "k=8"]
  against = "torch,numpy" if torch_runs_here() else "numpy"
  code, out, err = run(capsys, "bench", "matmul", *small, "--dtype", "float16", "--repeats", "2", "--no-peak", "--against", against, "--db", db,
                       "--json")
  data = json.loads(out)
  assert code == 0 and data["dtype"] == "float16" and {r["dtype"] for r in data["implementations"] + data["kernels"]} == {"float16"}, err
  assert {r["implementation"] for r in data["implementations"]} == {"tinytune-default", "tinytune-tuned", *against.split(",")}
  assert {b.dtype for b in Database(db).baselines(workload="matmul")} == {"float16"}
  code, out, _ = run(capsys, "compare", "reduce", "--sweep", "rows=4,8", "-p", "cols=8", "--dtype", "int32", "--repeats", "2", "--against", "numpy",
                     "--db", db, "--json")
  data = json.loads(out)
  assert code == 0 and data["dtype"] == "int32" and [r["dtype"] for r in data["sizes"]] == ["int32", "int32"]
  baselines = table(run(capsys, "report", "--db", db, "--table", "baselines", "--json")[1], "baselines")
  half = next(b for b in baselines if b["workload"] == "matmul" and b["library"] == "numpy")
  assert {b["dtype"] for b in baselines} == {"float16", "int32"} and half["nbytes"] == 2 * 3 * 64  # two bytes per float16


def test_dtype_the_device_cannot_compile_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
  import tinytune.engine
  def refuse(kernel: Any, device: str) -> Any: raise RuntimeError("error: half is not supported here\nwith more lines")
  monkeypatch.setattr(tinytune.engine, "compile_kernel", refuse)
  monkeypatch.setitem(sys.modules, "torch", None)  # as on a fresh install: the error is the one line, no note about PyTorch before it
  code, _, err = run(capsys, "bench", "matmul", "-p", "m=8", "--dtype", "float16", "--no-peak", "--db", str(tmp_path / "d.db"))
  assert code == 2 and err == f"tinytune: error: {runtime.Device.DEFAULT} cannot run matmul in float16: error: half is not supported here\n"


def test_a_baseline_that_cannot_run_the_dtype_is_a_note(capsys: pytest.CaptureFixture[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
  from tinytune.kernels import baselines
  def refuse(*args: Any) -> Any: raise TypeError("ufunc 'matmul' not supported for the input types")
  monkeypatch.setattr(baselines, "numpy_baseline", refuse)
  code, out, err = run(capsys, "compare", "matmul", "-p", "m=8", "-p", "n=8", "-p", "k=8", "--dtype", "int32", "--repeats", "2", "--against", "numpy",
                       "--db", str(tmp_path / "n.db"), "--json")
  (row,) = table(out, "sizes")
  assert code == 0 and "numpy_ms" not in row and "speedup_vs_numpy" not in row and row["dtype"] == "int32"
  assert err == (f"tinytune: note: numpy cannot run matmul in int32 on {runtime.Device.canonicalize(None)} (ufunc 'matmul' not supported for the "
                 "input types); its columns are left out\n")  # the device TINYTUNE_DEVICE names: the H200's suite ran it on CUDA


def test_same_named_kernels_are_told_apart(capsys: pytest.CaptureFixture[str], tmp_path: Any, report_db: str) -> None:
  from tinytune.kernels.workload import schedule
  from tinytune.results_db import fingerprint_hash
  db, params = Database(f"sqlite:///{tmp_path / 'names.db'}"), {"rows": 2, "cols": 66000}  # rows too long to fuse the sum (ROW_BYTES)
  device = runtime.Device.DEFAULT
  for _, kernel in engine.kernels(schedule(WORKLOADS["softmax"].instantiate(params)[0], device)[0], device):  # a tuning cache with them
    db.set_tuned(kernel.key, fingerprint_hash(runtime.device_fingerprint(device)), "[]", 1e-6, 2e-6, None)
  code, out, _ = run(capsys, "search", "softmax", "-p", "rows=2", "-p", "cols=66000", "--db", db.url.render_as_string(), "--json")
  assert code == 0 and [k["kernel"] for k in table(out, "kernels")] == ["r_2_1_66000", "r_2_1_66000#2", "E_2_66000"]  # its max and its sum
  data = json.loads(run(capsys, "report", "--db", report_db, "--kernel", "r_64_64_64", "--json")[1])
  assert data["kernel"] == "r_64_64_64" and {r["kernel"] for r in data["best"] + data["history"]} == {"r_64_64_64"} and len(data["history"]) == 10
  assert {r["dtype"] for r in data["best"] + data["history"]} == {"float32"} and len(data["baselines"]) == 8


def test_bench_above_a_low_stored_peak_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
  db = Database(f"sqlite:///{tmp_path / 'low.db'}")
  fingerprint = runtime.device_fingerprint(runtime.Device.DEFAULT)
  db.set_peak(db.device_id(fingerprint), 1e-6, 1e-6, "a probe that ran beside a compile")  # a roof below any kernel
  code, out, _ = run(capsys, "bench", "matmul", "-p", "m=8", "-p", "n=8", "-p", "k=8", "--repeats", "2", "--against", "numpy", "--db",
                     db.url.render_as_string(), "--json")
  rows = table(out, "implementations")
  assert code == 0 and all(r["roof_pct"] == 100 and "% of the stored roof, shown as 100: the stored peak is low" in r["note"] for r in rows)
  code, out, _ = run(capsys, "bench", "matmul", "-p", "m=8", "-p", "n=8", "-p", "k=8", "--repeats", "2", "--against", "numpy", "--db",
                     db.url.render_as_string(), "--json", "--dtype", "bfloat16")  # a peak of float32's, which bfloat16 may outrun
  assert code == 0 and all("the roof is float32's, which bfloat16 instructions can outrun" in r["note"] for r in table(out, "implementations"))


def test_a_peak_that_cannot_be_measured_is_a_note(capsys: pytest.CaptureFixture[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
  """A GPU's peak probe runs PyTorch there: `bench --device opencl` (no PyTorch runs on OpenCL) was an error, exit 2, and no timings."""
  from tinytune.kernels import peaks
  if runtime.Device[runtime.Device.DEFAULT].emulated: pytest.skip(f"{runtime.Device.DEFAULT} is an emulator: bench probes no peak there")
  def no_torch(device: str) -> Any: raise RuntimeError(f"this PyTorch cannot run on {device}")
  monkeypatch.setattr(peaks, "measure_peaks", no_torch)
  code, out, err = run(capsys, "bench", "matmul", "-p", "m=8", "-p", "n=8", "-p", "k=8", "--repeats", "2", "--against", "numpy", "--db",
                       str(tmp_path / "p.db"), "--json")
  device = runtime.Device.DEFAULT
  assert code == 0 and {r["implementation"] for r in table(out, "implementations")} == {"tinytune-default", "tinytune-tuned", "numpy"}
  assert all(r["roof_pct"] is None for r in table(out, "implementations")) and json.loads(out)["peak_gflops"] is None
  assert err == f"tinytune: note: the peak of {device} cannot be measured (this PyTorch cannot run on {device}); roof_pct is left out\n"
  code, out, err = run(capsys, "devices", "--probe", "--db", str(tmp_path / "p.db"), "--json")  # OPENCL was listed as missing, for want of PyTorch
  rows = {r["device"]: r for r in table(out, "devices")}
  assert code == 0 and rows["CPU"]["present"] is True and rows["CPU"]["missing"] == "" and rows["CPU"].get("peak_gflops") is None
  assert "tinytune: note: the peak of CPU cannot be measured (this PyTorch cannot run on CPU)\n" in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("command", ["devices", "kernels"])
def test_an_output_that_cannot_be_written_is_one_line(command: str, tmp_path) -> None:
  """`tinytune devices > /dev/full` ended in an OSError traceback from the write: now one line and exit 1."""
  with open("/dev/full", "w") as full:
    out = subprocess.run([sys.executable, "-m", "tinytune.cli", command], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
                         env={**os.environ, "TINYTUNE_CACHE_DIR": str(tmp_path)})
  assert out.returncode == 1 and out.stderr == "tinytune: error: cannot write the output: No space left on device\n", out.stderr


def test_bench_and_compare_print_each_time_with_its_spread(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
  """`compare --against torch,numpy` twice in a row gave torch_ms 23.9 then 1.1 with no spread and no word about noise: each time
  now shows its spread, the number stored is the number printed, and runs spread wider than the search trusts say so."""
  from tinytune.cli import noisy
  from tinytune.kernels.baselines import Timing
  db, small = f"sqlite:///{tmp_path / 'spread.db'}", ["-p", "m=8", "-p", "n=8", "-p", "k=8", "--repeats", "3", "--against", "numpy"]
  rows = table(run(capsys, "bench", "matmul", *small, "--no-peak", "--db", db, "--json")[1], "implementations")
  assert all(r["spread"] == pytest.approx((r["median_ms"] - r["min_ms"]) / r["median_ms"], abs=1e-4) for r in rows)  # JSON's 10 decimals
  stored = {b.library: b.median_s * 1e3 for b in Database(db).baselines(workload="matmul")}
  assert {r["implementation"]: r["median_ms"] for r in rows if r["implementation"] in stored} == pytest.approx(stored)
  out = run(capsys, "bench", "matmul", *small, "--no-peak", "--db", db, "--no-store")[1]
  assert sum(bool(re.search(r"│ [\d.e-]+ ±[\d.]+% ", line)) for line in out.splitlines()) == 3  # default, tuned, numpy
  (row,) = table(run(capsys, "compare", "matmul", *small, "--db", db, "--json")[1], "sizes")
  assert all(0 <= row[f"{lib}_spread"] < 1 for lib in ("default", "tuned", "numpy"))
  out = run(capsys, "compare", "matmul", *small, "--db", db, "--no-store")[1]
  assert len(re.findall(r"│ [\d.e-]+ ±[\d.]+% ", out)) == 3 and "ms: median ±spread of the runs" in out
  calm, busy = Timing("numpy", "1", [1.0, 1.1, 1.2]), Timing("torch", "2", [0.1, 1.0, 1.2])
  assert noisy({"numpy": calm}) == "" and re.fullmatch(r"noisy: the machine was busy \(load [\d.]+\): runs spread torch 90%",
                                                        noisy({"numpy": calm, "torch": busy}))
