"""Square float32 matmul: tinytune's heuristic kernel (no search) against NumPy and PyTorch on the same threads.

  python bench/matmul.py [--sizes 256,512,1024,2048] [--threads 2] [--repeats 10]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from tinytune import Device, Kernel, Tensor
from tinytune.codegen.heuristic import default_opts
from tinytune.engine import compile_kernel
from tinytune.engine.schedule import create_schedule


def median_time(fn, repeats: int) -> float:
  fn()  # warm-up
  times = []
  for _ in range(repeats):
    st = time.perf_counter(); fn(); times.append(time.perf_counter() - st)
  return statistics.median(times)


def tinytune_time(n: int, repeats: int) -> tuple[float, list]:
  a, b = Tensor.rand(n, n).realize(), Tensor.rand(n, n).realize()
  (item,), _ = create_schedule((a @ b).uop, Device.DEFAULT)
  kernel = Kernel(item.ast, Device[Device.DEFAULT].caps)
  kernel.apply_opts(default_opts(kernel))
  program, _ = compile_kernel(kernel, Device.DEFAULT)
  program(item.out, *kernel.bufs)
  ref = a.numpy() @ b.numpy()
  assert np.allclose(item.out.numpy_view().reshape(n, n), ref, rtol=1e-3, atol=1e-3), "tinytune matmul is wrong"
  return statistics.median(program(item.out, *kernel.bufs) for _ in range(repeats)), kernel.opts


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--sizes", default="256,512,1024,2048")
  ap.add_argument("--threads", type=int, default=2)
  ap.add_argument("--repeats", type=int, default=10)
  args = ap.parse_args()
  os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
  try:
    import torch
    torch.set_num_threads(args.threads)
  except ImportError:
    torch = None
    print("PyTorch is not installed (pip install 'tinytune[torch]'); its column stays empty")
  print(f"{'n':>5} {'tinytune':>9} {'numpy':>9} {'torch':>9} {'tt/torch':>9} {'tt/numpy':>9}   GFLOPS, median of {args.repeats}; opts")
  for n in (int(s) for s in args.sizes.split(",")):
    flops = 2 * n ** 3
    tt, opts = tinytune_time(n, args.repeats)
    an, bn = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    npt = median_time(lambda: an @ bn, args.repeats)
    if torch is not None:
      at, bt = torch.from_numpy(an), torch.from_numpy(bn)
      tht = median_time(lambda: at @ bt, args.repeats)
    g = lambda t: flops / t / 1e9  # noqa: E731
    th = f"{g(tht):9.1f}" if torch is not None else f"{'-':>9}"
    ratio = f"{tht / tt:9.2f}" if torch is not None else f"{'-':>9}"
    print(f"{n:5d} {g(tt):9.1f} {g(npt):9.1f} {th} {ratio} {npt / tt:9.2f}   {opts}")


if __name__ == "__main__":
  main()
