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
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from tinytune.reports.frames import roofline_frame, searches_frame
from tinytune.reports.plots import MAX_PANELS, PLOT_MISSING, convergence_panels, convergence_plot, have_matplotlib, roofline_plot, throughput_plot

FORMATS = ("table", "csv", "md", "json", "html")
SCHEMA_VERSION = 1
TITLES = {"devices": "Devices",
          "best": "Best result per kernel and device (ms: the search's final interleaved re-time of each kernel alone, as the tuning cache "
                  "stores it)",
          "baselines": "Implementations compared (ms: the latest bench or compare timing of each whole program, all its kernels per call: "
                       "median ±spread)",
          "history": "Search history (every candidate in the order tried; ms: its median while searching)",
          "searches": "Searches (one row per kernel searched; best_ms: the fastest candidate's median while searching)"}
HIDDEN = {"devices": ["fingerprint_hash", "probe"], "best": ["flops", "nbytes", "param_values"], "searches": ["param_values"],
          "baselines": ["flops", "nbytes", "created_at", "param_values"], "history": ["param_values"], "kernels": ["key"], "entries": ["key"]}
# columns a narrow terminal leaves out, least useful first, when a table does not fit at the narrowest its cells allow
LOW_VALUE = {"devices": ["id", "codegen_version", "compiler_version", "arch", "threads", "compiler", "fingerprint"],
             "best": ["key", "run_id", "updated_at", "strategy", "gbs", "opts", "gflops", "default_ms", "dtype", "device"],
             "baselines": ["library_version", "min_ms", "gbs", "gflops", "dtype", "device"],
             "history": ["run_id", "opts", "strategy", "dtype", "device", "workload", "best_ms"],
             "searches": ["run_id", "strategy", "dtype", "device", "best_ms", "workload"],
             "implementations": ["version", "min_ms", "gbs", "roof_pct"], "kernels": ["flops", "bytes", "cache_hit", "candidates", "opts"],
             "workloads": ["gpu_params", "torch", "gflop"], "entries": ["key", "device", "updated_at", "default_ms"],
             "sizes": ["tuned_gflops", "speedup_vs_numpy", "speedup_vs_default", "numpy_ms", "speedup_vs_torch"]}
WORDS = {"params", "gpu_params", "opts", "candidates", "failed", "dtypes"}  # lists: a cell wraps between its items, never inside one
PROSE = {"note", "errors", "error", "description", "missing", "name", "version", "library_version"}  # sentences: wrap between words
IDS = {"id", "key", "run_id", "updated_at", "created_at", "codegen_version", "compiler_version", "library_version", "version", "fingerprint"}
LABELS = {"workload", "params", "dtype", "device", "kind", "name", "arch", "strategy", "library", "library_version", "version", "kernel", "opts",
          "compiler", "compiler_version", "codegen_version", "updated_at", "here", "cache_hit", "opts_from"}  # may move to a caption
LONG_WORD = 24  # a prose column may be narrower than its longest word (a path), which then folds; never narrower than this


def _cell(x: Any) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)): return "-"
  if isinstance(x, (bool, np.bool_)): return "yes" if x else "no"
  if isinstance(x, dict): return " ".join(f"{k}={v}" for k, v in x.items()) or "none"  # params, counts by status
  if isinstance(x, (datetime, pd.Timestamp)): return x.strftime("%Y-%m-%d %H:%M")
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
  """A Markdown table per frame; in a report of several the search history is one row per search, as in the terminal's."""
  parts = []
  for name, df in frames.items():
    heading = (titles or {}).get(name) or TITLES.get(name, name)
    if name == "history" and len(frames) > 1: name, df, heading = "searches", searches_frame(df), TITLES["searches"]
    df = _people(name, df)
    rows = [" | ".join(map(str, df.columns)), " | ".join("---" for _ in df.columns)]
    rows += [" | ".join(_cell(x).replace("|", "\\|") for x in row) for row in df.itertuples(index=False)]
    parts.append(f"## {heading}\n\n" + ("\n".join(f"| {r} |" for r in rows) if len(df) else "(none)") + "\n")
  return "\n".join(parts)


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
  if "param_values" in df: df = df.drop(columns="params").rename(columns={"param_values": "params"})  # the report's params as objects
  return json.loads(df.to_json(orient="records", date_format="iso"))


def to_json(frames: dict[str, pd.DataFrame], command: str = "report", context: dict[str, Any] | None = None) -> str:
  """One object: the schema version, the command, its context and every table as a list of records."""
  data = {"schema_version": SCHEMA_VERSION, "command": command, **(context or {})}
  return json.dumps({**data, **{name: _records(df) for name, df in frames.items()}}, indent=1) + "\n"


def _spread(s: float) -> str: return f"±{100 * s:.1f}%" if s < 0.1 else f"±{100 * s:.0f}%"


def _timed(df: pd.DataFrame) -> pd.DataFrame:
  """Each time with its spread in one cell for people ("0.47 ±3.2%"): X_spread goes into X_ms, spread into the table's one time of
  which it is the spread (median_ms, tuned_ms or a candidate's time_ms)."""
  for col in [c for c in df.columns if str(c).endswith("spread")]:
    times = [col.removesuffix("_spread") + "_ms"] if col != "spread" else ["median_ms", "tuned_ms", "time_ms"]
    if not (time := next((t for t in times if t in df), None)): continue
    df = df.assign(**{time: [_cell(t) if pd.isna(t) or pd.isna(s) else f"{_cell(t)} {_spread(s)}" for t, s in zip(df[time], df[col])]})
    df = df.drop(columns=col)
  return df


def _people(name: str, df: pd.DataFrame) -> pd.DataFrame:
  """A table as people read it: without its HIDDEN columns and note and error columns where they are empty, times with spreads."""
  df = _shown(name, df)
  return _timed(df.drop(columns=[c for c in ("note", "errors", "error") if c in df and not df[c].fillna("").astype(bool).any()]))


def _least(col: str, cells: list[str]) -> int:
  """The narrowest a column may be: its header, and its longest cell, or its longest item (WORDS) or word (PROSE, up to LONG_WORD)."""
  if col not in WORDS | PROSE: return max([len(col)] + [len(c) for c in cells])
  longest = max((len(w) for c in cells for w in c.split()), default=0)
  return max(len(col), min(longest, LONG_WORD) if col in PROSE else longest)


class Fit(NamedTuple):
  widths: dict[str, int]  # the columns shown and their widths
  same: dict[str, str]  # columns with one value in every row, named with it in the caption
  left_out: list[str]  # columns left out, named in the caption
  cut: bool  # even so too wide: every cell one line, cut with "…"


def _fit(name: str, cells: dict[str, list[str]], width: int) -> Fit:
  """How a table fits `width` characters: all columns at their natural widths where they can; else the fewest changes make them
  fit: LOW_VALUE's ids and versions go, then a label with one value in every row moves to the caption, then the rest of LOW_VALUE
  goes, least useful first, and the columns that wrap share the room left. Where even that is too wide, the widest are cut."""
  natural = {c: max([len(c)] + [len(x) for x in v]) for c, v in cells.items()}
  least = {c: _least(c, v) for c, v in cells.items()}
  cols, same, left_out = list(cells), {}, []
  def room(widths: dict[str, int]) -> int: return width - sum(widths[c] for c in cols) - 3 * len(cols) - 1  # "│ a │ b │"
  if room(natural) >= 0: return Fit(dict(natural), {}, [], False)
  rows = len(next(iter(cells.values()), []))
  constant = sorted((c for c in cols if c in LABELS and rows > 1 and len(set(cells[c])) == 1), key=lambda c: -least[c])
  low = [c for c in LOW_VALUE.get(name, []) if c in cols and c not in constant]
  for c in [c for c in low if c in IDS] + constant + [c for c in low if c not in IDS]:
    if room(least) >= 0: break
    cols.remove(c)
    if c in constant: same[c] = cells[c][0]
    else: left_out.append(c)
  widths = {c: least[c] for c in cols}
  if (left := room(least)) < 0:
    for _ in range(-left): widths[max(cols, key=lambda c: widths[c])] -= 1
    return Fit(widths, same, left_out, True)
  wanted = sum(natural[c] - least[c] for c in cols)  # the room left widens the wrapping columns, each by its share of what they want
  return Fit({c: least[c] + (natural[c] - least[c]) * min(left, wanted) // max(wanted, 1) for c in cols}, same, left_out, False)


def to_rich(frames: dict[str, pd.DataFrame], console: Any = None, titles: dict[str, str] | None = None) -> str:
  """Rich tables, rendered to text (colour only when `console` writes to a terminal); `titles` overrides a table's title.
  They fit the terminal ($COLUMNS, else its real width; 200 when it is no terminal) by _fit, and never break a number, a name or a
  header across lines; in a report of several tables the search history is one row per search (searches_frame)."""
  from rich.console import Console
  from rich.markup import escape
  from rich.table import Table
  console = console or Console(file=io.StringIO(), width=shutil.get_terminal_size((200, 24)).columns, force_terminal=False)
  for n, (name, df) in enumerate(frames.items()):
    title = (titles or {}).get(name) or TITLES.get(name, name)
    if name == "history" and len(frames) > 1: name, df, title = "searches", searches_frame(df), TITLES["searches"]
    df = _people(name, df)
    cells = {str(col): [_cell(x) for x in df[col]] for col in df.columns}
    fit = _fit(name, cells, console.width)
    table = Table()
    for col, width in fit.widths.items():
      wraps = col in WORDS | PROSE and not fit.cut
      table.add_column(escape(col), width=width, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    for i in range(len(df)): table.add_row(*(escape(cells[c][i]) for c in fit.widths))  # text, not markup: "[cuda]" stays
    said = ([f"in every row: {', '.join(f'{c} {v}' for c, v in fit.same.items())}"] if fit.same else []) + \
      ([f"left out at {console.width} columns: {', '.join(fit.left_out)}"] if fit.left_out else [])
    if not len(df): said = ["(none)"]
    console.print(("\n" if n else "") + escape(title), highlight=False)  # lines of their own: over a narrow table rich wraps it narrow
    console.print(table)
    if said: console.print(escape("; ".join(said)), highlight=False)
  return console.file.getvalue() if isinstance(console.file, io.StringIO) else ""


def _img(png: bytes | None, alt: str, empty: str) -> str:
  if png is None: return f"<p class='note'>{html.escape(alt)}: {html.escape(empty)}.</p>"
  src = f"data:image/png;base64,{base64.b64encode(png).decode()}"
  return f"<figure><img alt='{html.escape(alt)}' src='{src}'><figcaption>{html.escape(alt)}</figcaption></figure>"


STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;font-size:13px;margin-bottom:1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#eee}td:nth-child(-n+3){text-align:left}
img{width:100%;max-width:1200px}.note{color:#a60;max-width:1200px}summary{cursor:pointer;margin:2px 0}
details table{margin:4px 0 10px 1.5em}"""


def _note(text: str) -> str: return f"<p class='note'>{html.escape(text)}</p>"


def _table_html(df: pd.DataFrame) -> str:
  if not len(df): return "<p>(none)</p>"
  df = _flat(df).map(lambda x: _cell(x) if isinstance(x, (bool, np.bool_, datetime)) else x)  # yes and no, dates to the minute
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


DIFFER = 1.25  # a kernel's two figures (its search's re-time, bench's or compare's) further apart than this get a note saying why


def _two_measurements(best: pd.DataFrame, baselines: pd.DataFrame) -> list[str]:
  """Where the best table's figure for a program's one tuned kernel and the latest bench or compare timing of the program differ by
  more than DIFFER, a note that puts them side by side and says why they can."""
  tuned, notes = baselines[baselines["library"] == "tinytune-tuned"], []
  for (workload, params, dtype, device), g in best.groupby(["workload", "params", "dtype", "device"], sort=False):
    timed = tuned[(tuned["workload"] == workload) & (tuned["params"] == params) & (tuned["dtype"] == dtype) & (tuned["device"] == device)]
    if len(g) != 1 or timed.empty: continue
    kernel, program = g.iloc[0], timed.iloc[-1]
    if not (kernel["tuned_ms"] > 0 and program["median_ms"] > 0) or 1 / DIFFER <= program["median_ms"] / kernel["tuned_ms"] <= DIFFER: continue
    notes.append(_note(f"{workload} {params} {dtype} on {device}: the search re-timed {kernel['kernel']} at {_cell(kernel['tuned_ms'])} ms "
                       f"({_cell(kernel['updated_at'])}), the latest bench or compare timed the program at {_cell(program['median_ms'])} ms "
                       f"{_spread(program['spread'])} ({_cell(program['created_at'])}): two measurements at different times, so the load on "
                       "the machine may have differed (each one's spread says how steady it was), and the program's timing counts any other "
                       "kernels it runs; tinytune bench on a quiet machine measures the program again"))
  return notes


def _searches(history: pd.DataFrame) -> list[str]:
  """The search history collapsed: one row per search of a kernel, then each one's candidates, with their errors, behind a click."""
  parts = [_table_html(_people("searches", searches_frame(history)))]
  for (run_id, kernel), g in history.groupby(["run_id", "kernel"], sort=False):
    first, failed = g.iloc[0], int((g["status"] != "ok").sum())
    head = (f"run {run_id}: {first['strategy']} search of {kernel} ({first['workload']} {first['params']} {first['dtype']} on {first['device']}): "
            f"{len(g)} tried, {failed} failed, best {_cell(g['best_ms'].iloc[-1])} ms")
    candidates = _people("history", g[["tried", "status", "time_ms", "spread", "best_ms", "opts", "error"]])
    parts.append(f"<details><summary>{html.escape(head)}</summary>\n{_table_html(candidates)}</details>")
  return parts


def to_html(frames: dict[str, pd.DataFrame], title: str = "tinytune report", titles: dict[str, str] | None = None) -> str:
  """One page, no network: CSS inline, plots as base64 PNG (or a note saying they need matplotlib). The search history is one row
  per search, each search's candidates folded under it."""
  body = [f"<h1>{html.escape(title)}</h1>"]
  plots = have_matplotlib()
  if not plots and any(name in frames for name in ("baselines", "history", "best")): body.append(_note(PLOT_MISSING))
  if plots and "baselines" in frames:
    body.append(_img(throughput_plot(frames["baselines"]), "throughput against size, per implementation",
                     "no timings yet (tinytune bench or tinytune compare records them)"))
  if plots and "history" in frames: body += _convergence(frames["history"])
  if "best" in frames and "devices" in frames: body += _roofline(frames["best"], frames["devices"], plots)
  for name, df in frames.items():
    heading = (titles or {}).get(name) or TITLES.get("searches" if name == "history" else name, name)
    body.append(f"<h2>{html.escape(heading)}</h2>")
    body += _searches(df) if name == "history" and len(df) else [_table_html(_people(name, df))]
    if name == "best" and "baselines" in frames: body += _two_measurements(df, frames["baselines"])
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
