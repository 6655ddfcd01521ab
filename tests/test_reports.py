from __future__ import annotations

import io
import json
import re
import sys

import pandas as pd
import pytest

from tinytune.reports import FORMATS, baselines_frame, best_frame, devices_frame, history_frame, render, report_frames
from tinytune.results_db import Database


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
  assert "## Best result per kernel and device" in md and "| workload | params | kernel |" in md and "r_128_128_128" in md
  table = render(frames, "table")
  assert "Best result per kernel and device" in table and "r_64_64_64" in table and "tinytune-tuned" in table


def _check_self_contained(page: str) -> None:
  assert page.startswith("<!DOCTYPE html>") and page.count("<table") == 4
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
