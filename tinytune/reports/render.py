"""Render a report's frames: a rich table, CSV, Markdown, JSON, or one self-contained HTML page with plots."""
from __future__ import annotations

import base64
import html
import io
import json
import math
from typing import Any, Callable

import pandas as pd

from tinytune.reports.plots import PLOT_MISSING, convergence_plot, have_matplotlib, roofline_plot, throughput_plot

FORMATS = ("table", "csv", "md", "json", "html")
TITLES = {"devices": "Devices", "best": "Best result per kernel and device", "baselines": "Implementations compared (latest timing of each)",
          "history": "Search history"}
HIDDEN = {"devices": ["fingerprint_hash", "probe"], "best": ["flops", "nbytes"], "baselines": ["flops", "nbytes", "created_at"], "history": []}


def _cell(x: Any) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)): return "-"
  if isinstance(x, float): return f"{x:.3g}" if abs(x) < 1e-2 or abs(x) >= 1e5 else f"{x:.3f}".rstrip("0").rstrip(".")
  return str(x)


def _shown(name: str, df: pd.DataFrame) -> pd.DataFrame: return df.drop(columns=[c for c in HIDDEN.get(name, []) if c in df])


def to_csv(frames: dict[str, pd.DataFrame]) -> str:
  """One CSV block per table; with several tables each starts with a `# name` line and blocks are separated by a blank line."""
  if len(frames) == 1: return next(iter(frames.values())).to_csv(index=False)
  return "\n".join(f"# {name}\n{df.to_csv(index=False)}" for name, df in frames.items())


def to_markdown(frames: dict[str, pd.DataFrame]) -> str:
  parts = []
  for name, df in frames.items():
    df = _shown(name, df)
    rows = [" | ".join(map(str, df.columns)), " | ".join("---" for _ in df.columns)]
    rows += [" | ".join(_cell(x).replace("|", "\\|") for x in row) for row in df.itertuples(index=False)]
    parts.append(f"## {TITLES.get(name, name)}\n\n" + ("\n".join(f"| {r} |" for r in rows) if len(df) else "(none)") + "\n")
  return "\n".join(parts)


def to_json(frames: dict[str, pd.DataFrame]) -> str:
  return json.dumps({name: json.loads(df.to_json(orient="records", date_format="iso")) for name, df in frames.items()}, indent=1)


def to_rich(frames: dict[str, pd.DataFrame], console: Any = None) -> str:
  """Rich tables, rendered to text (colour only when `console` writes to a terminal)."""
  from rich.console import Console
  from rich.table import Table
  console = console or Console(file=io.StringIO(), width=200, force_terminal=False)
  for name, df in frames.items():
    if name == "history" and len(frames) > 1: df = df.groupby(["run_id", "kernel"], sort=False).tail(1)  # the end of each search only
    df = _shown(name, df)
    table = Table(title=TITLES.get(name, name) + (" (last candidate of each search)" if name == "history" and len(frames) > 1 else ""))
    for col in df.columns: table.add_column(str(col), overflow="fold")
    for row in df.itertuples(index=False): table.add_row(*map(_cell, row))
    if not len(df): table.caption = "(none)"
    console.print(table)
  return console.file.getvalue() if isinstance(console.file, io.StringIO) else ""


def _img(png: bytes | None, alt: str, empty: str) -> str:
  if png is None: return f"<p class='note'>{html.escape(alt)}: {html.escape(empty)}.</p>"
  src = f"data:image/png;base64,{base64.b64encode(png).decode()}"
  return f"<figure><img alt='{html.escape(alt)}' src='{src}'><figcaption>{html.escape(alt)}</figcaption></figure>"


STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;font-size:13px;margin-bottom:1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#eee}td:nth-child(-n+3){text-align:left}
img{max-width:100%}.note{color:#a60}"""


def to_html(frames: dict[str, pd.DataFrame], title: str = "tinytune report") -> str:
  """One page, no network: CSS inline, plots as base64 PNG (or a note saying they need matplotlib)."""
  body = [f"<h1>{html.escape(title)}</h1>"]
  plots: list[tuple[str, bool, Callable[[], bytes | None], str]] = [
    ("throughput against size, per implementation", "baselines" in frames, lambda: throughput_plot(frames["baselines"]),
     "no timings yet (tinytune bench or tinytune compare records them)"),
    ("search convergence: best time against candidates tried", "history" in frames, lambda: convergence_plot(frames["history"]),
     "no searches yet (tinytune search)"),
    ("roofline of tuned kernels (roofs measured by the built-in probe)", "best" in frames and "devices" in frames,
     lambda: roofline_plot(frames["best"], frames["devices"]), "needs tuned kernels and the device's peaks (tinytune devices --probe)"),
  ]
  if any(wanted for _, wanted, _, _ in plots):
    if not have_matplotlib(): body.append(f"<p class='note'>{html.escape(PLOT_MISSING)}</p>")
    else: body += [_img(make(), alt, empty) for alt, wanted, make, empty in plots if wanted]
  for name, df in frames.items():
    df = _shown(name, df)
    table = df.to_html(index=False, na_rep="-", float_format=_cell, border=0, escape=True) if len(df) else "<p>(none)</p>"
    body.append(f"<h2>{html.escape(TITLES.get(name, name))}</h2>\n{table}")
  return f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n" \
         + "\n".join(body) + "\n</body></html>\n"


def render(frames: dict[str, pd.DataFrame], fmt: str, title: str = "tinytune report") -> str:
  if fmt not in FORMATS: raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
  if fmt == "html": return to_html(frames, title)
  return {"table": to_rich, "csv": to_csv, "md": to_markdown, "json": to_json}[fmt](frames)
