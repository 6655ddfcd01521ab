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

from tinytune.results_db import Baseline, Candidate, Database, Device, KernelRecord, Peak, SearchRun, Tuned

BEST_COLUMNS = ["workload", "params", "param_values", "kernel", "device", "strategy", "default_ms", "tuned_ms", "speedup", "gflops", "gbs", "flops",
                "nbytes", "opts", "key"]
HISTORY_COLUMNS = ["run_id", "strategy", "workload", "params", "param_values", "kernel", "device", "tried", "status", "time_ms", "best_ms", "opts"]
BASELINE_COLUMNS = ["workload", "params", "param_values", "device", "library", "library_version", "median_ms", "min_ms", "gflops", "gbs", "flops",
                    "nbytes", "created_at"]


def _table(db: Database, model: Any) -> pd.DataFrame:
  with db.session(write=False) as session:
    result = session.execute(select(model.__table__))
    return pd.DataFrame(result.fetchall(), columns=list(result.keys()))


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


def _workload_counts(workload: str, params: str) -> tuple[float, float]:
  """(FLOPs, bytes) of a catalog workload at these params; NaN where the workload is not in the catalog."""
  from tinytune.kernels import WORKLOADS
  if (w := WORKLOADS.get(workload)) is None: return math.nan, math.nan
  try:
    p = w.params(json.loads(params))
    return float(w.flops(p)), float(w.nbytes(p))
  except (ValueError, KeyError, TypeError): return math.nan, math.nan


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
  """The tuning cache: per kernel and device, the default and tuned times, speedup, throughput and the opts."""
  devices = devices_frame(db)
  devices = devices[_device_filter(devices, device)]
  kernels = _table(db, KernelRecord)[["key", "name", "flops", "nbytes"]]
  runs = _table(db, SearchRun)[["id", "strategy"]].rename(columns={"id": "run_id"})  # the entry itself names its workload and params
  df = _table(db, Tuned).merge(devices[["fingerprint_hash", "device"]], left_on="device_hash", right_on="fingerprint_hash")
  df = df.merge(kernels, how="left", left_on="kernel_key", right_on="key").merge(runs, how="left", on="run_id")
  if workload: df = df[df["workload"] == workload]
  if df.empty: return pd.DataFrame(columns=BEST_COLUMNS)
  df = df.assign(kernel=df["name"].fillna(df["kernel_key"].str[:12]), params=_labels(df), param_values=_values(df),
                 opts=[json.loads(o) for o in df["opts"]],
                 default_ms=df["default_s"] * 1e3, tuned_ms=df["best_s"] * 1e3, speedup=df["default_s"] / df["best_s"],
                 gflops=df["flops"] / df["best_s"] / 1e9, gbs=df["nbytes"] / df["best_s"] / 1e9, key=df["kernel_key"].str[:12])
  return df[BEST_COLUMNS].sort_values(["workload", "kernel", "device"], na_position="last").reset_index(drop=True)


def history_frame(db: Database, workload: str | None = None, device: str | None = None) -> pd.DataFrame:
  """Every candidate in the order tried, per run and kernel: its time and the best time so far (failures count, with no time)."""
  devices = devices_frame(db)
  devices = devices[_device_filter(devices, device)]
  runs = _table(db, SearchRun)[["id", "workload", "params", "strategy"]].rename(columns={"id": "run_id"})
  kernels = _table(db, KernelRecord)[["id", "name"]].rename(columns={"id": "kernel_id", "name": "kernel"})
  df = _table(db, Candidate).merge(runs, on="run_id").merge(kernels, on="kernel_id")
  df = df.merge(devices[["id", "device"]].rename(columns={"id": "device_id"}), on="device_id")
  if workload: df = df[df["workload"] == workload]
  if df.empty: return pd.DataFrame(columns=HISTORY_COLUMNS)
  df = df.sort_values("id").reset_index(drop=True)
  df["params"], df["param_values"], df["opts"] = _labels(df), _values(df), [json.loads(o) for o in df["opts"]]
  df["time_ms"] = pd.to_numeric(df["median_s"]) * 1e3
  group = df.groupby(["run_id", "kernel_id"], sort=False)
  df["tried"] = group.cumcount() + 1
  df["best_ms"] = df["time_ms"].fillna(np.inf).groupby([df["run_id"], df["kernel_id"]]).cummin().replace(np.inf, np.nan)
  return df[HISTORY_COLUMNS]


def baselines_frame(db: Database, workload: str | None = None, device: str | None = None) -> pd.DataFrame:
  """The latest timing per workload, params, device and implementation (tinytune default and tuned, torch, numpy), with throughput."""
  devices = devices_frame(db)
  devices = devices[_device_filter(devices, device)]
  df = _table(db, Baseline).merge(devices[["id", "device"]].rename(columns={"id": "device_id"}), on="device_id")
  if workload: df = df[df["workload"] == workload]
  if df.empty: return pd.DataFrame(columns=BASELINE_COLUMNS)
  df = df.sort_values("id").drop_duplicates(["device_id", "workload", "params", "library"], keep="last")
  counts = [_workload_counts(w, p) for w, p in zip(df["workload"], df["params"])]
  df["flops"], df["nbytes"] = [c[0] for c in counts], [c[1] for c in counts]
  df = df.assign(median_ms=df["median_s"] * 1e3, min_ms=df["min_s"] * 1e3, gflops=df["flops"] / df["median_s"] / 1e9,
                 gbs=df["nbytes"] / df["median_s"] / 1e9, label=_labels(df), param_values=_values(df))
  df = df.sort_values(["workload", "flops", "label", "library"]).reset_index(drop=True)
  return df.drop(columns="params").rename(columns={"label": "params"})[BASELINE_COLUMNS]


def report_frames(db: Database, workload: str | None = None, device: str | None = None) -> dict[str, pd.DataFrame]:
  """Every table of a report, by name."""
  devices = devices_frame(db)
  return {"devices": devices[_device_filter(devices, device)].reset_index(drop=True), "best": best_frame(db, workload, device),
          "baselines": baselines_frame(db, workload, device), "history": history_frame(db, workload, device)}
