"""The search's rate and budget: candidates measured per second after the first 10 s, and each search's wall time against the
seconds asked, per strategy, on matmul n^3 (float16: tensor cores). It is bench/gpu_suite.py's "rates" section, which measures it on a
real GPU; without one, --device FAKEGPU (bench/fake_gpu.py) renders with the CUDA renderer, compiles as long as NVRTC and runs in
microseconds, as on an H200.

  python bench/search_rate.py [--device FAKEGPU] [--strategies beam,random,optuna] [--seconds 30] [--size 1024] [--dtype float16]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_gpu  # noqa: E402
from gpu_suite import Suite, search_rates  # noqa: E402


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--device", default="FAKEGPU")
  ap.add_argument("--strategies", default="beam,random,optuna")
  ap.add_argument("--seconds", type=float, default=30.0)
  ap.add_argument("--size", type=int, default=1024)
  ap.add_argument("--dtype", default="float16")
  ap.add_argument("--jobs", type=int, default=0, help="compile processes or threads (default: one per core)")
  args = ap.parse_args()
  fake_gpu.register()
  print(f"matmul {args.size}^3 {args.dtype} on {args.device}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the start")
  search_rates(Suite(args), args.device, args.size, args.seconds, tuple(args.strategies.split(",")), args.dtype, args.jobs)
  print(f"(load {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
  main()
