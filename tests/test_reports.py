from __future__ import annotations

import html
import io
import json
import re
import sys

import pandas as pd
import pytest

from tinytune.reports import (
  FORMATS,
  baselines_frame,
  best_frame,
  devices_frame,
  history_frame,
  render,
  report_frames,
  roofline_frame,
  searches_frame,
  to_rich,
)
from tinytune.reports.plots import MAX_PANELS, convergence_panels
from tinytune.results_db import Database, fingerprint_hash

OTHER_CPU = {"kind": "CPU", "name": "Other CPU", "arch": "x86_64-other", "compiler": "cc", "compiler_version": "cc 1.0", "flags": "-O3",
             "codegen_version": "1"}


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("COLUMNS", "200")  # tables fit the terminal: make it the same wherever the tests run


def test_frames(report_db: str) -> None:
  db = Database(report_db)
  devices = devices_frame(db)
  assert len(devices) == 1 and devices["peak_gflops"][0] == 100.0 and devices["device"][0].startswith("CPU:")
  best = best_frame(db)
  assert set(best["params"]) == {"m=128 n=128 k=128", "m=64 n=64 k=64"}
  assert best["speedup"].tolist() == pytest.approx([2.0, 2.0])
  row = best[best["kernel"] == "r_64_64_64"].iloc[0]
  assert row["tuned_ms"] == pytest.approx(2.0) and row["gflops"] == pytest.approx(2 * 64 ** 3 / 2e-3 / 1e9)
  history = history_frame(db)
  assert len(history) == 20 and set(history["strategy"]) == {"beam", "random"}
  beam = history[(history["strategy"] == "beam") & (history["kernel"] == "r_64_64_64")]
  assert beam["tried"].tolist() == [1, 2, 3, 4, 5] and beam["best_ms"].tolist() == pytest.approx([4.0, 3.0, 3.0, 2.0, 2.0])
  assert beam["status"].tolist()[-1] == "crashed" and pd.isna(beam["time_ms"].tolist()[-1])
  baselines = baselines_frame(db)
  assert len(baselines) == 8 and set(baselines["library"]) == {"tinytune-default", "tinytune-tuned", "torch", "numpy"}
  torch64 = baselines[(baselines["library"] == "torch") & (baselines["params"] == "m=64 n=64 k=64")]
  assert torch64["gflops"].iloc[0] == pytest.approx(2 * 64 ** 3 / 1e-3 / 1e9)


def test_filters(report_db: str) -> None:
  db = Database(report_db)
  assert best_frame(db, workload="softmax").empty and len(best_frame(db, workload="matmul")) == 2
  assert len(best_frame(db, device="cpu")) == 2 and best_frame(db, device="cuda").empty
  label = devices_frame(db)["device"][0]
  assert len(history_frame(db, device=label)) == 20 and baselines_frame(db, device="0000nothing").empty


def test_csv_and_json_parse_back(report_db: str) -> None:
  frames = report_frames(Database(report_db))
  data = json.loads(render(frames, "json"))
  assert set(data) == {"schema_version", "command", "devices", "best", "baselines", "history"} and len(data["history"]) == 20
  blocks = render(frames, "csv").split("\n# ")
  parsed = {b.lstrip("# ").split("\n", 1)[0]: pd.read_csv(io.StringIO(b.split("\n", 1)[1])) for b in blocks}
  assert set(parsed) == set(frames) and len(parsed["best"]) == 2 and parsed["best"]["speedup"].tolist() == pytest.approx([2.0, 2.0])
  one = pd.read_csv(io.StringIO(render({"best": frames["best"]}, "csv")))
  assert list(one.columns) == [c for c in frames["best"].columns if c != "param_values"]
  assert data["schema_version"] == 1 and data["command"] == "report" and {"m": 64, "n": 64, "k": 64} in [r["params"] for r in data["best"]]
  assert data["best"][0]["opts"] == [["UPCAST", 0, 3]] and "param_values" not in data["best"][0]


def test_markdown_and_table(report_db: str) -> None:
  frames = report_frames(Database(report_db))
  md = render(frames, "md")
  assert "## Best result per kernel and device" in md and "| workload | params | dtype | kernel |" in md and "r_128_128_128" in md
  table = render(frames, "table")
  assert "Best result per kernel and device" in table and "r_64_64_64" in table and "tinytune-tuned" in table


def _check_self_contained(page: str) -> None:
  assert page.startswith("<!DOCTYPE html>") and page.count("<details>") == 4  # each search's candidates, folded
  assert page.count("<table") == 5 + 4  # the four tables (history as one row per search), the roofline's points and each search's
  assert not re.search(r"(src|href)\s*=\s*['\"]?\s*(https?:)?//", page), "the page links to the network"
  assert "http://" not in page and "https://" not in page


def test_html_with_plots(report_db: str) -> None:
  pytest.importorskip("matplotlib")
  page = render(report_frames(Database(report_db)), "html")
  _check_self_contained(page)
  assert page.count("src='data:image/png;base64,") == 3  # throughput, convergence, roofline


def test_html_without_matplotlib(report_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(sys.modules["tinytune.reports.render"], "have_matplotlib", lambda: False)
  page = render(report_frames(Database(report_db)), "html")
  _check_self_contained(page)
  assert "<img" not in page and 'pip install "tinytune[plot]"' in page.replace("&quot;", '"')


def test_empty_database(tmp_path) -> None:  # type: ignore[no-untyped-def]
  frames = report_frames(Database(f"sqlite:///{tmp_path / 'empty.db'}"))
  for fmt in FORMATS: assert render(frames, fmt)
  with pytest.raises(ValueError, match="unknown format"): render(frames, "xml")


def _program(db: Database, names: list[str], fp: dict[str, str] = OTHER_CPU, dtype: str = "float16") -> None:
  """One softmax-like search run over kernels with these names (each a different kernel), each tuned 10x faster than its default."""
  dev = db.device_id(fp)
  run = db.start_run("softmax", {"rows": 4, "cols": 16}, dev, "beam", {}, {"candidates": 2}, f"sig {names}", dtype)
  for i, name in enumerate(names):
    kernel = db.kernel_id(f"k{i}-{name}", name, "ast", [4, 16], [dtype], 1_000_000, 1000)
    for t in (1e-3, 1e-4): db.record_candidate(run, kernel, dev, f'[["UPCAST",0,{t}]]', f"h{i}{t}", 0.1, "ok", t, t, 0.01, "")
    db.set_tuned(f"k{i}-{name}", fingerprint_hash(fp), "[]", 1e-4, 1e-3, run, kernel_name=name if i == 0 else "")
  db.finish_run(run, "done")


def test_same_named_kernels_get_their_own_names_and_panels(report_db: str) -> None:
  db = Database(report_db)
  _program(db, ["r_1024_1_1024", "E_1024", "r_1024_1_1024"])
  history = history_frame(db, workload="softmax")
  assert history["kernel"].drop_duplicates().tolist() == ["r_1024_1_1024", "E_1024", "r_1024_1_1024#2"] and set(history["dtype"]) == {"float16"}
  assert [key[3] for key, _ in convergence_panels(history)] == ["r_1024_1_1024", "E_1024", "r_1024_1_1024#2"]
  assert set(best_frame(db, workload="softmax")["dtype"]) == {"float16"}


def test_left_out_panels_are_named(report_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
  pytest.importorskip("matplotlib")
  monkeypatch.setattr(sys.modules["tinytune.reports.render"], "MAX_PANELS", 3)  # as 12 would, drawing fewer
  db = Database(report_db)
  _program(db, [f"E_{i}" for i in range(4)])
  page = render({"history": history_frame(db)}, "html")
  assert "3 more kernels not drawn (the first 3 are)" in page and "--kernel NAME" in page  # 2 matmul panels and 4 softmax ones
  assert len(convergence_panels(history_frame(db))) == 6 and MAX_PANELS == 12


def test_roofline_from_the_stored_peak_capped_with_a_note(report_db: str) -> None:
  db = Database(report_db)
  _program(db, ["r_fast"])  # 10 GFLOPS at 1000 FLOPs per byte, on a device whose stored peak is 5 GFLOPS
  db.set_peak(db.device_id(OTHER_CPU), 5.0, 10.0, "a low probe")
  points = roofline_frame(best_frame(db), devices_frame(db))
  fast = points[points["kernel"] == "r_fast"].iloc[0]
  assert fast["roof_pct"] == 100 and fast["above_roof"] and fast["roof_gflops"] == 5.0 and points["point"].tolist() == [1, 2, 3]
  assert points["roof_pct"].max() <= 100
  page = render({t: report_frames(db)[t] for t in ("devices", "best")}, "html")
  assert "1 point above the stored roof, shown as 100%" in page and "Roofline points" in page


def test_roofline_says_how_to_store_a_peak(report_db: str) -> None:
  db = Database(report_db)
  _program(db, ["r_nopeak"], {**OTHER_CPU, "name": "No peak CPU"})
  page = render({t: report_frames(db)[t] for t in ("devices", "best")}, "html")
  assert re.search(r"no stored peak for CPU:\w+: tinytune bench \(without --no-peak\) or tinytune devices --probe", page)


def _known_tokens(frames: dict[str, pd.DataFrame]) -> set[str]:
  """Every whole word of every cell and header of the tables `to_rich` draws from `frames` (the history as one row per search)."""
  from tinytune.reports.render import _cell, _people
  known: set[str] = set()
  for name, df in frames.items():
    if name == "history": name, df = "searches", searches_frame(df)
    df = _people(name, df)
    known |= {str(c) for c in df.columns} | {word for col in df.columns for x in df[col] for word in _cell(x).split()}
  return known


def _check_unbroken(out: str, width: int, known: set[str]) -> None:
  """Lines fit `width`, each header is one line, and every word in a cell is a whole word of the table (no "r_128_" / "128", no
  "12.42" / "9")."""
  lines = out.splitlines()
  assert max(map(len, lines)) <= width, max(lines, key=len)
  heads = [i for i, line in enumerate(lines) if line.startswith("┏")]
  assert heads and all(lines[i + 2].startswith("┡") for i in heads), "a header wrapped"
  words = {w for line in lines if line.startswith(("│", "┃")) for cell in line.strip("│┃").replace("┃", "│").split("│") for w in cell.split()}
  assert words <= known, sorted(words - known)


@pytest.mark.parametrize("width", [80, 100, 140])
def test_tables_never_break_a_number_a_name_or_a_header(report_db: str, width: int) -> None:
  """At 80-100 columns numbers and kernel names wrapped across lines (`12.42`/`9`, `r_256`/`_256_`/`256`); at 140 headers did."""
  from rich.console import Console
  db = Database(report_db)
  _program(db, ["r_1024_1_1024", "E_1024_1024", "r_1024_1_1024"])  # softmax's kernels on another CPU: longer names, two devices
  frames = report_frames(db)
  out = to_rich(frames, Console(file=io.StringIO(), width=width))
  _check_unbroken(out, width, _known_tokens(frames))
  for name in ("r_1024_1_1024#2", "r_128_128_128", "E_1024_1024", "matmul", "softmax"): assert name in out
  assert "crashed=1" in out and "crashed:" in out  # the searches' failures and their errors stay at every width
  for table in ("history", "best", "baselines"):  # each alone, as `report --table NAME` prints it
    one = {table: frames[table]}
    _check_unbroken(to_rich(one, Console(file=io.StringIO(), width=width)), width, _known_tokens(one) | _known_tokens({"x": frames[table]}))


def test_a_table_too_wide_for_the_terminal_cuts_never_wraps(report_db: str) -> None:
  from rich.console import Console
  frames = {"best": best_frame(Database(report_db))}
  out = to_rich(frames, Console(file=io.StringIO(), width=36))
  assert max(map(len, out.splitlines())) <= 36 and "…" in out
  assert sum(line.startswith("│") for line in out.splitlines()) == 2  # a line per row: cut with an ellipsis, not folded


def test_report_history_names_each_searchs_failures(report_db: str) -> None:
  """A search with crashed=2 timeout=1 showed its failures in neither search's table nor report's history: now report's table has a row
  per search with its failed counts and the first error of each kind, and the HTML page each failed candidate's error."""
  db = Database(report_db)
  dev = db.device_id(OTHER_CPU)
  run = db.start_run("softmax", {"rows": 4, "cols": 16}, dev, "optuna", {}, {"candidates": 5}, "sig failures", "float32")
  kernel = db.kernel_id("kfail", "r_4_16", "ast", [4, 16], ["float32"], 1000, 100)
  for i, (status, error) in enumerate([("ok", ""), ("crashed", "the worker died (exit code -11)"), ("timeout", "cut off after 3.0 s"),
                                       ("crashed", "the worker died (exit code -6)"), ("ok", "")]):
    t = 1e-3 if status == "ok" else None
    db.record_candidate(run, kernel, dev, f'[["UPCAST",0,{i}]]', f"f{i}", 0.1, status, t, t, 0.01 if t else None, error)
  db.finish_run(run, "done")
  summary = searches_frame(history_frame(db, workload="softmax"))
  row = summary.iloc[0]
  assert row["tried"] == 5 and row["failed"] == {"crashed": 2, "timeout": 1} and row["best_ms"] == pytest.approx(1.0)
  assert row["errors"] == "crashed: the worker died (exit code -11); timeout: cut off after 3.0 s"
  table = render(report_frames(db, workload="softmax"), "table")
  assert "crashed=2 timeout=1" in table and "crashed: the worker died (exit code -11); timeout: cut off after 3.0 s" in " ".join(
    line.strip("│ ").split("│")[-1].strip() for line in table.splitlines() if line.startswith("│"))
  assert "| crashed=2 timeout=1 | 1 | crashed: the worker died (exit code -11); timeout: cut off after 3.0 s |" in render(
    report_frames(db, workload="softmax"), "md")
  page = render(report_frames(db, workload="softmax"), "html")
  assert page.count("<details>") == 1 and "5 tried, 3 failed, best 1 ms" in page
  assert "the worker died (exit code -6)" in page and "<td>timeout</td>" in page  # every failure, under the search's row


def test_html_says_why_a_kernels_two_figures_differ(report_db: str) -> None:
  """The page's Best result said tuned 5.056 ms and Implementations compared 10.165 ms for the same kernel, and neither said why:
  each table now says what its ms measures, and where the two are far apart a note puts them side by side."""
  db = Database(report_db)
  dev = db.device_id(OTHER_CPU)
  _program(db, ["r_4_16"])  # tuned at 0.1 ms by its search's re-time
  db.add_baseline(dev, "softmax", {"rows": 4, "cols": 16}, "tinytune-tuned", "1.0", 0.2e-3, 0.19e-3, "float16")  # bench: 0.2 ms
  page = html.unescape(render(report_frames(db), "html"))
  assert "ms: the search's final interleaved re-time of each kernel alone" in page and "ms: the latest bench or compare timing" in page
  note = re.search(r"softmax rows=4 cols=16 float16 on CPU:\w+: the search re-timed r_4_16 at 0.1 ms \([\d: -]+\), the latest bench or "
                   r"compare timed the program at 0.2 ms ±5.0% \([\d: -]+\): two measurements at different times", page)
  assert note, "no note on the two figures"
  assert "m=64 n=64 k=64" not in page.split("two measurements")[0].split("<p class='note'>")[-1]  # matmul's two figures agree: no note


def test_plots_are_a_page_wide(report_db: str) -> None:
  """The plots were about 330 pixels wide in a 1400 pixel page, with 7-point legends."""
  pytest.importorskip("matplotlib")
  from tinytune.reports.plots import convergence_plot, roofline_plot, throughput_plot
  frames = report_frames(Database(report_db))
  pngs = [throughput_plot(frames["baselines"]), convergence_plot(frames["history"]),
          roofline_plot(roofline_frame(frames["best"], frames["devices"]), frames["devices"])]
  assert all(png is not None and int.from_bytes(png[16:20], "big") >= 1100 for png in pngs)  # the PNG header's width


def test_tables_are_a_blank_line_apart() -> None:
  frames = {"a": pd.DataFrame({"x": [1, 2, 3]}), "b": pd.DataFrame({"y": [4]})}
  out = render(frames, "table")
  assert out.startswith("a\n┏") and "┘\n\nb\n┏" in out
