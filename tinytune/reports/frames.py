"""The results database as pandas frames: devices, the best result per kernel and device, search history, baselines.

Every function takes a `Database` and optional filters and returns a DataFrame with plain columns (times in ms; `params` a label
like "m=512 n=512", `param_values` the same as a dict; opts as [op, axis, arg] lists), so a
notebook can use them directly: `from tinytune.reports import best_frame; best_frame(Database()).sort_values("speedup")`."""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import select

from tinytune.helpers import unique_names
from tinytune.results_db import Baseline, Candidate, Database, Device, KernelRecord, Peak, SearchRun, Tuned
from tinytune.results_db.db import skipping

BEST_COLUMNS = ["workload", "params", "param_values", "dtype", "kernel", "device", "strategy", "default_ms", "tuned_ms", "speedup", "gflops", "gbs",
                "flops", "nbytes", "opts", "key", "run_id", "updated_at"]
HISTORY_COLUMNS = ["run_id", "strategy", "workload", "params", "param_values", "dtype", "kernel", "device", "tried", "status", "time_ms", "spread",
                   "best_ms", "opts", "error"]
SEARCH_COLUMNS = ["run_id", "strategy", "workload", "params", "dtype", "kernel", "device", "tried", "failed", "best_ms", "errors"]
BASELINE_COLUMNS = ["workload", "params", "param_values", "dtype", "device", "library", "library_version", "median_ms", "spread", "min_ms", "gflops",
                    "gbs", "flops", "nbytes", "created_at"]
ROOFLINE_COLUMNS = ["point", "kernel", "workload", "params", "dtype", "device", "flops_per_byte", "gflops", "roof_gflops", "roof_pct", "above_roof"]


def _table(db: Database, model: Any) -> pd.DataFrame:
  with db.session(write=False) as session:
    result = session.execute(select(model.__table__))
    rows = skipping(list(result), model.__tablename__, repr(db))  # a bad row (from before imports were checked) costs one warning
    return pd.DataFrame([tuple(r) for r in rows], columns=list(result.keys()))  # tuples: pandas takes a row with a `dtype` column for an array


def params_label(params: str | dict[str, Any], workload: str | None = None) -> str:
  """{"n": 256, "m": 512} -> "m=512 n=256", in the order of the catalog workload's parameters where it is known."""
  from tinytune.kernels import WORKLOADS
  p = json.loads(params) if isinstance(params, str) else params
  order = list(WORKLOADS[workload].defaults) if workload in WORKLOADS else []
  return " ".join(f"{k}={p[k]}" for k in sorted(p, key=lambda k: (order.index(k) if k in order else len(order), k)))


def _labels(df: pd.DataFrame) -> list[str]:
  """Params labels of a frame's rows ("" where the run is unknown: a tuning cache entry imported from elsewhere)."""
  return [params_label(p, w) if isinstance(p, str) else "" for w, p in zip(df["workload"], df["params"])]


def _values(df: pd.DataFrame) -> list[dict[str, Any] | None]:
  """The params of a frame's rows as dicts (None where the run is unknown)."""
  return [json.loads(p) if isinstance(p, str) else None for p in df["params"]]


def _workload_counts(workload: str, params: str, dtype: str) -> tuple[float, float]:
  """(FLOPs, bytes) of a catalog workload at these params in this dtype; NaN where the workload is not in the catalog."""
  from tinytune.dtype import dtypes
  from tinytune.kernels import WORKLOADS
  if (w := WORKLOADS.get(workload)) is None: return math.nan, math.nan
  try:
    p = w.params(json.loads(params))
    return float(w.flops(p)), float(w.nbytes(p, dtypes.from_any(dtype).itemsize))
  except (ValueError, KeyError, TypeError): return math.nan, math.nan  # an unknown dtype too (a newer tinytune's)


def _kernel_dtype(dtypes: Any) -> str | None:
  """A kernel's dtype where all its buffers have one (its record's JSON list of dtype names)."""
  names = json.loads(dtypes) if isinstance(dtypes, str) else []
  return names[0] if len(names) == 1 else None


def roof_pct(gflops: float, flops_per_byte: float, peak_gflops: float, peak_gbs: float) -> float:
  """Percent of what the roofline allows at this arithmetic intensity: min(peak GFLOPS, FLOPs per byte * peak GB/s). Over 100
  means the roof is below the measurement: the stored peak is low, or the data fit in a cache."""
  return 100 * gflops / min(peak_gflops, flops_per_byte * peak_gbs)


def devices_frame(db: Database) -> pd.DataFrame:
  """One row per device: its label (kind and the start of its fingerprint hash), fingerprint columns, measured peaks."""
  devices = _table(db, Device)
  peaks = _table(db, Peak)[["device_id", "gflops", "gbs", "probe"]].rename(columns={"gflops": "peak_gflops", "gbs": "peak_gbs"})
  devices["device"] = devices["kind"] + ":" + devices["fingerprint_hash"].str[:8]
  out = devices.merge(peaks, how="left", left_on="id", right_on="device_id")
  return out[["id", "device", "kind", "name", "arch", "compiler_version", "codegen_version", "fingerprint_hash", "peak_gflops", "peak_gbs", "probe"]]


def _device_filter(devices: pd.DataFrame, device: str | None) -> pd.Series:
  """Which devices `--device` names: a kind (cpu), a label (CPU:1a2b3c4d) or the start of a fingerprint hash."""
  if not device: return pd.Series(True, index=devices.index)
  d = device.lower()
  return (devices["kind"].str.lower() == d) | (devices["device"].str.lower() == d) | devices["fingerprint_hash"].str.startswith(d)


def best_frame(db: Database, workload: str | None = None, device: str | None = None) -> pd.DataFrame:
  """The tuning cache: per kernel and device, the default and tuned times (the search's final interleaved re-time of the kernel alone,
  as stored: run_id names the search, null for an entry imported from a cache file; updated_at when), speedup, throughput and opts."""
  devices = devices_frame(db)
  devices = devices[_device_filter(devices, device)]
  kernels = _table(db, KernelRecord)[["key", "name", "flops", "nbytes", "dtypes"]]
  runs = _table(db, SearchRun)[["id", "strategy", "dtype"]].rename(columns={"id": "run_id"})  # the entry itself names its workload and params
  df = _table(db, Tuned).merge(devices[["fingerprint_hash", "device"]], left_on="device_hash", right_on="fingerprint_hash")
  df = df.merge(kernels, how="left", left_on="kernel_key", right_on="key").merge(runs, how="left", on="run_id")
  df["run_id"] = df["run_id"].astype("Int64")  # null where the entry came from a cache file
  if workload: df = df[df["workload"] == workload]
  if df.empty: return pd.DataFrame(columns=BEST_COLUMNS)
  # the name the entry was tuned under (unique in its program: r_1024_1_1024#2), else the kernel's, else its key
  names = [t or n if isinstance(n, str) else t or k[:12] for t, n, k in zip(df["kernel_name"], df["name"], df["kernel_key"])]
  dtypes = [d if isinstance(d, str) else _kernel_dtype(k) for d, k in zip(df["dtype"], df["dtypes"])]  # the run's, else the kernel's
  df = df.assign(kernel=names, dtype=dtypes, params=_labels(df), param_values=_values(df),
                 opts=[json.loads(o) for o in df["opts"]],
                 default_ms=df["default_s"] * 1e3, tuned_ms=df["best_s"] * 1e3, speedup=df["default_s"] / df["best_s"],
                 gflops=df["flops"] / df["best_s"] / 1e9, gbs=df["nbytes"] / df["best_s"] / 1e9, key=df["kernel_key"].str[:12])
  return df[BEST_COLUMNS].sort_values(["workload", "kernel", "device"], na_position="last").reset_index(drop=True)


def history_frame(db: Database, workload: str | None = None, device: str | None = None) -> pd.DataFrame:
  """Every candidate in the order tried, per run and kernel: its time and the best time so far (failures count, with no time)."""
  devices = devices_frame(db)
  devices = devices[_device_filter(devices, device)]
  runs = _table(db, SearchRun)[["id", "workload", "params", "strategy", "dtype"]].rename(columns={"id": "run_id"})
  kernels = _table(db, KernelRecord)[["id", "name"]].rename(columns={"id": "kernel_id", "name": "kernel"})
  df = _table(db, Candidate).merge(runs, on="run_id").merge(kernels, on="kernel_id")
  df = df.merge(devices[["id", "device"]].rename(columns={"id": "device_id"}), on="device_id")
  if workload: df = df[df["workload"] == workload]
  if df.empty: return pd.DataFrame(columns=HISTORY_COLUMNS)
  df = df.sort_values("id").reset_index(drop=True)
  df["params"], df["param_values"], df["opts"] = _labels(df), _values(df), [json.loads(o) for o in df["opts"]]
  labels: dict[Any, str] = {}  # kernel names unique in each run, in the order it searched them (the second r_1024_1_1024 is r_1024_1_1024#2)
  for run_id, g in df.drop_duplicates(["run_id", "kernel_id"]).groupby("run_id", sort=False):
    labels.update({(run_id, k): name for k, name in unique_names(zip(g["kernel_id"], g["kernel"])).items()})
  df["kernel"] = [labels[(r, k)] for r, k in zip(df["run_id"], df["kernel_id"])]
  df["time_ms"] = pd.to_numeric(df["median_s"]) * 1e3
  group = df.groupby(["run_id", "kernel_id"], sort=False)
  df["tried"] = group.cumcount() + 1
  df["best_ms"] = df["time_ms"].fillna(np.inf).groupby([df["run_id"], df["kernel_id"]]).cummin().replace(np.inf, np.nan)
  return df[HISTORY_COLUMNS]


def searches_frame(history: pd.DataFrame) -> pd.DataFrame:
  """One row per search of a kernel in `history` (a history_frame): candidates tried, the failed ones by status, the best median
  while searching, and the first error of each kind of failure ("crashed: the worker died (exit code -11); timeout: ...")."""
  rows = []
  for _, g in history.groupby(["run_id", "kernel"], sort=False):
    failed = g[g["status"] != "ok"]
    first = failed.drop_duplicates("status")
    rows.append({**g.iloc[-1][SEARCH_COLUMNS[:7] + ["best_ms"]].to_dict(), "tried": len(g),
                 "failed": failed["status"].value_counts(sort=False).to_dict(),
                 "errors": "; ".join(f"{s}: {e}" if e else s for s, e in zip(first["status"], first["error"]))})
  return pd.DataFrame(rows, columns=SEARCH_COLUMNS)


def baselines_frame(db: Database, workload: str | None = None, device: str | None = None) -> pd.DataFrame:
  """The latest timing per workload, params, device and implementation (tinytune default and tuned, torch, numpy), with throughput."""
  devices = devices_frame(db)
  devices = devices[_device_filter(devices, device)]
  df = _table(db, Baseline).merge(devices[["id", "device"]].rename(columns={"id": "device_id"}), on="device_id")
  if workload: df = df[df["workload"] == workload]
  if df.empty: return pd.DataFrame(columns=BASELINE_COLUMNS)
  df = df.sort_values("id").drop_duplicates(["device_id", "workload", "params", "dtype", "library"], keep="last")
  counts = [_workload_counts(w, p, d) for w, p, d in zip(df["workload"], df["params"], df["dtype"])]
  df["flops"], df["nbytes"] = [c[0] for c in counts], [c[1] for c in counts]
  df = df.assign(median_ms=df["median_s"] * 1e3, min_ms=df["min_s"] * 1e3, spread=(df["median_s"] - df["min_s"]) / df["median_s"],
                 gflops=df["flops"] / df["median_s"] / 1e9,
                 gbs=df["nbytes"] / df["median_s"] / 1e9, label=_labels(df), param_values=_values(df))
  df = df.sort_values(["workload", "dtype", "flops", "label", "library"]).reset_index(drop=True)
  return df.drop(columns="params").rename(columns={"label": "params"})[BASELINE_COLUMNS]


def report_frames(db: Database, workload: str | None = None, device: str | None = None) -> dict[str, pd.DataFrame]:
  """Every table of a report, by name."""
  devices = devices_frame(db)
  return {"devices": devices[_device_filter(devices, device)].reset_index(drop=True), "best": best_frame(db, workload, device),
          "baselines": baselines_frame(db, workload, device), "history": history_frame(db, workload, device)}


def roofline_frame(best: pd.DataFrame, devices: pd.DataFrame) -> pd.DataFrame:
  """The roofline's points: each tuned kernel with FLOPs and bytes on a device with a stored peak, numbered as the plot draws
  them, with its roof and % of roof (capped at 100; `above_roof` marks a point the stored peak does not bound)."""
  peaks = devices.dropna(subset=["peak_gflops", "peak_gbs"]).drop_duplicates("device").set_index("device")
  df = best.dropna(subset=["gflops"])
  df = df[df["device"].isin(peaks.index) & (df["nbytes"] > 0)].reset_index(drop=True)
  if df.empty: return pd.DataFrame(columns=ROOFLINE_COLUMNS)
  peak_gflops, peak_gbs = df["device"].map(peaks["peak_gflops"]), df["device"].map(peaks["peak_gbs"])
  df["flops_per_byte"] = df["flops"] / df["nbytes"]
  df["roof_gflops"] = [min(p, x * b) for p, x, b in zip(peak_gflops, df["flops_per_byte"], peak_gbs)]
  pct = [roof_pct(g, x, p, b) for g, x, p, b in zip(df["gflops"], df["flops_per_byte"], peak_gflops, peak_gbs)]
  df["roof_pct"], df["above_roof"], df["point"] = [min(p, 100.0) for p in pct], [p > 100 for p in pct], range(1, len(df) + 1)
  return df[ROOFLINE_COLUMNS]
