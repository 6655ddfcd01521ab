"""The report's plots with matplotlib (an optional extra): throughput against size, search convergence, roofline.

Each function returns PNG bytes, or None when its frame has nothing to plot."""
from __future__ import annotations

import importlib.util
import io
import math
from typing import Any

import pandas as pd

PLOT_MISSING = 'plots need matplotlib: pip install "tinytune[plot]"'


def have_matplotlib() -> bool:
  return importlib.util.find_spec("matplotlib") is not None


def _pyplot() -> Any:
  import matplotlib
  matplotlib.use("Agg")  # no display, no GUI toolkit
  import matplotlib.pyplot as plt
  return plt


def _png(fig: Any) -> bytes:
  buf = io.BytesIO()
  fig.tight_layout()
  fig.savefig(buf, format="png", dpi=100)
  _pyplot().close(fig)
  return buf.getvalue()


WIDTH = 12  # inches: 1200 pixels, the width of the report's page, whatever the number of panels


def _grid(n: int) -> tuple[Any, list[Any]]:
  """Panels two to a row (one alone), a page wide, with text at a size read without zooming."""
  cols = min(n, 2)
  rows = (n + cols - 1) // cols
  fig, axes = _pyplot().subplots(rows, cols, figsize=(WIDTH, 4.5 * rows), squeeze=False)
  for ax in axes.flat[n:]: ax.set_visible(False)
  return fig, list(axes.flat[:n])


def _plain(axis: Any) -> None:
  """Tick labels of a log axis as plain numbers (0.5, 2, 40), not powers of ten."""
  from matplotlib.ticker import FuncFormatter
  for set_formatter in (axis.set_major_formatter, axis.set_minor_formatter): set_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def throughput_plot(baselines: pd.DataFrame) -> bytes | None:
  """GFLOPS against problem size, one panel per workload and device, one line per implementation."""
  df = baselines.dropna(subset=["gflops"])
  if df.empty: return None
  groups = list(df.groupby(["workload", "device"], sort=False))
  fig, axes = _grid(len(groups))
  for ax, ((workload, device), g) in zip(axes, groups):
    order = g.drop_duplicates("params").sort_values("flops")["params"].tolist()
    for library, lg in g.groupby("library"):
      lg = lg.set_index("params").reindex(order)
      ax.plot(range(len(order)), lg["gflops"], marker="o", label=library)
    ax.set_xticks(range(len(order)), order, rotation=20, ha="right", fontsize=9)
    ax.set(title=f"{workload} on {device}", ylabel="GFLOPS")
    ax.legend(fontsize=10)
  return _png(fig)


MAX_PANELS = 12  # convergence panels drawn; the report says how many more there are


def convergence_panels(history: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
  """The convergence plot's panels: one per program (workload, params, dtype), kernel (named uniquely in its program) and device."""
  df = history.dropna(subset=["best_ms"])
  return list(df.groupby(["workload", "params", "dtype", "kernel", "device"], sort=False, dropna=False)) if len(df) else []


def convergence_plot(history: pd.DataFrame, max_panels: int = MAX_PANELS) -> bytes | None:
  """Best time so far against candidates tried, one panel per kernel of each program and device (the first `max_panels`), one
  line per run (labelled by strategy)."""
  panels = convergence_panels(history)[:max_panels]
  if not panels: return None
  fig, axes = _grid(len(panels))
  for ax, ((workload, params, dtype, kernel, device), g) in zip(axes, panels):
    for (run_id, strategy), rg in g.groupby(["run_id", "strategy"]):
      ax.step(rg["tried"], rg["best_ms"], where="post", label=f"{strategy} (run {run_id})")
    program = " ".join(str(x) for x in (workload, params, dtype) if isinstance(x, str) and x)
    ax.set(xlabel="candidates tried", ylabel="best ms", yscale="log")
    _plain(ax.yaxis)
    ax.set_title(f"{kernel} on {device}\n{program}", fontsize=11)
    ax.legend(fontsize=10)
  return _png(fig)


def roofline_plot(points: pd.DataFrame, devices: pd.DataFrame) -> bytes | None:
  """The points of `roofline_frame` (tuned kernels' GFLOPS against FLOPs per byte) under each device's stored roof, each marked
  with its number (the table beside the plot names it): numbers, not names, so no label runs over another."""
  if points.empty: return None
  peaks = devices.dropna(subset=["peak_gflops", "peak_gbs"]).drop_duplicates("device").set_index("device")
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(WIDTH, 6))
  x = points["flops_per_byte"]
  lo, hi = max(min(x.min() / 4, 0.05), 1e-3), max(x.max() * 4, 64)
  xs = [lo * (hi / lo) ** (i / 63) for i in range(64)]
  for device, d in points.groupby("device", sort=False):
    peak = peaks.loc[device]
    line = ax.plot(xs, [min(peak["peak_gflops"], v * peak["peak_gbs"]) for v in xs], linestyle="--",
                   label=f"roof {device}: {peak['peak_gflops']:.0f} GFLOPS, {peak['peak_gbs']:.1f} GB/s")[0]
    ax.scatter(d["flops_per_byte"], d["gflops"], zorder=3, color=line.get_color(), label=f"tuned kernels on {device}")
    for _, row in d.iterrows():
      ax.annotate(str(row["point"]), (row["flops_per_byte"], row["gflops"]), xytext=(3, 3), textcoords="offset points", fontsize=10)
  ax.set(xscale="log", yscale="log", xlabel="FLOPs per byte", ylabel="GFLOPS", title="roofline of tuned kernels (numbers: the table below)")
  ax.legend(fontsize=10, loc="upper left")  # above the slope of the roof, where no kernel is
  return _png(fig) if math.isfinite(hi) else None
