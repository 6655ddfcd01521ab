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
  fig.savefig(buf, format="png", dpi=90)
  _pyplot().close(fig)
  return buf.getvalue()


def _grid(n: int) -> tuple[Any, list[Any]]:
  cols = min(n, 3)
  fig, axes = _pyplot().subplots((n + cols - 1) // cols, cols, figsize=(5 * cols, 3.6 * ((n + cols - 1) // cols)), squeeze=False)
  for ax in axes.flat[n:]: ax.set_visible(False)
  return fig, list(axes.flat[:n])


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
    ax.set_xticks(range(len(order)), order, rotation=30, ha="right", fontsize=7)
    ax.set(title=f"{workload} on {device}", ylabel="GFLOPS")
    ax.legend(fontsize=7)
  return _png(fig)


def convergence_plot(history: pd.DataFrame, max_kernels: int = 6) -> bytes | None:
  """Best time so far against candidates tried, one panel per kernel and device, one line per run (labelled by strategy)."""
  df = history.dropna(subset=["best_ms"])
  if df.empty: return None
  groups = list(df.groupby(["kernel", "device"], sort=False))[:max_kernels]
  fig, axes = _grid(len(groups))
  for ax, ((kernel, device), g) in zip(axes, groups):
    for (run_id, strategy), rg in g.groupby(["run_id", "strategy"]):
      ax.step(rg["tried"], rg["best_ms"], where="post", label=f"{strategy} (run {run_id})")
    ax.set(title=f"{kernel} on {device}", xlabel="candidates tried", ylabel="best ms", yscale="log")
    ax.legend(fontsize=7)
  return _png(fig)


def roofline_plot(best: pd.DataFrame, devices: pd.DataFrame) -> bytes | None:
  """Tuned kernels' GFLOPS against arithmetic intensity (FLOPs per byte) under each device's measured roof."""
  peaks = devices.dropna(subset=["peak_gflops", "peak_gbs"]).set_index("device")
  df = best.dropna(subset=["gflops"])
  df = df[df["device"].isin(peaks.index) & (df["nbytes"] > 0)]
  if df.empty: return None
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  intensity = df["flops"] / df["nbytes"]
  lo, hi = max(min(intensity.min() / 4, 0.05), 1e-3), max(intensity.max() * 4, 64)
  xs = [lo * (hi / lo) ** (i / 63) for i in range(64)]
  for device, peak in peaks.iterrows():
    if device not in set(df["device"]): continue
    ax.plot(xs, [min(peak["peak_gflops"], x * peak["peak_gbs"]) for x in xs], linestyle="--", label=f"roof {device}")
    d = df[df["device"] == device]
    ax.scatter(d["flops"] / d["nbytes"], d["gflops"], zorder=3)
    for _, row in d.iterrows(): ax.annotate(str(row["kernel"])[:24], (row["flops"] / row["nbytes"], row["gflops"]), fontsize=6)
  ax.set(xscale="log", yscale="log", xlabel="FLOPs per byte", ylabel="GFLOPS", title="roofline of tuned kernels")
  ax.legend(fontsize=7)
  return _png(fig) if not math.isnan(hi) else None
