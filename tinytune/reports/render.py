"""Render a report's frames: a rich table, CSV, Markdown, JSON, or one self-contained HTML page with plots.

Every command's JSON is one object: `schema_version`, `command`, the command's context (workload, params, device, ...) and each
table as a list of records with snake_case keys, times in ms and params as an object (the README's "JSON output" section)."""
from __future__ import annotations

import base64
import html
import io
import json
import math
import shutil
from typing import Any

import numpy as np
import pandas as pd

from tinytune.reports.frames import roofline_frame
from tinytune.reports.plots import MAX_PANELS, PLOT_MISSING, convergence_panels, convergence_plot, have_matplotlib, roofline_plot, throughput_plot

FORMATS = ("table", "csv", "md", "json", "html")
SCHEMA_VERSION = 1
TITLES = {"devices": "Devices", "best": "Best result per kernel and device", "baselines": "Implementations compared (latest timing of each)",
          "history": "Search history"}
HIDDEN = {"devices": ["fingerprint_hash", "probe"], "best": ["flops", "nbytes", "param_values"],
          "baselines": ["flops", "nbytes", "created_at", "param_values"], "history": ["param_values"], "kernels": ["key"], "entries": ["key"]}
NARROW = 100  # a terminal under this many columns gets tables without the columns below, and the rest wrapped
LOW_VALUE = {"devices": ["id", "arch", "compiler_version", "codegen_version", "fingerprint", "compiler", "threads"],
             "best": ["strategy", "gbs", "key"], "baselines": ["library_version", "min_ms", "gbs"], "history": ["run_id", "opts"],
             "implementations": ["version", "min_ms", "gbs"], "kernels": ["flops", "bytes", "cache_hit", "spread"], "sizes": ["tuned_gflops"],
             "entries": ["device", "updated_at", "default_ms"]}


def _cell(x: Any) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)): return "-"
  if isinstance(x, (bool, np.bool_)): return "yes" if x else "no"
  if isinstance(x, dict): return " ".join(f"{k}={v}" for k, v in x.items())  # params
  if isinstance(x, list): return " ".join(":".join(map(str, o)) if isinstance(o, list) else str(o) for o in x) or "none"  # opts
  if isinstance(x, float): return f"{x:.3g}" if abs(x) < 1e-2 or abs(x) >= 1e5 else f"{x:.3f}".rstrip("0").rstrip(".")
  return str(x)


def _shown(name: str, df: pd.DataFrame) -> pd.DataFrame: return df.drop(columns=[c for c in HIDDEN.get(name, []) if c in df])


def _flat(df: pd.DataFrame) -> pd.DataFrame:
  """Params objects and opts lists as text, for formats whose cells are text."""
  df = df.drop(columns=[c for c in ("param_values",) if c in df])
  return df.map(lambda x: _cell(x) if isinstance(x, (dict, list)) else x) if len(df) else df


def to_csv(frames: dict[str, pd.DataFrame]) -> str:
  """One CSV block per table; with several tables each starts with a `# name` line and blocks are separated by a blank line."""
  if len(frames) == 1: return _flat(next(iter(frames.values()))).to_csv(index=False)
  return "\n".join(f"# {name}\n{_flat(df).to_csv(index=False)}" for name, df in frames.items())


def to_markdown(frames: dict[str, pd.DataFrame], titles: dict[str, str] | None = None) -> str:
  parts = []
  for name, df in frames.items():
    df = _shown(name, df)
    rows = [" | ".join(map(str, df.columns)), " | ".join("---" for _ in df.columns)]
    rows += [" | ".join(_cell(x).replace("|", "\\|") for x in row) for row in df.itertuples(index=False)]
    heading = (titles or {}).get(name) or TITLES.get(name, name)
    parts.append(f"## {heading}\n\n" + ("\n".join(f"| {r} |" for r in rows) if len(df) else "(none)") + "\n")
  return "\n".join(parts)


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
  if "param_values" in df: df = df.drop(columns="params").rename(columns={"param_values": "params"})  # the report's params as objects
  return json.loads(df.to_json(orient="records", date_format="iso"))


def to_json(frames: dict[str, pd.DataFrame], command: str = "report", context: dict[str, Any] | None = None) -> str:
  """One object: the schema version, the command, its context and every table as a list of records."""
  data = {"schema_version": SCHEMA_VERSION, "command": command, **(context or {})}
  return json.dumps({**data, **{name: _records(df) for name, df in frames.items()}}, indent=1) + "\n"


def to_rich(frames: dict[str, pd.DataFrame], console: Any = None, titles: dict[str, str] | None = None) -> str:
  """Rich tables, rendered to text (colour only when `console` writes to a terminal); `titles` overrides a table's title.
  They fit the terminal ($COLUMNS, else its real width; 200 when it is no terminal): under NARROW columns they drop LOW_VALUE's."""
  from rich.console import Console
  from rich.markup import escape
  from rich.table import Table
  console = console or Console(file=io.StringIO(), width=shutil.get_terminal_size((200, 24)).columns, force_terminal=False)
  for name, df in frames.items():
    if name == "history" and len(frames) > 1: df = df.groupby(["run_id", "kernel"], sort=False).tail(1)  # the end of each search only
    df = _shown(name, df)
    df = df.drop(columns=[c for c in ("note", "errors") if c in df and not df[c].fillna("").astype(bool).any()])  # said only where there is one
    if console.width < NARROW: df = df.drop(columns=[c for c in LOW_VALUE.get(name, []) if c in df])
    title = (titles or {}).get(name) or TITLES.get(name, name) + (" (last candidate of each search)" if name == "history" and len(frames) > 1 else "")
    table = Table(title=escape(title))
    for col in df.columns: table.add_column(escape(str(col)), overflow="fold")
    for row in df.itertuples(index=False): table.add_row(*(escape(_cell(x)) for x in row))  # text, not markup: "[cuda]" stays
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


def _note(text: str) -> str: return f"<p class='note'>{html.escape(text)}</p>"


def _table_html(df: pd.DataFrame) -> str:
  if not len(df): return "<p>(none)</p>"
  df = _flat(df).map(lambda x: _cell(x) if isinstance(x, (bool, np.bool_)) else x)  # yes and no, as the other tables for people say
  return df.to_html(index=False, na_rep="-", float_format=_cell, border=0, escape=True)


def _convergence(history: pd.DataFrame) -> list[str]:
  """The convergence panels, and a note naming how many kernels were left out."""
  parts = [_img(convergence_plot(history, MAX_PANELS), "search convergence: best time against candidates tried, per kernel",
                "no searches yet (tinytune search)")]
  if (more := len(convergence_panels(history)) - MAX_PANELS) > 0:
    parts.append(_note(f"{more} more kernel{'s' if more > 1 else ''} not drawn (the first {MAX_PANELS} are): "
                       "tinytune report --kernel NAME (or --workload NAME) draws the ones you want"))
  return parts


def _roofline(best: pd.DataFrame, devices: pd.DataFrame, plots: bool) -> list[str]:
  """The roofline from each device's stored peak, its numbered points as a table, and notes: a device with no stored peak, a
  point above its roof (shown at 100%)."""
  points = roofline_frame(best, devices)
  peaked = set(devices.dropna(subset=["peak_gflops", "peak_gbs"])["device"])
  parts = [_img(roofline_plot(points, devices), "roofline of tuned kernels under each device's stored peak",
                "needs tuned kernels and a stored peak for their device")] if plots else []
  if missing := sorted(set(best["device"]) - peaked):
    parts.append(_note(f"no stored peak for {', '.join(missing)}: tinytune bench (without --no-peak) or tinytune devices --probe "
                       "measures and stores one"))
  if above := int(points["above_roof"].sum()):
    parts.append(_note(f"{above} point{'s' if above > 1 else ''} above the stored roof, shown as 100%: the stored peak is low (tinytune "
                       "devices --probe on a quiet machine measures it again; a stored peak only rises) or the data fit in a cache"))
  if len(points): parts.append(f"<h3>Roofline points</h3>\n{_table_html(points)}")
  return parts


def to_html(frames: dict[str, pd.DataFrame], title: str = "tinytune report", titles: dict[str, str] | None = None) -> str:
  """One page, no network: CSS inline, plots as base64 PNG (or a note saying they need matplotlib)."""
  body = [f"<h1>{html.escape(title)}</h1>"]
  plots = have_matplotlib()
  if not plots and any(name in frames for name in ("baselines", "history", "best")): body.append(_note(PLOT_MISSING))
  if plots and "baselines" in frames:
    body.append(_img(throughput_plot(frames["baselines"]), "throughput against size, per implementation",
                     "no timings yet (tinytune bench or tinytune compare records them)"))
  if plots and "history" in frames: body += _convergence(frames["history"])
  if "best" in frames and "devices" in frames: body += _roofline(frames["best"], frames["devices"], plots)
  for name, df in frames.items():
    body.append(f"<h2>{html.escape((titles or {}).get(name) or TITLES.get(name, name))}</h2>\n{_table_html(_shown(name, df))}")
  return f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n" \
         + "\n".join(body) + "\n</body></html>\n"


def render(frames: dict[str, pd.DataFrame], fmt: str, title: str = "tinytune report", command: str = "report", context: dict[str, Any] | None = None,
           titles: dict[str, str] | None = None) -> str:
  """`frames` in one format; `command` and `context` head the JSON object, `titles` name the tables of the others."""
  if fmt not in FORMATS: raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
  if fmt == "html": return to_html(frames, title, titles)
  if fmt == "json": return to_json(frames, command, context)
  if fmt == "csv": return to_csv(frames)
  return to_rich(frames, titles=titles) if fmt == "table" else to_markdown(frames, titles)
