"""Sampling a batch: X[idx] with X 60000x784 float32 (realized) and 128 fresh random int32 indices per run, against NumPy.

  python bench/gather.py [--runs 50] [--device CPU]
  python bench/gather.py --checks [--runs 6]     # the index checks' cost: checked against unchecked, in alternating rounds

Each run builds a new index Tensor and realizes X[idx] (the same graph structure, so the schedule cache hits, as in a training
loop); the time is wall clock from the index's creation to the realized rows, median of the runs after one warm-up.
--checks times X[idx], nn.Embedding(1000, 64) of (16, 64) ids, X[idx * 1] (an index computed lazily) and A[idx] (10^6 int32 indices
into arange(10^6)), 15 runs each per round,
with the index checks (tinytune.tensor.checks.checked: fused into the kernel that reads the index) on and turned off, the rounds
alternating which goes first (--runs rounds after one warm-up round); on a shared machine run `uptime` beside it."""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np

from tinytune import Tensor, nn
from tinytune.nn import layers
from tinytune.runtime import Device
from tinytune.tensor import indexing


def compare_checks(rounds: int, device: str | None, per: int = 15) -> None:
  rng = np.random.default_rng(0)
  X = Tensor(rng.random((60000, 784), dtype=np.float32), device=device).realize()
  emb = nn.Embedding(1000, 64)
  emb.weight = emb.weight.to(device).realize() if device else emb.weight.realize()

  def timed(op: Callable[[Tensor], Tensor], high: int, shape: tuple[int, ...]) -> Callable[[], float]:
    def run() -> float:
      idx = Tensor(rng.integers(0, high, shape).astype(np.int32), device=device).realize()
      start = time.perf_counter()
      op(idx).realize()
      Device[idx.device].synchronize()  # unchecked, an asynchronous device's realize returns before its kernel ran
      return time.perf_counter() - start
    return run
  A = Tensor.arange(10**6, device=device).contiguous().realize()
  work = {"X[idx]": timed(lambda i: X[i], 60000, (128,)), "Embedding": timed(emb, 1000, (16, 64)),
          "X[idx * 1]": timed(lambda i: X[i * 1], 60000, (128,)), "A[idx] 10^6": timed(lambda i: A[i], 10**6, (10**6,))}
  real = indexing.checked
  times: dict[tuple[str, bool], list[float]] = {(w, on): [] for w in work for on in (True, False)}
  try:
    for r in range(rounds + 1):  # round 0 warms up (every kernel compiled both ways) and is not counted
      for on in ((True, False) if r % 2 == 0 else (False, True)):
        indexing.checked = layers.checked = real if on else (lambda values, lo, hi, error: values)
        for w, fn in work.items():
          got = [fn() for _ in range(per)]
          if r: times[(w, on)] += got
  finally: indexing.checked = layers.checked = real
  for w in work:
    yes, no = times[(w, True)], times[(w, False)]
    print(f"{w:12s} checked {statistics.median(yes) * 1e3:.3f} ms (min {min(yes) * 1e3:.3f}), unchecked {statistics.median(no) * 1e3:.3f} ms "
          f"(min {min(no) * 1e3:.3f}), median of {len(yes)} runs")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--runs", type=int, default=50)
  ap.add_argument("--device", default=None)
  ap.add_argument("--checks", action="store_true", help="the index checks' cost, in alternating rounds (--runs rounds)")
  args = ap.parse_args()
  if args.checks: return compare_checks(args.runs, args.device)
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
