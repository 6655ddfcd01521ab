"""Square matmul on a GPU device: the default kernel and a tuned one against torch.matmul, in one process.

  python bench/gpu.py [--device CUDA] [--n 4096] [--dtypes float32,float16,bfloat16] [--budget 60] [--seconds 120]

Kernel times are device times from events, medians of interleaved re-timings; PyTorch's the median of CUDA-event
timings after a warm-up. TF32 is off for PyTorch's float32, so both sides compute in full float32."""
from __future__ import annotations

import argparse
import statistics
import time

from tinytune import Device, Kernel, Tensor, dtypes
from tinytune.codegen.heuristic import default_opts
from tinytune.engine.schedule import create_schedule
from tinytune.search.evaluate import Evaluator
from tinytune.search.strategy import Budget, run_strategy


def torch_time(n: int, dtype: str) -> float | None:
  try:
    import torch
  except ImportError: return None
  if not torch.cuda.is_available(): return None
  torch.backends.cuda.matmul.allow_tf32 = False
  a, b = (torch.rand(n, n, device="cuda", dtype=getattr(torch, dtype)) for _ in range(2))
  for _ in range(5): a @ b
  times = []
  for _ in range(20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); a @ b; end.record(); end.synchronize()
    times.append(start.elapsed_time(end) * 1e-3)
  return statistics.median(times)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--device", default="CUDA")
  ap.add_argument("--n", type=int, default=4096)
  ap.add_argument("--dtypes", default="float32,float16,bfloat16")
  ap.add_argument("--strategy", default="beam")
  ap.add_argument("--budget", type=int, default=60)
  ap.add_argument("--seconds", type=float, default=120)
  args = ap.parse_args()
  dev, n = Device.canonicalize(args.device), args.n
  print(f"{Device[dev].fingerprint()['name']}: {n}x{n}x{n} matmul, TFLOPS")
  print(f"{'dtype':>8} {'default':>8} {'tuned':>8} {'torch':>8} {'tuned/torch':>11} {'search s':>9} {'tried':>6}  opts")
  for dt in args.dtypes.split(","):
    a, b = (Tensor.rand(n, n, device=dev).cast(dtypes.from_any(dt)).realize() for _ in range(2))
    kernel = Kernel(create_schedule((a @ b).uop, dev)[0][0].ast, Device[dev].caps)
    st = time.perf_counter()
    with Evaluator(kernel, dev) as ev:
      result = run_strategy(args.strategy, kernel, ev, Budget(args.budget, args.seconds), default_opts(kernel))
      wall = time.perf_counter() - st
      tuned_s, default_s = ev.retime([result.best, result.default], rounds=5)
    th = torch_time(n, dt)
    tf = lambda s: 2 * n ** 3 / s / 1e12  # noqa: E731
    torch_cols = f"{tf(th):8.1f} {th / tuned_s:11.2f}" if th else f"{'-':>8} {'-':>11}"
    tried = sum(result.counts().values())
    print(f"{dt:>8} {tf(default_s):8.1f} {tf(tuned_s):8.1f} {torch_cols} {wall:9.1f} {tried:6d}  {list(result.best)}", flush=True)


if __name__ == "__main__":
  main()
