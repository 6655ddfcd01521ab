"""Hand-written default opts: good kernels with no search."""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Callable, Sequence

from tinytune.codegen.kernel import PACK_BLOCK_BYTES, PACK_BYTES, AxisKind, Kernel, KernelOptError, find_tensor_core, input_strides
from tinytune.codegen.lower import FLOAT_LANES
from tinytune.codegen.opts import Opt, OptOps
from tinytune.dtype import dtypes
from tinytune.helpers import NOOPT, SPLITK, divisors, prod, round_up
from tinytune.shape import split_offset
from tinytune.uop import ALU, TRANSCENDENTAL, Ops, UOp, simplify

CACHE_LINE, L1_SET_SPAN = 64, 4096  # bytes: a cache line, and the span of addresses over which an L1's sets repeat (a page)
GATHER_STRIDE = 16  # elements apart along the lanes from which each lane of a vector load is its own cache line
# below this estimated time on one core, starting threads costs more than it saves: waking a sleeping thread on a busy machine costs
# milliseconds (the CNN step's small reduces and copies took ~8 ms threaded, 0.05-1.5 ms on one, as its search found; X[idx] of
# 128x784 floats: 0.4 ms on one thread, 15 ms on two busy cores), and a quiet machine gains nothing below ~50 us either (a vectorized
# 1024x1024 row sum: 43 us on one thread, 55 us on two)
THREAD_MIN_SECONDS = 100e-6
# one core's rates for the estimate, as the row sums and softmax measured: memory (L3 or DRAM), float32 element-ops in SIMD lanes
# (layernorm's variance pass: 4M in 43 us), and the element-ops that are calls of vector math (exp2, log2, sin: ~20 vector
# instructions for 16 lanes, 0.3 ns an element)
CORE_BYTES_PER_S, CORE_OPS_PER_S, CORE_MATH_PER_S = 50e9, 100e9, 3e9
# a tile's rows of A for one K block, all of them, stay in the last-level cache while every column panel of B passes them: past
# this, K is split into blocks (2048^3: 91 -> 148 GFLOPS with blocks of 1024; 4096^3: 79 -> 195 with 512; 1024^3, 4 MiB of A: slower)
KBLOCK_BYTES = 8 << 20
# an output this large goes past the caches (STREAM): it would not stay there for the next kernel, and a cached store first reads
# the line it writes, a third more memory traffic
STREAM_BYTES = 8 << 20
# AVX2's streamed lines are two 8-lane stores: from this output size, which stays in no L3 we met (32 MiB on Zen 4), where smaller ones
# could stay there for the next kernel (x86-64-v3, process CPU time of the kernels in turn, one thread, at load 6-7: attention
# 1x8x1024x64's 32 MiB of scores and probabilities 1.04x, a 64 MiB softmax 1.19x, elementwise 1.22x; at 13-16 MiB conv2d 16x64x56x56
# 0.89-0.99x, softmax 8192x512 0.95x)
STREAM_HALF_LINES_BYTES = 32 << 20
KBLOCK_MIN = 128  # shorter blocks spend more on reloading the output's partial sums than they save
# K blocks of packed panels up to this long read A's rows in runs too short for the prefetcher (2 KiB): each of their row tiles waits on
# L3, where longer ones keep up (x86-64-v3, one thread: 2048^3 in blocks of 512 65 GFLOPS, linear 256x4096x4096 in blocks of 2048 95,
# mlp 128x768x3072 of 1536 91; native 2048^3 of 1024 98, as fast as B's blocks) and B's blocks (packed_blocks) would gain nothing
PANEL_RUN_MAX = 512
BLOCK_K = 256  # PACK 1's K blocks: the longest up to this (2048^3 on x86-64-v3: 256 by 256 columns as fast as 512 by 256, 1.2x 128 by 512)
# from this K, a matmul whose B is gathered (x @ W.T) takes dot products along K: float32 64x1024 @ (1024x1024).T 3.37 -> 0.6 ms,
# 128x3072 @ (768x3072).T 13.1 -> 3.4, 64x512 @ (1024x512).T 0.35 -> 0.31; at K 256 the tile is faster (0.17-0.19 ms against 0.26),
# at 768 as fast. Row strides of 4 KiB put the gathered lanes in one L1 set
DOT_MIN_K = 512
# a gathered 16-bit B costs a load and a conversion a lane: dot products from a K of 256 (bfloat16 64x256 @ (1024x256).T 0.34 ->
# 0.22 ms, 128x768 @ (3072x768).T 6.3 -> 2.2; float16 0.40 -> 0.29 and 7.0 -> 3.7; at 128, 32x128 @ (512x128).T, as fast as the tile)
DOT_MIN_K_16 = 256
# from this many rows per lane of a vector, a matmul's B is copied into contiguous panels (PACK), each read by every row tile: B's rows
# 4 KiB apart (n = 1024) fall in one L1 set and each is a new page, which the prefetcher does not follow, and a gathered B (x @ W.T)
# becomes a register tile's (x86-64-v3, 2 threads: matmul 512^3 1.5x, 1024^3 1.4x, mlp 768x3072 1.4-2x, attention 1.3-2x, Winograd's
# GEMMs 2x, linear 64x1024x1024 and 256x4096x4096 1.5x over dot products; small ones like 256^3 a tie). Fewer rows leave the copy
# too few reads (AVX-512's 64 rows, 8 tiles of 8: mlp 64x512x1024 9% slower packed)
PACK_MIN_ROWS_PER_LANE = 5
# a gathered B's copy transposes it, a scalar store an element where the rows read it a vector at a time: it pays from 8 rows per lane
# of a vector (64 on AVX2: linear 64x1024x1024 1.5x over dot products; AVX-512's 16 lanes at 64 rows: 1.8x slower, at 256 1.2x faster)
PACK_GATHERED_ROWS_PER_LANE = 8


def single_core_seconds(k: Kernel) -> float:
  """An estimate of the kernel's time on one core: its memory traffic or its arithmetic, whichever takes longer. Each input counts
  once, but no more than the kernel reads of it (a gather reads a few rows of a large table)."""
  steps = prod(k.sizes)
  moved = prod(k.out_shape) * k.ast.dtype.itemsize + sum(min(b.nbytes, steps * b.dtype.itemsize) for b in k.bufs)
  ops = [(u.op in TRANSCENDENTAL, prod(u.shape)) for u in k.ast.toposort if u.op in ALU and u.op is not Ops.CAST]
  ops += [(False, prod(r.src[0].shape)) for r in k.reduceops] + ([(False, k.flops)] if k.attention is not None else [])
  return max(moved / CORE_BYTES_PER_S, sum(n / (CORE_MATH_PER_S if math else CORE_OPS_PER_S) for math, n in ops))


def _first_valid(k: Kernel, *opts: Opt) -> None:
  """Apply the first of these opts that is valid here."""
  for opt in opts:
    try: return k.apply_opt(opt)
    except KernelOptError: pass


@dataclass
class Plan:
  """A kernel on a CPU being planned, and what its planners read of it, found once before any opt is applied."""
  k: Kernel
  lane: int | None  # see lane_dim
  strides: list[list[int]]  # see input_strides
  stacked: dict[int, int]  # see stacked_dims (kernels without a reduce)
  tile_row: int | None  # see _tile_row (matmul-like kernels)
  pack: bool = False  # see _packs_b
  planner: Callable[[Plan], bool] | None = None  # the one that took the kernel

  @staticmethod
  def of(k: Kernel) -> Plan:
    lane, strides = lane_dim(k), input_strides(k)
    row_statistic = k.reduceop is not None and lane is not None and lane not in k.reduce_out_dims  # see Kernel.reduce_out_dims
    row = None if row_statistic else _tile_row(k, lane, strides)
    return Plan(k, lane, strides, dict(stacked_dims(k)) if k.reduceop is None else {}, row, _packs_b(k, row, lane))

  @property
  def simd(self) -> int: return self.k.caps.simd_width
  @property
  def vectorize(self) -> bool: return self.k.ast.dtype in FLOAT_LANES
  @property
  def gathered(self) -> bool:
    """A matmul whose B is contiguous along the reduce, not the lanes (Q @ K^T, x @ W.T): each vector of B is gathered from as many
    cache lines."""
    return self.tile_row is not None and not self.pack and any(abs(st[self.lane]) >= GATHER_STRIDE for st in self.strides if self.lane is not None)
  def first_valid(self, *opts: Opt) -> None: _first_valid(self.k, *opts)
  def upcast(self, dim: int, *amts: int) -> None: self.first_valid(*(Opt(OptOps.UPCAST, dim, amt) for amt in amts))


# one planner per kernel shape: each returns False where the kernel is not its shape (having applied nothing), else plans it from
# the device's caps and returns True. The first that takes a kernel plans it; the shared tail (cpu_tail) follows.

def plan_stack(p: Plan) -> bool:
  """A cat's rows take vectors along the lane dim where its loads are contiguous, and its stacks' rows are upcast whole where they fit
  beside a full vector of those lanes (whole-line stores): Winograd's 6x6 input transform with 16 lanes and 6x2 rows took 1.8 ms
  against 3.0 with 4 lanes and 6x6 rows (16x64x56x56)."""
  if not p.stacked: return False
  k, lane, simd = p.k, p.lane, p.simd
  stack_lane = lane if lane is not None and lane not in p.stacked and all(st[lane] in (0, 1) for st in p.strides) else None
  room = k.caps.max_upcast // (simd if stack_lane is not None and k.sizes[stack_lane] % simd == 0 else 1)
  for d, f in p.stacked.items():
    if (amt := max(a for a in divisors(f) if a <= room)) > 1: p.upcast(d, amt)
    room //= amt
  if stack_lane is not None: p.upcast(stack_lane, simd, 8, 4)  # vectors along the lane dim (up to the upcast limit)
  return True


def plan_full_reduce(p: Plan) -> bool:
  """A full reduce (or a single element): its row in SIMD lanes, else unrolled."""
  if p.lane is not None: return False
  k = p.k
  if k.reduceop is not None and k.n_reduce and not _row_lanes(k, p.strides):
    p.first_valid(*(Opt(OptOps.UNROLL, k.n_reduce - 1, amt) for amt in (4, 2)))
  return True


def plan_row_statistic(p: Plan) -> bool:
  """A row written after its statistic (softmax's sum, layernorm's variance): the statistic in SIMD lanes, then the row in vectors
  as wide (the renderer vectorizes both only at the same width)."""
  k, lane = p.k, p.lane
  if k.reduceop is None or lane is None or lane in k.reduce_out_dims: return False
  width = next((w for w in (p.simd, 8, 4) if k.sizes[lane] % w == 0), p.simd)
  if _row_lanes(k, p.strides, width) and p.vectorize: p.upcast(lane, 2 * width, width)
  return True


def plan_dot(p: Plan) -> bool:
  """A matmul with a long K that both inputs are contiguous along, B gathered: dot products, each output's partial sums in a vector
  along K (combined once after the loop), a few rows by a few columns, the columns outer, so each row of B passes once while A stays
  in cache."""
  k, lane, row, red = p.k, p.lane, p.tile_row, len(p.k.sizes) - 1
  if row is None or lane is None or not p.gathered or k.n_reduce != 1 or sum(st[red] == 1 for st in p.strides) < 2 or \
     k.sizes[red] < (DOT_MIN_K_16 if _half_inputs(k) else DOT_MIN_K): return False
  if k.caps.tensor_cores and k.sizes[red] % (2 * p.simd) == 0: p.first_valid(Opt(OptOps.TC, 0, 0))  # its pairs are neighbours
  p.first_valid(Opt(OptOps.LANES, 0, p.simd))
  p.upcast(lane, 4, 2)
  p.upcast(row, 4, 3, 5, 2)
  if row < lane: p.first_valid(Opt(OptOps.SWAP, row, lane))
  return True


def plan_register_tile(p: Plan) -> bool:
  """A matmul in any guise: a register tile like BLIS's micro-kernel, rows x (2 vectors) of accumulators, each loaded vector reused by
  every row; where A's values are computed (a fused bias and relu, softmax's exp), 4 vectors, so each computed row value serves more
  lanes, and 3 rows of them for attention's two matmuls on 16 registers. A gathered B: one vector serves as many rows as the registers
  hold, and the rows stay outer (the tile's rows of A stay in L1 while B's columns pass them)."""
  k, lane, row, simd = p.k, p.lane, p.tile_row, p.simd
  if row is None or lane is None or k.reduceop is None: return False
  if k.caps.tensor_cores and not p.gathered: p.first_valid(Opt(OptOps.TC, 0, 0))  # bfloat16 dot products (a CPU with AVX512_BF16)
  computed = sum(u.op in ALU and u.op is not Ops.CAST for u in k.reduceop.src[0].toposort) > 1
  # so is each 16-bit element of A, converted on its own, where K is long (float16 1024^3 12.4 -> 11.1 ms, 2048^3 104 -> 91; at K 784
  # a tie, and a train step's K of 10 lost 7 us)
  computed |= _half_inputs(k) and k.tc is None and k.sizes[-1] >= 1024
  # and on 16 registers a batch of matmuls with K or the lanes at most 8 vectors long and the other longer (attention's Q.K^T and P.V
  # with a head dim of 64): 3 rows of 4 vectors take 7 loads a step where 6 of 2 take 8, and P.V's rows of P pass twice, not 4 times
  # (x86-64-v3, process CPU time of the kernels in turn on one thread, loaded: attention 1x8x1024x64 1.04x, 2x8x512x64 1.11x, 1x4x256x64
  # 1.18x, bmm 16x256x256x64 1.02-1.05x; matmul 1024^3 in 3x32 2.1x slower, Winograd's 64x64 GEMMs of conv2d 16x64x56x56 0.94-0.97x)
  short, long = sorted((k.sizes[lane], k.sizes[-1]))
  three = k.caps.vector_registers <= 16 and bool(_batched(p)) and k.n_reduce == 1 and short <= 8 * simd < long
  widths = (simd,) if p.gathered else ((4 * simd,) if computed or three else ()) + (2 * simd, simd, 8, 4)
  # lanes (then rows) padded to a wider tile where that adds at most 1/16 of them (1000 -> 1008 for 2 vectors of 8, not 1 vector), or,
  # where no width divides them (97x61), to whole vectors where that adds at most 1/8: not left scalar. Masked at the end
  if p.vectorize and (w := _pad_to(k.sizes[lane], widths)) and k.sizes[lane] % w: p.first_valid(Opt(OptOps.PADTO, lane, w))
  if p.vectorize: p.upcast(lane, *widths)
  vectors = max(1, k.upcast_size() // simd)
  # rows x vectors of accumulators, at most the registers less 4 (B's vectors, a broadcast of A): 16 registers (AVX2, SSE) hold 6 rows
  # of 2 vectors, 12 accumulators, enough FMAs in flight for two units of latency 4 where 4 rows leave them waiting (1024^3 on
  # x86-64-v3, one core: 1.59x faster, the rows padded to 1026); an odd dim of 5 or 3 rows whole where it is not padded (the CNN step's
  # 1 -> 32 5x5 weight gradient by its kernel's 5 columns: 23.6 -> 69.9 GFLOPS on x86-64-v3, one thread)
  fits = [r for r in ((16, 8, 6, 4, 3, 2) if three else (16, 8, 6, 4, 2)) if r * vectors <= k.caps.vector_registers - 4]
  if (r := _pad_to(k.sizes[row], fits)) and k.sizes[row] % r: p.first_valid(Opt(OptOps.PADTO, row, r))
  p.upcast(row, *fits, *(r for r in (5, 3) if r * vectors <= k.caps.vector_registers - 4))
  return True


def _pad_to(size: int, multiples: Sequence[int]) -> int | None:
  """The first of `multiples` that padding `size` to adds at most 1/16 of it, or 1/8 where none divides it."""
  share = 16 if any(size % m == 0 for m in multiples) else 8
  return next((m for m in multiples if (round_up(size, m) - size) * share <= size), None)


def plan_row_reduce(p: Plan) -> bool:
  """A reduce whose inputs are not contiguous along the output (rows of a row sum): vector accumulators along the row where it is
  contiguous, else independent scalar accumulators, one per row."""
  k, lane = p.k, p.lane
  if k.reduceop is None or lane is None or all(st[lane] in (0, 1) for st in p.strides): return False
  if not _row_lanes(k, p.strides):
    p.upcast(lane, 8, 4, 2)
    if k.n_reduce: p.first_valid(*(Opt(OptOps.UNROLL, k.n_reduce - 1, amt) for amt in (4, 2)))
  return True


def plan_column_sum(p: Plan) -> bool:
  """A column sum: each pass over the reduce reads a wide contiguous strip of every row into several vector accumulators."""
  if p.k.reduceop is None or p.lane is None: return False
  if p.vectorize: p.upcast(p.lane, 8 * p.simd, 4 * p.simd, 2 * p.simd, p.simd, 4)
  return True


def plan_transpose(p: Plan) -> bool:
  """A transpose (an input contiguous along another output dim than the lanes): a square tile, lanes by as many rows of that dim, so
  each input line is read in runs rather than one element of it per output vector. 8x8, for any dtype: a float32 1024^2 transpose
  2.2 ms untiled, 0.58 with 16x16, 0.38 with 8x8; 4096^2 61.7, 12.4, 10.4; int32 1024^2 1.65 -> 0.39, float16 2.19 -> 0.18.
  Where no tile splits that dim (a padded row of 34) and the vectors' gathered lines share too few L1 sets (rows 4 KiB apart), that
  dim's whole run inside a few lanes (see _transpose_runs): conv2d 4x32 at 32^2's NCHW -> padded NHWC copy 0.214 -> 0.028 ms."""
  if p.lane is None: return False
  # 4x4 where the values are computed, not copied (relu's gradient written channels last for the CNN step's 5x5 weight gradient, x and
  # the gradient both gathered: 8x8 4.9 ms, 4x4 2.7 on a Zen 4, at x86-64-v3 and natively alike)
  computed = any(u.op in ALU and u.op is not Ops.CAST for u in p.k.ast.toposort)
  if (tile := _transpose_tile(p.k, p.lane, p.strides, (4,) if computed else (8, 4))) is not None:
    p.upcast(p.lane, tile[1])
    p.upcast(tile[0], tile[1])
  elif (runs := _transpose_runs(p.k, p.lane, p.strides)) is not None:
    p.first_valid(Opt(OptOps.SWAP, runs[0], p.lane))
    p.upcast(p.lane, runs[1])
  else: return False
  return True


def plan_elementwise(p: Plan) -> bool:
  """Anything else: vectors along the lane dim; where it is too short for one (a pool's 2x2 windows laid out last), the short trailing
  dims unrolled whole, up to 16 values, not looped over two at a time: the CNN step's batchnorm into its pool's windows
  (128x32x10x10x2x2) 3.96 -> 1.89 ms on x86-64-v3 (one thread's CPU time)."""
  k = p.k
  if p.vectorize and p.lane is not None: p.upcast(p.lane, 2 * p.simd, p.simd, 8, 4)
  if k.upcast_size() == 1 and p.lane is not None and k.sizes[p.lane] < 4:
    for d in (d for d in reversed(range(k.n_global)) if k.sizes[d] > 1):
      if k.upcast_size() * k.sizes[d] > 16: break
      p.upcast(d, k.sizes[d])
  return True


CPU_PLANNERS: tuple[Callable[[Plan], bool], ...] = (plan_stack, plan_full_reduce, plan_row_statistic, plan_dot, plan_register_tile,
                                                     plan_row_reduce, plan_column_sum, plan_transpose, plan_elementwise)


def _batched(p: Plan) -> list[int]:
  """A matmul's batch dims: every input varies along them."""
  k = p.k
  return [d for d in range(k.n_global) if d not in (p.tile_row, p.lane) and k.sizes[d] > 1 and all(st[d] for st in p.strides)]


def batch_outer(p: Plan) -> None:
  """Batch dims (every input varies along them) outermost, in order: each batch's operands stay in cache."""
  if p.tile_row is None: return
  k = p.k
  for i, d in enumerate(_batched(p)):
    if (at := k.global_order[i]) != d: p.first_valid(Opt(OptOps.SWAP, min(at, d), max(at, d)))


def threads(p: Plan) -> None:
  """The device's cores, where the kernel is long enough for them (THREAD_MIN_SECONDS); where B is packed, the rows last, so each core
  packs its own panels (linear 64x1024x1024 on AVX-512 with the rows split: 3x slower, each core copying every panel)."""
  _cores(p.k, sorted(p.k.global_order, key=lambda d: p.pack and d == p.tile_row))


def _cores(k: Kernel, order: Sequence[int]) -> None:
  """The device's cores along the first dim of `order` long enough for them, where the kernel is long enough (THREAD_MIN_SECONDS)."""
  if k.caps.threads > 1 and single_core_seconds(k) >= THREAD_MIN_SECONDS:
    _first_valid(k, *(Opt(OptOps.THREAD, d, k.caps.threads) for d in order if k.remaining(d).size >= k.caps.threads))


def column_panels(p: Plan) -> None:
  """Sweep a matmul's rows inside a column panel, which stays in cache (and is copied once, where B is packed); where all of B fits in
  half the target's L2 (512 KB of a Zen 4's 1 MB) and is not packed, the rows stay outer and each block of them serves every column
  tile from L1 (attention's P.V, 256 KB of V a head: 1.4-3% faster, but 1.2x slower than its packed panels)."""
  k, row, lane = p.k, p.tile_row, p.lane
  if row is not None and lane is not None and row < lane and not p.gathered and \
     (p.pack or k.sizes[lane] * prod(k.sizes[k.n_global:]) * k.ast.dtype.itemsize > k.caps.l2_bytes // 2):
    p.first_valid(Opt(OptOps.SWAP, row, lane))


def k_blocks(p: Plan) -> None:
  """K in blocks where a matmul's rows of A for one block would not stay in the last-level cache (KBLOCK_BYTES), or, for a reduce over
  several dims, where its inputs would not stay in the L2 (see below); a column sum larger
  than the caches in blocks of a few rows: each block sweeps whole rows (the thread's column strips in turn, their sums so far
  reloaded from the output) where one strip down every row steps a page at a time (4096^2: 4.5 -> 1.9 ms)."""
  k = p.k
  if p.tile_row is not None and not p.gathered and k.n_reduce == 1:
    rows, red = k.sizes[p.tile_row] * k.ast.dtype.itemsize, k.remaining(k.n_global).size
    if rows * red > KBLOCK_BYTES:
      p.first_valid(*(Opt(OptOps.KBLOCK, 0, b) for b in reversed(divisors(red)) if KBLOCK_MIN <= b <= KBLOCK_BYTES // rows))
  if p.tile_row is not None and not p.gathered and not p.pack and k.n_reduce > 1 and \
     all(st[k.n_global] or not any(st[k.n_global:]) for st in p.strides):
    # a reduce over several dims that every input is split along the first of (a convolution's weight gradient: batch x positions),
    # but for reads the reduce does not move (a bias added to the input: relu(x + b)'s gradient of the 3x3 64 -> 64 conv)
    # in blocks of that dim whose inputs stay in half the L2 while every register tile reads them: the 5x5 gradient of the CNN step
    # (32x32 channels, 128x20x20 terms, 16 MB read by each of 400 tiles) in blocks of 4 images: 2.9x on x86-64-v3, 1.1-1.2x native
    first, inner, inputs, most = k.remaining(k.n_global).size, prod(k.sizes[k.n_global + 1:]), sum(b.nbytes for b in k.bufs), k.caps.l2_bytes // 2
    if inputs > most:
      p.first_valid(*(Opt(OptOps.KBLOCK, 0, b) for b in reversed(divisors(first)[1:-1]) if b * inner >= KBLOCK_MIN and inputs * b <= first * most))
  if p.planner is plan_column_sum and k.reduceop is not None and k.n_reduce == 1 and \
     prod(k.reduceop.src[0].shape) * k.reduceop.src[0].dtype.itemsize > KBLOCK_BYTES:
    p.first_valid(*(Opt(OptOps.KBLOCK, 0, b) for b in (8, 4, 16)))


def streaming_stores(p: Plan) -> None:
  """A float32 output past the caches (STREAM_BYTES) stored around them, where its lanes are whole 64-byte lines: one AVX-512 vector,
  or two AVX2 ones (lowerer.half_lines) in an output past the L3 (STREAM_HALF_LINES_BYTES)."""
  k, lane = p.k, p.lane
  if k.ast.dtype == dtypes.float32 and p.simd in (8, 16) and lane is not None and \
     prod(k.out_shape) * 4 >= (STREAM_BYTES if p.simd == 16 else STREAM_HALF_LINES_BYTES) and \
     any(a.kind is AxisKind.UPCAST and a.dim == lane and a.stride == 1 and a.size % (CACHE_LINE // 4) == 0 for a in k.axes):
    p.first_valid(Opt(OptOps.STREAM, 0, 0))


def packed_panels(p: Plan) -> None:
  """B's panels copied contiguously (see PACK_MIN_ROWS_PER_LANE), where the loops leave B's a panel that the row loop reads again; K in the
  longest blocks that keep the panel within panel_bytes where it is longer (AVX-512's 32 columns by a K of 2048). Not in blocks that
  keep the panel in L1 (half of 32 KiB: K 256 for AVX2's 16 columns, 128 for AVX-512's 32): each block reloads and stores the whole
  output, past the L2 (process CPU time, 2 threads, load 10-15: x86-64-v3 1024^3 0.83-0.86x, 2048^3 0.80x, native 1024^3 0.81x)."""
  k, row = p.k, p.tile_row
  if not p.pack or row is None: return
  red, most = k.remaining(k.n_global).size, panel_bytes(k)
  for block in [0, *(b for b in reversed(divisors(red)) if KBLOCK_MIN <= b < red)]:
    t = k.copy()
    if block and not any(a.kind is AxisKind.KBLOCK for a in t.axes): _first_valid(t, Opt(OptOps.KBLOCK, 0, block))
    _first_valid(t, Opt(OptOps.PACK, 0, 0))
    if t.pack and any(tile.view.arg.strides[row] == 0 and tile.size * tile.view.dtype.itemsize <= most for tile in t.pack_tiles()):
      k.apply_opts(t.opts[len(k.opts):])
      return


def packed_blocks(p: Plan) -> None:
  """Where B's panels are packed in K blocks of PANEL_RUN_MAX or less, the rows outside the columns instead: in each K block (BLOCK_K
  at most) B's block of many column tiles is copied once (PACK 1) into block_bytes and stays in the L2 while each row tile passes
  it, the tile's rows of A in L1 for all of the block's columns, where each panel read all of A's rows for its K block again from L3
  in short runs; the cores and the column blocks as THREAD's parts. x86-64-v3 on Zen 4 (process CPU time, load 6-10), 2048^3: one
  thread 65 -> 85 GFLOPS, two 124 -> 157, as fast as a hand-written GotoBLAS loop nest (A packed too, 6x16 tiles) in the same
  process; 4096^3 one thread 49 -> 94; native (AVX-512) 4096^3 85 -> 96."""
  k, row, lane = p.k, p.tile_row, p.lane
  if not (k.pack and k.has(AxisKind.KBLOCK)) or row is None or lane is None or k.remaining(k.n_global).size > PANEL_RUN_MAX: return
  plan = [o for o in k.opts if o.op not in (OptOps.THREAD, OptOps.KBLOCK, OptOps.PACK) and o != Opt(OptOps.SWAP, row, lane)]
  red, tiles, threads = k.sizes[k.n_global], k.remaining(lane).size, k.caps.threads
  for block in (b for b in reversed(divisors(red)) if KBLOCK_MIN <= b <= BLOCK_K):
    for parts in (n for n in range(threads, 4 * threads + 1, threads) if tiles % n == 0):
      t = Kernel(k.ast, k.caps)
      try: t.apply_opts([*plan, Opt(OptOps.THREAD, lane, parts), Opt(OptOps.KBLOCK, 0, block), Opt(OptOps.PACK, 0, 1)])
      except KernelOptError: continue
      if all(tile.size * tile.view.dtype.itemsize <= block_bytes(k) for tile in t.pack_tiles()):
        p.k = t
        return


CPU_TAIL: tuple[Callable[[Plan], None], ...] = (batch_outer, threads, column_panels, k_blocks, streaming_stores, packed_panels, packed_blocks)


def attention_opts(kernel: Kernel) -> list[Opt]:
  """Attention in one kernel (see lower.attention): the keys in blocks of the SIMD width (a vector of scores on a CPU), else 8, 4 or 2
  (one rescale a block); on a CPU the rows across its cores where it is long enough for them. On a GPU attention in tiles
  (lower.flash.flash_attention): tiles of 32 keys, 8 threads a row, 4 rows a thread and 64 a workgroup (48 KiB of shared memory at a head dim
  of 64; 128 threads of 32 scores and 32 outputs each), smaller where the sizes do not divide."""
  k, rows = kernel.copy(), kernel.n_global - 1
  if k.caps.has_local:
    _first_valid(k, *(Opt(OptOps.STAGE, 0, t) for t in (32, 16, 8, 4)))
    if k.opts:
      for op, axis, args in ((OptOps.GROUP, 0, (8, 4, 2)), (OptOps.UPCAST, rows, (4, 2)), (OptOps.LOCAL, rows, (16, 8, 4, 2))):
        _first_valid(k, *(Opt(op, axis, a) for a in args))
      return k.opts
  _first_valid(k, *(Opt(OptOps.UNROLL, 0, u) for u in (k.caps.simd_width, 8, 4, 2) if u > 1))
  if k.caps.has_local: _first_valid(k, *(Opt(OptOps.LOCAL, rows, n) for n in (128, 64, 32, 16, 8, 4, 2)))
  else: _cores(k, k.global_order)
  return k.opts


def hand_coded_optimizations(kernel: Kernel) -> list[Opt]:
  """The first of CPU_PLANNERS that takes the kernel, then each step of CPU_TAIL (devices with workgroups: workgroup_optimizations);
  attention in one kernel: attention_opts."""
  if kernel.attention is not None: return attention_opts(kernel)
  if kernel.caps.has_local: return workgroup_optimizations(kernel)
  p = Plan.of(kernel.copy())
  p.planner = next(planner for planner in CPU_PLANNERS if planner(p))
  for step in CPU_TAIL: step(p)
  return p.k.opts


def _packs_b(k: Kernel, row: int | None, lane: int | None) -> bool:
  """Whether a matmul's B is to be copied into panels (PACK): a float32 B read straight from memory (see Kernel.pack_tiles), with at
  least PACK_MIN_ROWS_PER_LANE rows of A per vector lane to read each panel (a gathered B more, see PACK_GATHERED_ROWS_PER_LANE), and
  a panel of the widest tile (4 vectors) within panel_bytes, K blocked if need be."""
  if row is None or lane is None or k.caps.has_local or k.sizes[row] < PACK_MIN_ROWS_PER_LANE * k.caps.simd_width or k.n_reduce != 1:
    return False
  if any(abs(st[lane]) >= GATHER_STRIDE for st in input_strides(k)) and k.sizes[row] < PACK_GATHERED_ROWS_PER_LANE * k.caps.simd_width:
    return False
  red, step, most = k.sizes[-1], 4 * k.caps.simd_width * 4, panel_bytes(k)  # a K step's bytes
  if red * step > most and (k.kblock_problem() or not any(KBLOCK_MIN <= b < red and b * step <= most for b in divisors(red))):
    return False
  t = k.copy()
  if row < lane: _first_valid(t, Opt(OptOps.SWAP, row, lane))
  return any(tile.view.arg.strides[row] == 0 for tile in t.pack_tiles())


def panel_bytes(k: Kernel) -> int:
  """The most a packed panel of B may hold: half the target's L2, where it stays while every row tile reads it beside their rows of A
  (a core's L2 as sysfs or getconf gives it, see runtime.cpu.cache_sizes), and no more than PACK_BYTES, the copy's array on the stack."""
  return min(PACK_BYTES, k.caps.l2_bytes // 2)


def block_bytes(k: Kernel) -> int:
  """The most a packed block of B (PACK 1) may hold: half the target's L2 (see panel_bytes), and no more than PACK_BLOCK_BYTES."""
  return min(PACK_BLOCK_BYTES, k.caps.l2_bytes // 2)


def _half_inputs(k: Kernel) -> bool:
  """True if the reduce reads a 16-bit float buffer."""
  return k.reduceop is not None and any(u.op is Ops.VIEW and u.dtype.is_half for u in k.reduceop.src[0].toposort)


def _row_lanes(k: Kernel, strides: list[list[int]], simd: int = 0) -> bool:
  """For a reduce whose last axis is contiguous in memory (a row sum or max, softmax's and layernorm's row passes): that axis as
  SIMD lanes of a few independent vector accumulators (padded to whole vectors), so each row is read with vector loads and no add
  waits on the one before; the lanes combine once per row. Other dtypes than float32 get one vector's worth of scalar accumulators,
  which the C compiler vectorizes (int32 sums and maxes of 1024x1024: 43 us, 58 with a scalar accumulator per row). False where
  that does not fit. `simd` narrows the vectors."""
  assert k.reduceop is not None
  simd, axis = simd or k.caps.simd_width, k.n_reduce - 1
  if not k.n_reduce: return False
  red = k.n_global + axis
  if not any(st[red] == 1 for st in strides) or any(st[red] not in (0, 1) for st in strides): return False
  if k.sizes[red] < 2 * simd: return False
  if k.sizes[red] % simd:  # padded to whole vectors for as many accumulators as leave two iterations without padding (see Lowerer.split)
    _first_valid(k, Opt(OptOps.PADTO, red, next(amt for amt in (4 * simd, 2 * simd, simd) if k.sizes[red] // amt >= 2)))
  before = len(k.opts)
  _first_valid(k, *(Opt(OptOps.LANES, axis, amt) for amt in ((4 * simd, 2 * simd, simd) if k.reduceop.dtype == dtypes.float32 else (simd,))))
  return len(k.opts) > before


def lane_dim(k: Kernel) -> int | None:
  """The output dim that carries the SIMD lanes: the last one longer than 1 (the renderer vectorizes it)."""
  return next((d for d in reversed(range(k.n_global)) if k.sizes[d] > 1), None)


STACK_MAX = 8  # the most rows of a cat or stack that a kernel computes at once


def stacked_dims(k: Kernel) -> list[tuple[int, int]]:
  """(dim, f) for the output dims whose index mod f (f small) a mask over computed values tests, as a stack of f rows does (Winograd's
  transforms): an UPCAST of dim by f makes each row's place known when the kernel is built, so the other rows' terms fold away."""
  dims = tuple(UOp.var(f"d{i}", 0, max(s - 1, 0)) for i, s in enumerate(k.out_shape))
  found: dict[int, int] = {}
  seen: set[tuple[UOp, tuple[UOp, ...]]] = set()
  def walk(u: UOp, idx: tuple[UOp, ...]) -> None:
    if (u, idx) in seen or u.op is Ops.BUFFER: return
    seen.add((u, idx))
    if u.op is Ops.VIEW:
      off, valid = u.arg.index(idx)
      if u.arg.mask is not None and u.src[0].op is not Ops.BUFFER:
        for x in simplify(valid).toposort:
          if x.op is Ops.VAR and x in dims and k.out_shape[d := dims.index(x)] <= STACK_MAX: found[d] = k.out_shape[d]
          if x.op is Ops.MOD and x.src[0] in dims and x.src[1].op is Ops.CONST and x.src[1].arg <= STACK_MAX:
            found.setdefault(dims.index(x.src[0]), x.src[1].arg)
      off, src = simplify(off), u.src[0]
      return walk(src, split_offset(off, src.shape))
    for s in u.src: walk(s, idx)
  walk(k.ast, dims)
  return sorted(found.items())


def _transpose_tile(k: Kernel, lane: int, strides: list[list[int]], widths: tuple[int, ...] = (8, 4)) -> tuple[int, int] | None:
  """For a kernel with no reduce (the heuristic asks no other): (dim, width) where an input gathered along the lane dim is contiguous
  along that other output dim, and width (the first of `widths`) splits both."""
  return next(((d, w) for st in strides if abs(st[lane]) >= GATHER_STRIDE for d in range(k.n_global) if d != lane and st[d] == 1
               for w in widths if k.sizes[lane] % w == 0 and k.sizes[d] % w == 0), None)


def l1_lines(k: Kernel, stride: int) -> int:
  """How many cache lines `stride` bytes apart one core's L1 holds: x86 and ARM L1s pick the set by the address bits below 4 KiB, so lines
  a multiple of 4 KiB apart share one set of l1_bytes / 4 KiB ways (8 on a Zen 4's 32 KiB)."""
  return max(1, k.caps.l1_bytes // L1_SET_SPAN) * min(L1_SET_SPAN // CACHE_LINE, L1_SET_SPAN // gcd(stride, L1_SET_SPAN))


def _transpose_runs(k: Kernel, lane: int, strides: list[list[int]]) -> tuple[int, int] | None:
  """For a transpose that no tile splits: (dim, lanes) where the default's vectors (2 x SIMD lanes, each gathered from its own line)
  would not stay in L1 together but `lanes` of them and a run of that contiguous dim's output lines would (half of L1's lines at
  their strides each): the run's loads are contiguous, and each line is read whole before the next."""
  item, wide = k.ast.dtype.itemsize, 2 * k.caps.simd_width
  for st in strides:
    if abs(st[lane]) < GATHER_STRIDE or l1_lines(k, abs(st[lane]) * item) >= wide: continue
    for d in range(k.n_global):
      out_stride = prod(k.sizes[d + 1:k.n_global]) * item
      if d == lane or st[d] != 1 or k.sizes[d] == 1 or 2 * k.sizes[d] > l1_lines(k, out_stride): continue
      if (w := next((w for w in (8, 4) if k.sizes[lane] % w == 0 and 2 * w <= l1_lines(k, abs(st[lane]) * item)), None)): return d, w
  return None


def _tile_row(k: Kernel, lane: int | None, strides: list[list[int]]) -> int | None:
  """For a kernel that sums products (A @ B in any guise: batched, broadcast, conv as implicit GEMM), the output dim to tile
  alongside the lane dim: one input is constant along the lane dim but not this one (A's rows), another the other way (B)."""
  if k.reduceop is None or k.reduceop.arg[0] is not Ops.ADD or lane is None or not any(u.op is Ops.MUL for u in k.reduceop.src[0].toposort):
    return None
  def crosses(row: int) -> bool:
    return any(st[lane] == 0 and st[row] != 0 for st in strides) and any(st[row] == 0 and st[lane] != 0 for st in strides)
  return next((d for d in reversed(range(k.n_global)) if d != lane and k.sizes[d] > 1 and crosses(d)), None)


def _broadcasts_along(k: Kernel, lane: int, row: int) -> bool:
  """True if the reduce reads one input that is constant along the lane dim but not the row dim (A in A@B), and one the other way."""
  assert k.reduceop is not None
  src = k.reduceop.src[0]
  if max(lane, row) >= len(src.shape): return False  # the output was reshaped to more dims than the reduce has: no tile
  strides = [u.arg.strides for u in src.toposort if u.op is Ops.VIEW and u.src[0].op is Ops.BUFFER and len(u.arg.shape) == len(src.shape)]
  return any(st[lane] == 0 and st[row] != 0 for st in strides) and any(st[row] == 0 and st[lane] != 0 for st in strides)


BIG_TILE_OUTPUTS = 1 << 22  # from 2048x2048 outputs there are enough 256x64 tiles to fill a big GPU
GROUP_MAX_OUTPUTS = 1 << 15  # with fewer outputs than this, a GPU has idle threads unless a reduce is shared by a workgroup


# matmul 4096^3 float16 on an H200 (bench/results/nvidia-h200-2026-11-27-1608.md): mma.sync fed by ldmatrix from swizzled K tiles of
# 32 in shared memory, filled by cp.async in 2 stages, 326 TFLOPS; the wmma API from global memory (the plan below it) 106
PIPELINED_TC = (Opt(OptOps.STAGE, 0, 2), Opt(OptOps.PIPELINE, 0, 2))


def gpu_tensor_cores(k: Kernel) -> bool:
  """A matmul the device's matrix units take: each warp a 64x64 tile of 16x16 tensor core tiles, 2x2 warps a workgroup; on CUDA sm_80+
  mma.sync from K tiles in shared memory filled by cp.async (PIPELINED_TC), else the wmma API (or the AMD's matrix instructions)."""
  if not k.caps.tensor_cores: return False
  try: tc = find_tensor_core(k)
  except KernelOptError: return False
  tiles = (Opt(OptOps.UPCAST, tc.row, 4), Opt(OptOps.UPCAST, tc.col, 4), Opt(OptOps.LOCAL, tc.row, 2), Opt(OptOps.LOCAL, tc.col, 2))
  if k.caps.async_copy:
    try:
      t = k.copy()
      t.apply_opt(Opt(OptOps.TC, 0, 1))
      for opt in tiles: _first_valid(t, opt)
      t.apply_opts(PIPELINED_TC)
      k.apply_opts(t.opts)
      return True
    except KernelOptError: pass
  k.apply_opt(Opt(OptOps.TC, 0, 0))
  for opt in (*tiles, Opt(OptOps.UNROLL, 0, 2)): _first_valid(k, opt)
  return True


# the register tiles gpu_register_tile tries (outputs a thread computes along the lane dim and the row dim), biggest first
REGISTER_TILES = ((4, 4), (4, 2), (2, 2), (2, 1), (1, 1))


def gpu_register_tile(k: Kernel) -> bool:
  """A matmul-like kernel: a 4x4 register tile in a 16x16 workgroup, or the biggest smaller tile whose workgroups, times the split-K
  shares the reduce allows (split_room), reach the SMs: the MLP's 128x128 layer over K=784 ran 8 workgroups of 4x4 tiles on an H200's
  132 SMs, 71.6 us, each thread's long K loop waiting on its loads. Unmeasured on a GPU so far."""
  lane = k.n_global - 1
  if k.reduceop is None or (row := next((d for d in reversed(range(lane)) if _broadcasts_along(k, lane, d)), None)) is None: return False
  room = split_room(k)
  for tile in REGISTER_TILES:
    t = k.copy()
    for d, most in zip((lane, row), tile): _first_valid(t, *(Opt(OptOps.UPCAST, d, amt) for amt in (4, 2) if amt <= most))
    for d in (lane, row): _first_valid(t, *(Opt(OptOps.LOCAL, d, amt) for amt in (16, 8, 4, 2)))
    if t.launch_dims[0] * room >= k.caps.sms: break
  k.apply_opts(t.opts[len(k.opts):])
  _first_valid(k, Opt(OptOps.UNROLL, k.n_reduce - 1, 4))
  if prod(k.out_shape) >= BIG_TILE_OUTPUTS: _first_valid(k, Opt(OptOps.UPCAST, row, 4))  # 16x4 per thread: found by BEAM on an H100
  return True


# a big float32 matmul's workgroup tile, as the classic SGEMM on CUDA cores: 128x128 outputs, 16x16 threads each computing 8x8 (two
# float4 columns 64 apart along each output dim, so a warp's 16-byte reads of a tile row are contiguous), K in tiles of 16 through
# shared memory. On sm_90 (nvcc -Xptxas -v, 4096^3): 103 registers, no spills, 16640 bytes of shared memory, so two workgroups fit
# an SM by registers (65536 / (256 x 103)); each K step reads 4 float4 from shared memory for 64 FMAs. Unmeasured on a GPU so far
SHARED_TILE = ((4, 16, 2), (16, 8, 4))  # per output dim: register part, workgroup part, outer register part; K tiles, the first that fits
SHARED_TILE_OUTPUTS = BIG_TILE_OUTPUTS  # from 2048x2048 outputs: 256 tiles of 128x128, two workgroups for each of an H200's 132 SMs


def gpu_shared_tile(k: Kernel) -> bool:
  """A large float32 matmul-like kernel on a GPU: both inputs' tiles staged in shared memory per K tile (STAGE), 8x8 register tiles
  read from there in float4 (SHARED_TILE), 128x128 a workgroup, or 128x64 where the lane dim is 64. Sizes that are not multiples of
  the tiles are padded where that adds at most 1/8 (masked), K to the longest K tile that allows. Where the tile does not apply,
  nothing is applied and gpu_register_tile plans the kernel. Not on a CPU that runs workgroups (pocl): its barriers and shared
  memory cost, and save nothing (256^3 125x slower than the register tile from memory)."""
  lane = k.n_global - 1
  if not k.caps.gpu or k.reduceop is None or k.ast.dtype != dtypes.float32 or k.n_reduce != 1 or prod(k.out_shape) < SHARED_TILE_OUTPUTS or \
     any(u.op is Ops.VIEW and u.src[0].op is Ops.BUFFER and u.dtype != dtypes.float32 for u in k.reduceop.src[0].toposort) or \
     (row := next((d for d in reversed(range(lane)) if _broadcasts_along(k, lane, d)), None)) is None: return False
  (inner, local, outer), ktiles = SHARED_TILE
  red = k.n_global
  def waste(size: int, m: int) -> int: return (round_up(size, m) - size) * 8
  ktile = next((m for m in ktiles if waste(k.sizes[red], m) <= k.sizes[red]), ktiles[0])
  def tile(lanes: int) -> Kernel | None:
    """The kernel with the tile of `lanes` threads along the lane dim (local along the row dim), or None where it does not fit."""
    t = k.copy()
    try:
      for d, m in ((lane, inner * lanes * outer), (row, inner * local * outer), (red, ktile)):
        if t.sizes[d] % m and waste(t.sizes[d], m) <= t.sizes[d]: t.apply_opt(Opt(OptOps.PADTO, d, m))
      return t.apply_opts([Opt(OptOps.UPCAST, lane, inner), Opt(OptOps.UPCAST, row, inner), Opt(OptOps.LOCAL, lane, lanes),
                           Opt(OptOps.LOCAL, row, local), Opt(OptOps.UPCAST, lane, outer), Opt(OptOps.UPCAST, row, outer),
                           Opt(OptOps.STAGE, 0, ktile)])
    except KernelOptError: return None
  # 128x128 tiles; 128x64 (half the threads along the lanes, the same 8x8 a thread) where the lane dim is 64 (Winograd's GEMMs over
  # 64 output channels, attention's P.V with a head of 64), which read their rows from memory at 0.12 of each sector otherwise
  if (t := tile(local) or tile(local // 2)) is None: return False
  k.apply_opts(t.opts)
  _first_valid(k, Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UNROLL, 0, 2))  # 8x8 by 4 is the most registers the caps allow (max_upcast)
  if k.caps.async_copy: _first_valid(k, Opt(OptOps.PIPELINE, 0, 2))  # cp.async in 2 stages: 46.1 TFLOPS from 42.2 at 4096^3 on an H200
  return True


# threads that keep a big GPU busy: 132 SMs (H100, H200) x 1024, each with a 16-byte load in flight (about 2 MiB, what 4.8 TB/s over
# ~0.5 us of memory latency needs); a planner that can give each thread more work keeps at least this many threads
GPU_THREADS = 1 << 17
WARP = 32
WORKGROUP_MIN = 128  # threads a workgroup should have: an SM holds at most 32 workgroups, so 2-thread ones leave it 97% idle


def _largest(n: int, most: int) -> int:
  """The largest divisor of n that is at most `most` (1 where n or `most` is below 2)."""
  return max(d for d in divisors(n) if d <= max(most, 1)) if n > 0 else 1


def _fill_workgroup(k: Kernel, lane: int, least: int = WORKGROUP_MIN, most: int = 256) -> None:
  """Threads along the lane dim (as many as divide it, up to `most`), then along the dims outside it until the workgroup has `least`:
  neighbouring threads read neighbouring elements, and an SM's few workgroups still hold enough threads."""
  for d in [lane, *reversed(range(lane))]:
    if (have := k.launch_dims[1]) >= least: return
    if (amt := _largest(k.remaining(d).size, most // have)) > 1: _first_valid(k, Opt(OptOps.LOCAL, d, amt))


def gpu_conv(k: Kernel) -> bool:
  """A convolution (products summed over channels and the window) with enough outputs to fill the GPU: an implicit GEMM whose
  threads run along the output positions (a warp's loads one line of each input row, its weight loads one broadcast value), each
  thread a few positions a warp apart by a few output channels in registers: every input value loaded serves that many channels
  and every weight that many positions, while at least GPU_THREADS threads remain."""
  lane = lane_dim(k)
  if k.reduceop is None or k.n_reduce < 2 or lane is None: return False
  strides = input_strides(k)
  if (row := _tile_row(k, lane, strides)) is None or prod(k.out_shape) < GPU_THREADS: return False
  tile = prod(k.out_shape) // GPU_THREADS  # outputs a thread may compute with GPU_THREADS threads left
  _first_valid(k, *(Opt(OptOps.LOCAL, lane, amt) for amt in (WARP, 16, 8)))
  _first_valid(k, *(Opt(OptOps.UPCAST, lane, amt) for amt in (4, 2) if amt <= tile))
  _first_valid(k, *(Opt(OptOps.UPCAST, row, amt) for amt in (8, 4, 2) if amt * k.upcast_size() <= tile))
  _first_valid(k, Opt(OptOps.LOCAL, row, 2))  # a warp's neighbour reads the same inputs (from L1)
  _fill_workgroup(k, lane, least=64)
  if (window := k.remaining(len(k.sizes) - 1).size) <= 4: _first_valid(k, Opt(OptOps.UNROLL, k.n_reduce - 1, window))
  return True


def gpu_column_reduce(k: Kernel) -> bool:
  """A reduce that reads across rows (a column sum: contiguous along an output dim, not along the reduce): threads along the kept
  dim with 16-byte loads (8 of them read one 128-byte line of a row), each looping down its column; where those threads are fewer
  than GPU_THREADS the rows are shared by a workgroup's GROUP of them, each group a share of the rows, the partials added at the end."""
  lane = lane_dim(k)
  if k.reduceop is None or not k.n_reduce or lane is None: return False
  red, strides = len(k.sizes) - 1, input_strides(k)
  if any(st[red] == 1 for st in strides) or not any(st[lane] == 1 for st in strides): return False
  if k.ast.dtype == dtypes.float32: _first_valid(k, Opt(OptOps.UPCAST, lane, 4))
  _first_valid(k, *(Opt(OptOps.LOCAL, lane, amt) for amt in (8, 4, 2)))
  columns = prod(k.out_shape) // k.upcast_size()  # threads along the kept dims
  rows = k.sizes[red]
  want = next((g for g in (256, 128, 64, 32, 16, 8, 4, 2) if g * columns <= GPU_THREADS and rows // g >= 8), 1)
  _first_valid(k, *(Opt(OptOps.GROUP, k.n_reduce - 1, g) for g in (256, 128, 64, 32, 16, 8, 4, 2) if g <= want))
  _fill_workgroup(k, lane, least=64)
  _first_valid(k, Opt(OptOps.UNROLL, k.n_reduce - 1, 4))  # loads in flight
  return True


ROW_THREADS = 256  # threads that share a row written after its statistic: 8192 floats, 32 a thread


def gpu_row_statistic(k: Kernel) -> bool:
  """A row written after its statistics (softmax's max and sum, layernorm's mean and variance: Kernel.row_dims), one kernel: a
  workgroup per row (or rows, to fill it), the row's threads each adding every ROW_THREADS-th element of it to its partials (their
  loads side by side), the group's totals shared with all of them (lower.group_sum), then each writing its share of the row, in
  16-byte stores where the row allows. The loops after the first read the row again from L1 or L2 (32 KiB for 8192 floats): the
  input passes through memory once where it had three kernels, each reading it."""
  if not k.row_dims or k.n_reduce != 1 or (lane := lane_dim(k)) is None or lane not in k.row_dims: return False
  size, red = k.sizes[-1], k.n_reduce - 1
  threads = max(g for g in divisors(size) if g <= min(ROW_THREADS, max(size // 4, 1)))
  if threads > 1: _first_valid(k, Opt(OptOps.GROUP, red, threads))
  if k.ast.dtype == dtypes.float32 and k.sizes[lane] % (4 * threads) == 0: _first_valid(k, Opt(OptOps.UPCAST, lane, 4))
  if threads > 1: _first_valid(k, Opt(OptOps.LOCAL, lane, _largest(k.remaining(lane).size, threads)))
  for d in reversed(sorted(set(range(k.n_global)) - k.row_dims)):  # rows a workgroup, to WORKGROUP_MIN threads
    if (have := k.launch_dims[1]) < WORKGROUP_MIN and (amt := _largest(k.remaining(d).size, WORKGROUP_MIN // have)) > 1:
      _first_valid(k, Opt(OptOps.LOCAL, d, amt))
  _first_valid(k, Opt(OptOps.UNROLL, red, 4))  # loads in flight
  return True


def gpu_workgroups(k: Kernel) -> bool:
  """Anything else. A reduce along a contiguous axis with few outputs: a workgroup shares it; with many (attention's row max over
  64Ki rows), a group of about the square root of its length shares each row (each thread's loads against the partials one thread
  adds at the end). Elementwise kernels: a transpose (an input contiguous along another dim than the output) in workgroups of 8
  columns by 32 rows, so a warp writes 4 rows of 32 bytes and reads 8 columns of 16; else 16-byte accesses along the contiguous dim
  where every row starts 16-byte aligned (a row of 58 floats does not: 4 scalar accesses a thread would touch 4 times the sectors a
  warp access), and workgroups along it and the dims outside it."""
  n, lane = k.n_global, lane_dim(k)
  if k.reduceop is not None and k.n_reduce and prod(k.out_shape) < GROUP_MAX_OUTPUTS:
    _first_valid(k, *(Opt(OptOps.GROUP, k.n_reduce - 1, amt) for amt in (256, 128, 64, 32, 16, 8, 4)))
    if n: _first_valid(k, *(Opt(OptOps.LOCAL, n - 1, amt) for amt in (256, 128, 64, 32, 16, 8, 4, 2)))
    return True
  if lane is None: return True
  strides = input_strides(k)
  if k.reduceop is not None and k.n_reduce:
    size = k.sizes[-1]
    _first_valid(k, *(Opt(OptOps.GROUP, k.n_reduce - 1, g) for g in (256, 128, 64, 32, 16, 8, 4) if g * g <= size))
  elif (tile := _transpose_tile(k, lane, strides)) is not None:
    _first_valid(k, Opt(OptOps.LOCAL, lane, tile[1]))
    _first_valid(k, Opt(OptOps.LOCAL, tile[0], _largest(k.sizes[tile[0]], WARP)))
  elif k.ast.dtype == dtypes.float32 and all(st[d] % 4 == 0 for st in strides if st[lane] for d in range(n) if d != lane):
    _first_valid(k, Opt(OptOps.UPCAST, lane, 4))  # 16-byte accesses
  _fill_workgroup(k, lane)
  return True


# split-K: a matmul-like GPU kernel whose default plan launches fewer workgroups than the GPU has SMs leaves SMs idle; K is cut into
# shares, a workgroup's each, until the threads reach SM_THREADS a multiprocessor, down to SPLIT_MIN_K (shorter shares spend more on
# writing and re-reading their partial sums than they gain). On an H200 (bench/results/nvidia-h200-2026-11-27-1608.md): a linear layer
# of 16 rows (64 workgroups) 0.32 ms in 16 shares, 0.42 in 4, 1.26 unsplit; matmul 256x256x65536 (16 workgroups) 1.6 ms in 16 shares,
# 24.9 unsplit; with as many workgroups as SMs or more, splitting lost: bmm 32x512^3 (512 workgroups) 0.249 ms in 2 shares, 0.219
# unsplit, attention's P.V at 4x16x1024x64 (256) 0.80 in 4, 0.78 unsplit
SM_THREADS, SPLIT_MIN_K, SPLIT_MAX = 1024, 256, 16


def gpu_split_k(k: Kernel) -> int:
  """Into how many shares a kernel's reduce is split across workgroups (split-K; 1: not split): on a GPU (caps with its SM count), a
  matmul-like kernel over one long reduce axis whose default plan launches fewer workgroups than SMs, the fewest shares (a power of
  two) that reach SMs x SM_THREADS threads, each at least SPLIT_MIN_K long. SPLITK=0 never splits, SPLITK=N splits any one-axis sum or max
  into N shares (where N divides it) on any device with workgroups. The schedule runs the shares as one kernel that writes each
  share's partial results and a second that combines them in order (schedule.split_k): the same result every run, where atomic adds
  into the output would add in any order (and OpenCL 1.2 has no float atomics)."""
  if (forced := SPLITK.value) == 0 or not k.caps.has_local or not _one_reduce(k): return 1
  if forced > 0: return forced if forced > 1 and k.sizes[-1] % forced == 0 else 1
  if (room := split_room(k)) == 1: return 1
  groups, threads = k.copy().apply_opts(workgroup_optimizations(k)).launch_dims
  if groups >= k.caps.sms: return 1
  shares = 1
  while groups * threads * shares < k.caps.sms * SM_THREADS and 2 * shares <= room: shares *= 2
  return shares


def _one_reduce(k: Kernel) -> bool:
  return k.reduceop is not None and len(k.reduceops) == 1 and k.n_reduce == 1 and k.reduceop.arg[0] in (Ops.ADD, Ops.MAX)


def split_room(k: Kernel) -> int:
  """The most shares gpu_split_k may cut a kernel's reduce into by default (a power of two up to SPLIT_MAX, each share at least
  SPLIT_MIN_K long; 1 where the kernel is not a matmul-like one on a GPU, or SPLITK is set)."""
  if SPLITK.value >= 0 or not k.caps.gpu or not k.caps.sms or not _one_reduce(k) or _tile_row(k, lane_dim(k), input_strides(k)) is None: return 1
  length, room = k.sizes[-1], 1
  while 2 * room <= SPLIT_MAX and length % (2 * room) == 0 and length // (2 * room) >= SPLIT_MIN_K: room *= 2
  return room


GPU_PLANNERS: tuple[Callable[[Kernel], bool], ...] = (gpu_row_statistic, gpu_tensor_cores, gpu_shared_tile, gpu_conv, gpu_register_tile,
                                                     gpu_column_reduce, gpu_workgroups)


def workgroup_optimizations(kernel: Kernel, planners: Sequence[Callable[[Kernel], bool]] = GPU_PLANNERS) -> list[Opt]:
  """Devices with workgroups: a cat's rows upcast as on the CPU, then the first of `planners` that takes the kernel."""
  k = kernel.copy()
  for d, f in stacked_dims(k) if k.reduceop is None else (): _first_valid(k, Opt(OptOps.UPCAST, d, f))
  next(planner for planner in planners if planner(k))
  return k.opts


# planners with plans no GPU has timed yet against the planner after them: gpu_shared_tile's 128x64 tile (64-column kernels; its
# 128x128 one measured 42-46 TFLOPS at 4096^3 on an H200 against the register tile's 25)
UNMEASURED_PLANNERS = (gpu_shared_tile,)


def alternative_opts(kernel: Kernel) -> list[list[Opt]]:
  """Opts other than the default that a search tries first as well: where the default comes from a planner no GPU has measured
  yet, the plan the next planner would give (the register tile read straight from memory, for gpu_shared_tile), so BEAM keeps
  the faster of the two and the GPU suite times both."""
  if NOOPT or not kernel.caps.has_local or not any(planner(kernel.copy()) for planner in UNMEASURED_PLANNERS): return []
  return [workgroup_optimizations(kernel, tuple(p for p in GPU_PLANNERS if p not in UNMEASURED_PLANNERS))]


def default_opts(kernel: Kernel) -> list[Opt]:
  """The opts a kernel runs with when the tuning cache has none: the heuristics, or none at all under NOOPT."""
  return [] if NOOPT else hand_coded_optimizations(kernel)
