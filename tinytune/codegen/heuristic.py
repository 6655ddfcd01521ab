"""Hand-written default opts: good kernels with no search."""
from __future__ import annotations

from tinytune.codegen.kernel import Kernel, KernelOptError
from tinytune.codegen.opts import Opt, OptOps
from tinytune.dtype import dtypes
from tinytune.helpers import prod
from tinytune.uop import Ops

THREAD_MIN_WORK = 1 << 16  # below this many element-ops, starting threads costs more than it saves


def hand_coded_optimizations(kernel: Kernel) -> list[Opt]:
  k = kernel.copy()
  def try_opt(opt: Opt) -> bool:
    try: k.apply_opt(opt)
    except KernelOptError: return False
    return True

  n, simd = k.n_global, k.caps.simd_width
  vector_ok = k.ast.dtype == dtypes.float32 and n > 0
  if vector_ok:  # SIMD lanes along the contiguous output dim; reductions keep two vectors of accumulators per row
    for amt in ((2 * simd, simd, 4) if k.reduceop is not None else (simd, 4)):
      if k.sizes[n - 1] >= amt and try_opt(Opt(OptOps.UPCAST, n - 1, amt)): break
  if k.reduceop is not None and n >= 2 and _broadcasts_along(k, n - 1):  # a register tile: rows that share the loaded vectors
    for d in reversed(range(n - 1)):
      if k.sizes[d] >= 4 and try_opt(Opt(OptOps.UPCAST, d, 4)): break
  if k.reduceop is not None and k.n_reduce:
    r = k.n_reduce - 1
    for amt in (4, 2):
      if k.remaining(k.n_global + r).size >= 2 * amt and try_opt(Opt(OptOps.UNROLL, r, amt)): break
  work = prod(k.sizes)
  if k.caps.threads > 1 and work >= THREAD_MIN_WORK:
    for d in k.global_order:
      size = k.remaining(d).size
      if size >= k.caps.threads and try_opt(Opt(OptOps.THREAD, d, k.caps.threads)): break
  return k.opts


def _broadcasts_along(k: Kernel, dim: int) -> bool:
  """True if some input of the reduce does not change along `dim` (like A in A@B along N), so a tile reuses it."""
  if k.reduceop is None: return False
  views = [u for u in k.reduceop.src[0].toposort if u.op is Ops.VIEW and u.src[0].op is Ops.BUFFER]
  return any(len(v.arg.strides) == len(k.reduceop.src[0].shape) and v.arg.strides[dim] == 0 for v in views)
