"""Sampling a batch: X[idx] with X 60000x784 float32 (realized) and 128 fresh random int32 indices per run, against NumPy.

  python bench/gather.py [--runs 50] [--device CPU]

Each run builds a new index Tensor and realizes X[idx] (the same graph structure, so the schedule cache hits, as in a training
loop); the time is wall clock from the index's creation to the realized rows, median of the runs after one warm-up."""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tinytune import Tensor


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--runs", type=int, default=50)
  ap.add_argument("--device", default=None)
  args = ap.parse_args()
  rng = np.random.default_rng(0)
  x = rng.random((60000, 784), dtype=np.float32)
  X = Tensor(x, device=args.device).realize()
  times, np_times = [], []
  for run in range(args.runs + 1):
    idx = rng.integers(0, 60000, 128).astype(np.int32)
    start = time.perf_counter()
    got = X[Tensor(idx, device=args.device)].realize()
    took = time.perf_counter() - start
    start = time.perf_counter()
    want = x[idx]
    np_took = time.perf_counter() - start
    if not np.array_equal(got.numpy(), want): raise SystemExit(f"run {run}: X[idx] differs from NumPy")
    if run: times.append(took); np_times.append(np_took)
  print(f"X[idx] 60000x784[128]: tinytune {statistics.median(times) * 1e3:.3f} ms median of {args.runs} "
        f"(min {min(times) * 1e3:.3f}), NumPy {statistics.median(np_times) * 1e3:.3f} ms")


if __name__ == "__main__":
  main()
