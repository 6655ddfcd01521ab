"""The `tinytune` command."""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from tinytune.helpers import prod


def parse_params(pairs: list[str]) -> dict[str, int]:
  params = {}
  for p in pairs:
    key, sep, value = p.partition("=")
    if not sep or not value.isdigit(): raise ValueError(f"bad parameter {p!r}: write KEY=INTEGER, e.g. -p n=512")
    params[key] = int(value)
  return params


def cmd_bench(args: argparse.Namespace) -> int:
  from tinytune import Device, Kernel, Tensor
  from tinytune.realize import compile_kernel, default_opts
  from tinytune.schedule import create_schedule
  if args.workload != "matmul": raise ValueError(f"unknown workload {args.workload!r}; available: matmul")
  p = {"n": 512, **parse_params(args.param)}
  m, n, k = p.get("m", p["n"]), p["n"], p.get("k", p["n"])
  device = Device.canonicalize(args.device)
  a, b = Tensor.rand(m, k, device=device).realize(), Tensor.rand(k, n, device=device).realize()
  for item in create_schedule((a @ b).uop, device)[0]:
    kernel = Kernel(item.ast, Device[device].caps)
    kernel.apply_opts(default_opts(kernel))
    program, _ = compile_kernel(kernel, device)
    program(item.out, *kernel.bufs)
    ok = np.allclose(item.out.numpy_view().reshape(m, n), a.numpy() @ b.numpy(), rtol=1e-3, atol=1e-3)
    seconds = statistics.median(program(item.out, *kernel.bufs) for _ in range(args.repeats))
    print(f"{kernel.name}: {seconds * 1e3:.3f} ms, {kernel.flops / seconds / 1e9:.1f} GFLOPS, {prod(kernel.out_shape)} outputs, "
          f"{'verified' if ok else 'WRONG'} against numpy, opts {kernel.opts}")
    if not ok: return 1
  return 0


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="tinytune", description="A kernel generator and autotuner.")
  sub = ap.add_subparsers(dest="command", required=True)
  bench = sub.add_parser("bench", help="run a workload with its default opts and print its time")
  bench.add_argument("workload", help="matmul")
  bench.add_argument("-p", "--param", action="append", default=[], help="KEY=VALUE, e.g. -p n=1024 (matmul: m, n, k)")
  bench.add_argument("--device", default=None, help="device name (default: $TINYTUNE_DEVICE or CPU)")
  bench.add_argument("--repeats", type=int, default=10)
  args = ap.parse_args(argv)
  try: return {"bench": cmd_bench}[args.command](args)
  except (ValueError, TypeError, RuntimeError) as e:
    print(f"tinytune: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
