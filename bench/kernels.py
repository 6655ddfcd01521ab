"""Every catalog workload, default opts: torch_ms / tinytune_ms, and elementwise and reduce as a fraction of a STREAM triad
compiled and measured in the same run. Ratios are medians over rounds; each round times tinytune and PyTorch back to back with
the search's timing loop (tinytune/kernels/baselines.py). With --search S, each shape is first searched by
`tinytune search W -p ... --seconds S` into a fresh database, and the tuned kernels are timed beside the defaults.

  OMP_WAIT_POLICY=PASSIVE python bench/kernels.py [--rounds 3] [--only softmax,reduce] [--quick] [--search 60]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from tinytune.kernels import get_workload
from tinytune.kernels.baselines import tinytune_timing, torch_baseline
from tinytune.results_db import Database
from tinytune.runtime import Device
from tinytune.search.evaluate import TimingPolicy

# (workload, params): the shape first, then two others
SHAPES: list[tuple[str, dict[str, int]]] = [
  *[("matmul", {"m": n, "n": n, "k": n}) for n in (256, 512, 1024, 2048)],
  ("bmm", {"batch": 8, "m": 128, "n": 128, "k": 128}), ("bmm", {"batch": 16, "m": 256, "n": 256, "k": 64}),
  ("bmm", {"batch": 4, "m": 512, "n": 512, "k": 512}),
  ("linear", {"m": 64, "n": 1024, "k": 1024}), ("linear", {"m": 16, "n": 4096, "k": 4096}), ("linear", {"m": 256, "n": 4096, "k": 4096}),
  ("conv2d", {"batch": 16, "cin": 64, "cout": 64, "size": 56}), ("conv2d", {"batch": 4, "cin": 32, "cout": 32, "size": 32}),
  ("conv2d", {"batch": 8, "cin": 128, "cout": 128, "size": 28}),
  ("attention", {"batch": 1, "heads": 8, "seq": 1024, "dim": 64}), ("attention", {"batch": 1, "heads": 4, "seq": 256, "dim": 64}),
  ("attention", {"batch": 2, "heads": 8, "seq": 512, "dim": 64}),
  ("mlp", {"batch": 64, "din": 512, "hidden": 1024, "dout": 512}), ("mlp", {"batch": 256, "din": 784, "hidden": 128, "dout": 10}),
  ("mlp", {"batch": 128, "din": 768, "hidden": 3072, "dout": 768}),
  *[("reduce", {"rows": r, "cols": c, "axis": ax}) for r, c in ((4096, 4096), (1024, 1024), (256, 16384)) for ax in (1, 0)],
  ("layernorm", {"rows": 4096, "cols": 1024}), ("layernorm", {"rows": 1024, "cols": 1024}), ("layernorm", {"rows": 512, "cols": 4096}),
  ("softmax", {"rows": 4096, "cols": 4096}), ("softmax", {"rows": 1024, "cols": 1024}), ("softmax", {"rows": 8192, "cols": 512}),
  ("elementwise", {"n": 1 << 24}), ("elementwise", {"n": 1 << 20}), ("elementwise", {"n": 1 << 22}),
]
BANDWIDTH = ("elementwise", "reduce")  # reported as a fraction of the triad too

TRIAD = """
void triad(float* restrict a, const float* restrict b, const float* restrict c, long n) {
  #pragma omp parallel for schedule(static)
  for (long i = 0; i < n; i++) a[i] = b[i] + 3.0f * c[i];
}
"""


def triad_gbs(n: int = 1 << 24, repeats: int = 20) -> float:
  """GB/s of a STREAM triad (a = b + s*c, counted as 3 arrays moved) in C with OpenMP on the CPU device's compiler and threads."""
  dev: Any = Device["CPU"]  # the CPU device holds its compiler and flags
  with tempfile.TemporaryDirectory() as tmp:
    src, so = os.path.join(tmp, "triad.c"), os.path.join(tmp, "triad.so")
    with open(src, "w") as f: f.write(TRIAD)
    subprocess.run([dev.cc, *dev.flags, src, "-o", so], check=True)
    fn = ctypes.CDLL(so).triad
  a, b, c = (np.ones(n, np.float32) for _ in range(3))
  ptr = [x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, c)]
  fn(*ptr, ctypes.c_long(n))
  times = []
  for _ in range(repeats):
    st = time.perf_counter()
    fn(*ptr, ctypes.c_long(n))
    times.append(time.perf_counter() - st)
  return 3 * 4 * n / statistics.median(times) / 1e9


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--only", default="", help="comma-separated workload names")
  ap.add_argument("--quick", action="store_true", help="the issue's shape only")
  ap.add_argument("--search", type=float, default=0, metavar="S", help="search each shape for S seconds first, and time the tuned kernels too")
  args = ap.parse_args()
  policy = TimingPolicy(min_repeats=3, max_repeats=10, max_seconds=0.5)
  only = set(args.only.split(",")) if args.only else None
  seen: set[str] = set()
  print(f"load average at start: {os.getloadavg()[0]:.2f}  threads: {Device['CPU'].caps.threads}")
  triad = statistics.median(triad_gbs() for _ in range(args.rounds))
  print(f"STREAM triad: {triad:.1f} GB/s")
  tuned_head = f" {'searched s':>10} {'tuned ms':>9} {'torch/tuned':>11}" if args.search else ""
  print(f"{'workload':<12} {'params':<40} {'tinytune ms':>11} {'torch ms':>9} {'torch/tt':>8} {'GB/s':>6} {'of triad':>8}  max rel err{tuned_head}")
  for name, params in SHAPES:
    if only is not None and name not in only or args.quick and name in seen and name != "matmul": continue
    seen.add(name)
    w = get_workload(name)
    p = w.params(params)
    db, searched = None, 0.0
    if args.search:
      url = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
      st = time.perf_counter()
      subprocess.run([sys.executable, "-m", "tinytune.cli", "search", name, *(f"-p{k}={v}" for k, v in params.items()),
                      "--seconds", str(args.search), "--db", url], check=True, capture_output=True)
      searched = time.perf_counter() - st
      db = Database(url)
    tt, th, tu, ratios, tuned_ratios, err = [], [], [], [], [], float("nan")
    for _ in range(args.rounds):
      t, b = tinytune_timing(w, p, "CPU", False, policy), torch_baseline(w, p, "CPU", policy)
      tt.append(t.median_s)
      th.append(b.median_s)
      ratios.append(b.median_s / t.median_s)
      if db is not None:
        tu.append(tinytune_timing(w, p, "CPU", True, policy, db=db).median_s)
        tuned_ratios.append(b.median_s / tu[-1])
      if t.output is not None and b.output is not None:
        err = float(np.max(np.abs(t.output - b.output)) / max(1e-30, float(np.max(np.abs(b.output)))))
    t_ms, gbs = statistics.median(tt) * 1e3, w.nbytes(p) / statistics.median(tt) / 1e9
    bw = f"{gbs:6.1f} {gbs / triad:8.2f}" if name in BANDWIDTH else f"{'':6} {'':8}"
    shape = " ".join(f"{k}={v}" for k, v in params.items())
    tuned = f" {searched:10.1f} {statistics.median(tu) * 1e3:9.3f} {statistics.median(tuned_ratios):11.2f}" if db is not None else ""
    ratio = statistics.median(ratios)
    print(f"{name:<12} {shape:<40} {t_ms:11.3f} {statistics.median(th) * 1e3:9.3f} {ratio:8.2f} {bw}  {err:.1e}{tuned}", flush=True)
  print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
