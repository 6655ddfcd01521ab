"""Hand-written default opts: good kernels with no search."""
from __future__ import annotations

from tinytune.codegen.kernel import Kernel, KernelOptError, find_tensor_core
from tinytune.codegen.opts import Opt, OptOps
from tinytune.dtype import dtypes
from tinytune.helpers import NOOPT, prod
from tinytune.uop import Ops

THREAD_MIN_WORK = 1 << 16  # below this many element-ops, starting threads costs more than it saves


def _first_valid(k: Kernel, *opts: Opt) -> None:
  """Apply the first of these opts that is valid here."""
  for opt in opts:
    try: return k.apply_opt(opt)
    except KernelOptError: pass


def hand_coded_optimizations(kernel: Kernel) -> list[Opt]:
  if kernel.caps.has_local: return workgroup_optimizations(kernel)
  k = kernel.copy()
  def first_valid(*opts: Opt) -> None: _first_valid(k, *opts)

  n, simd = k.n_global, k.caps.simd_width
  lane = n - 1  # the contiguous output dim carries the SIMD lanes
  vectorize = k.ast.dtype == dtypes.float32 and n > 0
  tile_row = next((d for d in reversed(range(n - 1)) if _broadcasts_along(k, lane, d)), None) if k.reduceop is not None else None
  if tile_row is not None:
    # a register tile like BLIS's micro-kernel: rows x (2 vectors) of accumulators, each loaded vector reused by every row
    if vectorize: first_valid(*(Opt(OptOps.UPCAST, lane, amt) for amt in (2 * simd, simd, 4)))
    vectors = max(1, k.upcast_size() // simd)
    first_valid(*(Opt(OptOps.UPCAST, tile_row, r) for r in (8, 6, 4, 2) if r * vectors <= k.caps.vector_registers - 4))
  else:
    if vectorize: first_valid(*(Opt(OptOps.UPCAST, lane, amt) for amt in (simd, 4)))
    if k.reduceop is not None and k.n_reduce: first_valid(*(Opt(OptOps.UNROLL, k.n_reduce - 1, amt) for amt in (4, 2)))
  if k.caps.threads > 1 and prod(k.sizes) >= THREAD_MIN_WORK: first_valid(*(Opt(OptOps.THREAD, d, k.caps.threads) for d in k.global_order))
  if tile_row is not None: first_valid(Opt(OptOps.SWAP, tile_row, lane))  # sweep the rows inside a column panel, which stays in cache
  return k.opts


def _broadcasts_along(k: Kernel, lane: int, row: int) -> bool:
  """True if the reduce reads one input that is constant along the lane dim but not the row dim (A in A@B), and one the other way."""
  assert k.reduceop is not None
  src = k.reduceop.src[0]
  if max(lane, row) >= len(src.shape): return False  # the output was reshaped to more dims than the reduce has: no tile
  strides = [u.arg.strides for u in src.toposort if u.op is Ops.VIEW and u.src[0].op is Ops.BUFFER and len(u.arg.shape) == len(src.shape)]
  return any(st[lane] == 0 and st[row] != 0 for st in strides) and any(st[row] == 0 and st[lane] != 0 for st in strides)


BIG_TILE_OUTPUTS = 1 << 22  # from 2048x2048 outputs there are enough 256x64 tiles to fill a big GPU
GROUP_MAX_OUTPUTS = 1 << 15  # with fewer outputs than this, a GPU has idle threads unless a reduce is shared by a workgroup


def workgroup_optimizations(kernel: Kernel) -> list[Opt]:
  """Devices with workgroups: a 4x4 register tile in a 16x16 workgroup for matmul-like kernels; otherwise a reduce shared
  by the threads of a workgroup when there are few outputs, and workgroups along the contiguous output dim."""
  k = kernel.copy()
  n, lane = k.n_global, k.n_global - 1
  if k.caps.tensor_cores:
    try: tc = find_tensor_core(k)
    except KernelOptError: pass
    else:  # each warp a 64x64 tile of 16x16 tensor core tiles, 2x2 warps a workgroup
      k.apply_opt(Opt(OptOps.TC, 0, 0))
      for opt in (Opt(OptOps.UPCAST, tc.row, 4), Opt(OptOps.UPCAST, tc.col, 4), Opt(OptOps.LOCAL, tc.row, 2), Opt(OptOps.LOCAL, tc.col, 2),
                  Opt(OptOps.UNROLL, 0, 2)): _first_valid(k, opt)
      return k.opts
  tile_row = next((d for d in reversed(range(n - 1)) if _broadcasts_along(k, lane, d)), None) if k.reduceop is not None else None
  if tile_row is not None:
    for d in (lane, tile_row): _first_valid(k, *(Opt(OptOps.UPCAST, d, amt) for amt in (4, 2)))
    for d in (lane, tile_row): _first_valid(k, *(Opt(OptOps.LOCAL, d, amt) for amt in (16, 8, 4, 2)))
    _first_valid(k, Opt(OptOps.UNROLL, k.n_reduce - 1, 4))
    if prod(k.out_shape) >= BIG_TILE_OUTPUTS: _first_valid(k, Opt(OptOps.UPCAST, tile_row, 4))  # 16x4 per thread: found by BEAM on an H100
    return k.opts
  if k.reduceop is not None and k.n_reduce and prod(k.out_shape) < GROUP_MAX_OUTPUTS:
    _first_valid(k, *(Opt(OptOps.GROUP, k.n_reduce - 1, amt) for amt in (256, 128, 64, 32, 16, 8, 4)))
  elif k.reduceop is None and n and k.ast.dtype == dtypes.float32: _first_valid(k, Opt(OptOps.UPCAST, lane, 4))  # 16-byte accesses
  if n: _first_valid(k, *(Opt(OptOps.LOCAL, lane, amt) for amt in (256, 128, 64, 32, 16, 8, 4, 2)))
  return k.opts


def default_opts(kernel: Kernel) -> list[Opt]:
  """The opts a kernel runs with when the tuning cache has none: the heuristics, or none at all under NOOPT."""
  return [] if NOOPT else hand_coded_optimizations(kernel)
