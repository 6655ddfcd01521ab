"""Search strategies on float32 matmul: default vs tuned time per strategy under one candidate budget, PyTorch beside.

  python bench/search.py [--sizes 512,1024] [--budget 60] [--strategies beam,optuna,random]

Each search uses a fresh temporary database, so nothing is a cache hit."""
from __future__ import annotations

import argparse
import statistics
import time

from tinytune import Device, Kernel, Tensor
from tinytune.codegen.heuristic import default_opts
from tinytune.engine.schedule import create_schedule
from tinytune.search.evaluate import Evaluator
from tinytune.search.strategy import Budget, run_strategy


def torch_time(n: int, threads: int) -> float | None:
  try:
    import torch
  except ImportError: return None
  torch.set_num_threads(threads)
  a, b = torch.rand(n, n), torch.rand(n, n)
  for _ in range(3): a @ b
  times = []
  for _ in range(10):
    st = time.perf_counter()
    a @ b
    times.append(time.perf_counter() - st)
  return statistics.median(times)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--sizes", default="512,1024")
  ap.add_argument("--budget", type=int, default=60)
  ap.add_argument("--strategies", default="beam,optuna,random")
  args = ap.parse_args()
  caps = Device["CPU"].caps
  head = f"{'n':>5} {'strategy':>8} {'default':>9} {'tuned':>9} {'torch':>9} {'tuned/torch':>11} {'speedup':>8} {'search s':>9} {'cand/s':>7}"
  print(head + "  (GFLOPS; opts)")
  for n in (int(s) for s in args.sizes.split(",")):
    a, b = Tensor.rand(n, n).realize(), Tensor.rand(n, n).realize()
    kernel = Kernel(create_schedule((a @ b).uop, "CPU")[0][0].ast, caps)
    flops = 2 * n ** 3
    for strategy in args.strategies.split(","):
      st = time.perf_counter()
      with Evaluator(kernel, "CPU") as ev:
        result = run_strategy(strategy, kernel, ev, Budget(args.budget), default_opts(kernel))
        wall = time.perf_counter() - st
        tuned_s, default_s = ev.retime([result.best, result.default], rounds=5)
      th = torch_time(n, caps.threads)
      tried = sum(result.counts().values())
      g = lambda s: flops / s / 1e9  # noqa: E731
      torch_col, ratio = (f"{g(th):9.1f}", f"{th / tuned_s:11.2f}") if th else (f"{'-':>9}", f"{'-':>11}")
      print(f"{n:5d} {strategy:>8} {g(default_s):9.1f} {g(tuned_s):9.1f} {torch_col} {ratio} {default_s / tuned_s:8.2f} {wall:9.1f} "
            f"{tried / wall:7.2f}  {list(result.best)}")


if __name__ == "__main__":
  main()
