"""Renders per second of the 1024x1024x1024 float32 matmul's BEAM-like candidates (rendering only: no compiler, no device).

  python bench/render.py [--n 1024] [--rounds 5] [--renderer c|opencl|cuda|hip] [--tc 0|1 [--nvrtc]]

The candidates are the default opts, the default with each valid extra opt, and a few heavily upcast kernels; with --tc, the
float16 matmul's tensor-core candidates for sm_90 (TC with that arg: 0 wmma, 1 mma.sync; the GPU default's tiles, each valid extra
opt), rendered by the CUDA renderer, and with --nvrtc each is also compiled once by NVRTC (wall time: NVRTC is native). Nothing
memoized carries over from one candidate to the next, as a search renders each candidate once. Times are CPU time of this
process (the machine is shared; rendering is single-threaded); prints the median of the rounds. To compare two versions,
run this file of one version with PYTHONPATH pointing at each, alternately, and compare the ratios of those runs."""
from __future__ import annotations

import argparse
import gc
import statistics
import time

from tinytune import Device, Kernel, Tensor
from tinytune.codegen.cstyle import CRenderer, CStyleRenderer, CUDARenderer, HIPRenderer, OpenCLRenderer
from tinytune.codegen.heuristic import default_opts
from tinytune.codegen.kernel import KernelOptError, candidate_opts
from tinytune.codegen.opts import Opt, OptOps
from tinytune.engine.schedule import create_schedule

U, R = OptOps.UPCAST, OptOps.UNROLL
HEAVY = [  # register tiles up to the upcast limit, with and without SIMD lanes, with unrolled reduces
  [Opt(U, 1, 16), Opt(U, 0, 16)], [Opt(U, 1, 32), Opt(U, 0, 8)], [Opt(U, 0, 16), Opt(U, 1, 16)],
  [Opt(U, 1, 16), Opt(U, 0, 4), Opt(R, 0, 4)], [Opt(U, 1, 4), Opt(U, 0, 8), Opt(R, 0, 8)], [Opt(U, 0, 8), Opt(R, 0, 32)],
  [Opt(U, 1, 8), Opt(U, 0, 8), Opt(R, 0, 4)],
]


def clear_caches() -> None:
  """Forget whatever rendering memoizes across kernels: values cached on UOps go with the UOps that nothing holds any more."""
  gc.collect()


def candidates(n: int) -> list[Kernel]:
  a, b = Tensor.rand(n, n).realize(), Tensor.rand(n, n).realize()
  (item,), _ = create_schedule((a @ b).uop, "CPU")
  base = Kernel(item.ast, Device["CPU"].caps)
  default = default_opts(base.copy())
  ret = [base.copy().apply_opts(default)]
  for opts in [[*default, opt] for opt in candidate_opts(ret[0])] + HEAVY:
    try: ret.append(base.copy().apply_opts(opts))
    except KernelOptError: pass
  return ret


def tc_candidates(n: int, arg: int) -> list[Kernel]:
  from tinytune.codegen.caps import cuda_caps
  from tinytune.dtype import dtypes
  from tinytune.helpers import Context
  a, b = (Tensor.empty(n, n, dtype=dtypes.float16, device="EMU").realize() for _ in range(2))
  with Context(SPLITK=0): (item,), _ = create_schedule((a @ b).uop, "EMU")  # the matmul as one kernel, not split along K
  base = Kernel(item.ast, cuda_caps("sm_90"))
  default = [Opt(OptOps.TC, 0, arg) if o.op is OptOps.TC else o for o in default_opts(base.copy())]
  ret = [base.copy().apply_opts(default)]
  for opts in [[*default, opt] for opt in candidate_opts(ret[0])]:
    try: ret.append(base.copy().apply_opts(opts))
    except KernelOptError: pass
  return ret


def nvrtc_ms(kernels: list[Kernel]) -> list[float]:
  from tinytune.runtime.cuda import _nvrtc
  ret = []
  for k in kernels:
    st = time.perf_counter()
    _nvrtc(CUDARenderer().render(k), "sm_90")
    ret.append((time.perf_counter() - st) * 1e3)
  return ret


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--n", type=int, default=1024)
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--renderer", default="c", choices=["c", "opencl", "cuda", "hip"])
  ap.add_argument("--tc", type=int, choices=[0, 1], default=None, help="the float16 matmul's TC candidates, TC with this arg")
  ap.add_argument("--nvrtc", action="store_true", help="with --tc: also compile each candidate once with NVRTC")
  args = ap.parse_args()
  renderer: CStyleRenderer = {"c": CRenderer, "opencl": OpenCLRenderer, "cuda": CUDARenderer, "hip": HIPRenderer}[args.renderer]()
  if args.tc is not None: renderer, args.renderer = CUDARenderer(), f"cuda (float16, TC arg {args.tc})"
  kernels = candidates(args.n) if args.tc is None else tc_candidates(args.n, args.tc)
  print(f"{len(kernels)} candidates of the {args.n} matmul, {args.renderer} renderer")
  per_round, slowest = [], 0.0
  for _ in range(args.rounds):
    total = 0.0
    for k in kernels:
      clear_caches()
      st = time.process_time()  # CPU time: this machine is shared, and rendering is single-threaded
      renderer.render(k)
      dt = time.process_time() - st
      total, slowest = total + dt, max(slowest, dt)
    per_round.append(len(kernels) / total)
  print(f"renders/s: median {statistics.median(per_round):.1f} over {args.rounds} rounds "
        f"(min {min(per_round):.1f}, max {max(per_round):.1f}); slowest candidate {slowest * 1e3:.1f} ms")
  if args.tc is not None and args.nvrtc:
    ms = nvrtc_ms(kernels)
    print(f"NVRTC compile ms: median {statistics.median(ms):.0f} (min {min(ms):.0f}, max {max(ms):.0f}) over {len(ms)} candidates")


if __name__ == "__main__":
  main()
