"""A kernel: the fused AST of one output, its axes, and the opts that rewrite them."""
from __future__ import annotations

import copy
import functools
import hashlib
from dataclasses import dataclass, replace
from enum import Enum
from functools import cached_property
from typing import Callable, NamedTuple, Protocol, Sequence

from tinytune.codegen.caps import DeviceCaps
from tinytune.codegen.opts import KernelOptError, Opt, OptOps, check
from tinytune.dtype import DType, dtypes
from tinytune.helpers import divisors, prod, round_up
from tinytune.shape import split_offset, strides_for
from tinytune.uop import ALU, Ops, UOp, simplify

__all__ = ["Kernel", "KernelOptError", "AxisKind", "Axis", "candidate_opts", "input_strides"]


class AxisKind(Enum):
  GLOBAL = "g"; THREAD = "t"; LOCAL = "l"; UPCAST = "u"; REDUCE = "r"; UNROLL = "ur"; LANES = "v"; GROUP = "gr"; TC = "tc"  # noqa: E702
  KBLOCK = "kb"; STAGE = "st"  # noqa: E702


LOOPS = (AxisKind.GLOBAL, AxisKind.REDUCE)


@dataclass(frozen=True)
class TensorCore:
  """A matmul on the matrix units. On a GPU each warp computes 16x16 output tiles of C = A @ B from 16x16 tiles of A and B (float16
  or bfloat16), adding in float32. On a CPU with bfloat16 dot products (AVX512_BF16) each instruction adds a pair of products along K
  into every float32 lane: a pair of A's elements times the pair of B's in that lane's column. `a` and `b` are the views of A and B; a
  layout is "row_major" where the tile's rows are contiguous. On a GPU, `mma` (TC's arg 1) issues PTX mma.sync.m16n8k16 from registers
  each lane loads itself in place of the wmma API's fragments."""
  row: int  # the output dim of A's rows (M)
  col: int  # the output dim of B's columns (N)
  a: UOp
  b: UOp
  a_layout: str
  b_layout: str
  a_ld: int  # elements between the tile's rows (row major) or columns (column major)
  b_ld: int
  mma: bool = False
  wgmma: bool = False  # TC's arg 2: a warpgroup's PTX wgmma.m64n16k16 from staged tiles in shared memory, through matrix descriptors


TC_SIZE = 16  # wmma's m16n16k16 shape for float16 and bfloat16
WARPGROUP_ROWS = 64  # wgmma's m64: a warpgroup's 4 warps, 16 rows each
TC_PAIR = 2  # the CPU's: products along K that one dot-product instruction adds into a lane


def find_tensor_core(k: Kernel) -> TensorCore:
  """The tensor core mapping of a fresh kernel that is a float16 or bfloat16 matmul (a sum over one axis of A * B, each read straight from
  memory), or KernelOptError saying why not."""
  check(not k.opts, "TC comes first, before any other opt")
  check(bool(k.caps.tensor_cores), k.caps.no_tc or "TC needs a device with tensor cores")
  red = k.reduceop
  check(red is not None and red.arg[0] is Ops.ADD and k.n_reduce == 1 and len(k.reduceops) == 1, "TC needs a kernel that sums over one axis")
  assert red is not None
  src = red.src[0]
  check(src.shape[:k.n_global] == tuple(k.out_shape) and red.arg[1] == (k.n_global,), "TC needs the sum's axis last, after the output's")
  views = [u for u in src.toposort if u.op is Ops.VIEW]
  check(all(u.op in (Ops.VIEW, Ops.BUFFER, Ops.MUL, Ops.CAST) for u in src.toposort) and len(views) == 2, "TC needs a product of two inputs")
  check(all(v.src[0].op is Ops.BUFFER and v.arg.mask is None for v in views), "TC needs inputs read straight from memory")
  check(views[0].dtype == views[1].dtype and views[0].dtype.name in k.caps.tensor_cores, f"TC needs {' or '.join(k.caps.tensor_cores)} inputs")
  check(any(u.op is Ops.MUL for u in src.toposort) and src.dtype == dtypes.float32, "TC needs a product summed in float32")
  if not k.caps.has_local:  # the CPU's dot products multiply exactly: A and B widened to float32, then multiplied
    check(src.op is Ops.MUL and all(s.op is Ops.CAST and s.src[0] in views for s in src.src), "TC needs a product of two widened inputs")
  kd, n = k.n_global, k.n_global
  for col in range(n - 1, -1, -1):
    for row in range(n):
      if row == col: continue
      a = next((v for v in views if v.arg.strides[col] == 0 and v.arg.strides[row] != 0), None)
      b = next((v for v in views if v.arg.strides[row] == 0 and v.arg.strides[col] != 0), None)
      if a is None or b is None or a is b: continue
      (sam, sak), (sbk, sbn) = (a.arg.strides[row], a.arg.strides[kd]), (b.arg.strides[kd], b.arg.strides[col])
      (al, ald), (bl, bld) = ("row_major", sam) if sak == 1 else ("col_major", sak), ("row_major", sbk) if sbn == 1 else ("col_major", sbn)
      if not k.caps.has_local:  # lowering takes each pair as the lanes allow (see lower.dots.DotPairs.dot)
        check(k.sizes[kd] % TC_PAIR == 0, f"TC on the CPU needs a sum over an even length (pairs), not {k.sizes[kd]}")
        return TensorCore(row, col, a, b, al, bl, ald, bld)
      if not (sak == 1 or sam == 1) or not (sbn == 1 or sbk == 1): continue
      check(all(k.sizes[d] % TC_SIZE == 0 for d in (row, col, kd)), f"TC needs the matmul's sizes to be multiples of {TC_SIZE}")
      check(ald % 8 == 0 and bld % 8 == 0 and a.arg.offset % 8 == 0 and b.arg.offset % 8 == 0, "TC needs rows aligned to 16 bytes")
      return TensorCore(row, col, a, b, al, bl, ald, bld)
  raise KernelOptError("TC needs inputs contiguous along a matrix dim" if k.caps.has_local else "TC needs a matmul: A constant along B's columns")


@dataclass
class Axis:
  size: int
  kind: AxisKind
  dim: int  # the kernel dim this axis is a part of
  stride: int  # the dim's index is the sum of stride * value over its axes


def dims_read(root: UOp, target: UOp, stop: frozenset[UOp] = frozenset()) -> frozenset[int]:
  """The dims of `root` along which the index at which it reads `target` changes (through views; not past `stop`)."""
  dims = tuple(UOp.var(f"d{i}", 0, max(s - 1, 0)) for i, s in enumerate(root.shape))
  found: set[UOp] = set()
  seen: set[tuple[UOp, tuple[UOp, ...]]] = set()
  def walk(u: UOp, idx: tuple[UOp, ...]) -> None:
    if (u, idx) in seen or u.op in (Ops.BUFFER, Ops.CONST) or u in stop and u is not root: return
    seen.add((u, idx))
    if u is target: found.update(v for i in idx for v in i.vars)
    elif u.op is Ops.VIEW:
      off, src = simplify(u.arg.index(idx)[0]), u.src[0]
      walk(src, split_offset(off, src.shape))
    elif u.op is Ops.GATHER: found.update(dims)  # read at data-dependent places: taken to change along every dim
    elif u.op is not Ops.REDUCE:  # another reduce's dims are not root's
      for s in u.src: walk(s, idx)
  walk(root, dims)
  return frozenset(d for d, v in enumerate(dims) if v in found)


def input_strides(k: Kernel) -> list[list[int]]:
  """For each buffer the reduce reads (through any reshapes), its element stride along each kernel dim, found by stepping that dim
  from 0 to 1; a kernel without a reduce reads its buffers along the output dims."""
  # kept by the kernel and its copies (the heuristics and every lowering with GROUP and LOCAL threads ask; 1 ms a kernel)
  if (key := tuple(k.sizes)) not in k.strides_seen: k.strides_seen[key] = _input_strides(k.ast, key, k.n_global, k.reduce_axes)
  return [list(st) for st in k.strides_seen[key]]


def _input_strides(ast: UOp, sizes: tuple[int, ...], n_global: int, reduce_axes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
  zero, dims = UOp.const(dtypes.int64, 0), [UOp.var(f"d{i}", 0, max(s - 1, 0)) for i, s in enumerate(sizes)]
  offsets: dict[UOp, None] = {}
  seen: set[tuple[UOp, tuple[UOp, ...]]] = set()
  def walk(u: UOp, idx: tuple[UOp, ...]) -> None:
    if (u, idx) in seen: return
    seen.add((u, idx))
    if u.op is Ops.VIEW:
      off = simplify(u.arg.index(idx)[0])
      if u.src[0].op is Ops.BUFFER: offsets[off] = None
      else: walk(u.src[0], split_offset(off, u.src[0].shape))
      return
    if u.op is Ops.GATHER:  # the gathered dim's index is data: counted as constant, so strides along the output dims are the reads'
      walk(u.src[1], idx)
      return walk(u.src[0], idx[:u.arg] + (zero,) + idx[u.arg + 1:])
    if u.op is Ops.REDUCE:
      red = list(idx)
      for j, a in enumerate(reduce_axes): red[a] = dims[n_global + j]
      idx = tuple(red)
    for s in u.src: walk(s, idx)
  walk(ast, tuple(dims[:n_global]))
  def at(off: UOp, d: int) -> int:
    c = simplify(off.substitute({v: UOp.const(dtypes.int64, int(i == d)) for i, v in enumerate(dims)}))
    return int(c.arg) if c.op is Ops.CONST else -1
  return tuple(tuple(at(off, d) - at(off, -1) if sizes[d] > 1 else 0 for d in range(len(sizes))) for off in offsets)


def same_rows(a: UOp, b: UOp) -> bool:
  """Whether two reduces reduce the same dims of the same shape: one loop nest could run either (a chain's reduces do)."""
  return a.src[0].shape == b.src[0].shape and a.arg[1] == b.arg[1]


def find_reduces(ast: UOp) -> list[UOp]:
  """The kernel's reduces, each after those it reads: one, or a chain of a row's statistics over the same dims (softmax's max, then
  its sum of exps), which lowering runs one loop after another."""
  reduces = [u for u in ast.toposort if u.op is Ops.REDUCE]
  if not all(same_rows(r, reduces[0]) for r in reduces): raise ValueError("a kernel's reduces share their dims; the scheduler splits the rest")
  return reduces


PACK_BYTES = 128 << 10  # the largest panel PACK copies: an array on the stack of each thread (macOS gives threads 512 KiB), K blocked to fit
PACK_BLOCK_BYTES = 256 << 10  # the largest block PACK 1 copies, on the same stack: half of a macOS thread's


class PackTile(NamedTuple):
  """An input PACK copies (see Kernel.pack_tiles): its view, where its copy goes (the number of loops of cpu_loops around it), the
  loops inside that whose every iteration the copy holds (PACK 1's block: [(axis, size)], outermost first), and the parts of each
  dim that one iteration of them reads [(dim, extent)]."""
  view: UOp
  at: int
  loops: list[tuple[int, int]]
  dims: list[tuple[int, int]]

  @property
  def size(self) -> int: return prod(e for _, e in self.dims) * prod(n for _, n in self.loops)  # elements
LANES_KBLOCK = "LANES and KBLOCK do not combine: between K blocks the output holds each sum, not its lanes' partial sums"


class KernelBuffer(Protocol):
  """What code generation reads of the buffer an AST's BUFFER holds (a runtime.Buffer); its place in Kernel.bufs is its argument's."""
  @property
  def dtype(self) -> DType: ...
  @property
  def size(self) -> int: ...
  @property
  def nbytes(self) -> int: ...


class Kernel:
  """The AST's output dims are the global dims, the reduce's dims follow; `axes` are the loops and register parts they split into."""

  def __init__(self, ast: UOp, caps: DeviceCaps):
    self.ast, self.caps = ast, caps
    self.reduceops = find_reduces(ast)
    self.reduceop = self.reduceops[-1] if self.reduceops else None  # the last of a chain: what the output reads
    self.out_shape: tuple[int, ...] = ast.shape
    self.n_global = len(self.out_shape)
    self.reduce_axes: tuple[int, ...] = self.reduceop.arg[1] if self.reduceop is not None else ()
    red_sizes = [self.reduceop.src[0].shape[a] for a in self.reduce_axes] if self.reduceop is not None else []
    # attention in one kernel (Ops.ATTENTION, the whole AST): the output's dims but its values' (each thread's rows keep all of them),
    # then the keys as the reduce dim
    self.attention = ast if ast.op is Ops.ATTENTION else None
    if self.attention is not None: self.n_global, red_sizes = self.n_global - 1, [ast.src[1].shape[-2]]
    self.sizes: list[int] = list(self.out_shape[:self.n_global]) + red_sizes  # padded sizes after PADTO
    self.axes = [Axis(s, AxisKind.GLOBAL if d < self.n_global else AxisKind.REDUCE, d, 1) for d, s in enumerate(self.sizes)]
    self.global_order = list(range(self.n_global))
    self.padded: dict[int, int] = {}  # dim -> real size, for dims grown by PADTO
    self.opts: list[Opt] = []
    self.tc: TensorCore | None = None
    self.flash_tc = False  # TC on attention in tiles (lower.flash.flash_attention_tc): a warp's 16 rows by mma.sync
    self.stream = False  # STREAM: the output's whole-line vector stores skip the caches
    self.prefetch = False  # PREFETCH: STAGE's next tile is loaded during the current one's compute
    self.pack = False  # PACK: the inputs of pack_tiles are read from contiguous copies of their panels
    self.pack_block = False  # PACK 1: of the blocks the loops inside read (see pack_tiles)
    self.stages = 1  # PIPELINE: STAGE's tiles in a ring of this many shared buffers, filled by cp.async
    self.raster: tuple[int, int] | None = None  # RASTER: (the global dim of the bands, their workgroups along it)
    self.bufs: list[KernelBuffer] = [u.arg for u in ast.toposort if u.op is Ops.BUFFER]
    self.strides_seen: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = {}  # see input_strides; its copies share it

  @property
  def n_reduce(self) -> int: return len(self.sizes) - self.n_global
  def remaining(self, dim: int) -> Axis: return next(a for a in self.axes if a.dim == dim and a.kind in LOOPS)
  def upcast_size(self, kind: AxisKind | None = None, dim: int = -1, size: int = 1) -> int:
    """The values one iteration holds in registers, with a new register part of `kind` along `dim` if given: the register parts'
    product, but a row written after its statistic (see reduce_out_dims) counts the row's UPCASTs apart from the reduce's parts."""
    parts = [(a.kind, a.dim, a.size) for a in self.axes] + [(kind, dim, size)]
    reduce_side = prod(n for k, d, n in parts if k in (AxisKind.UNROLL, AxisKind.LANES) or k is AxisKind.UPCAST and d in self.reduce_out_dims)
    return max(reduce_side, prod(n for k, _, n in parts if k is AxisKind.UPCAST))
  def sizes_of(self, *kinds: AxisKind) -> int: return prod(a.size for a in self.axes if a.kind in kinds)
  @property
  def launch_dims(self) -> tuple[int, int]:
    """(workgroups, threads per workgroup) on devices with workgroups: the global loops become workgroups, but a row's (row_dims),
    which loop in each thread after the row's statistic, its LOCAL parts threads that the other LOCAL and GROUP parts have already."""
    rows, warp = self.row_dims, self.caps.warp if (self.tc is not None or self.flash_tc) and self.caps.has_local else 1
    return prod(a.size for a in self.axes if a.kind is AxisKind.GLOBAL and a.dim not in rows), \
      prod(a.size for a in self.axes if a.kind in (AxisKind.LOCAL, AxisKind.GROUP) and a.dim not in rows) * warp
  @property
  def row_dims(self) -> frozenset[int]:
    """The output dims of a row written after its statistic (softmax's columns: see reduce_out_dims), none in other kernels."""
    return frozenset(d for d in range(self.n_global) if d not in self.reduce_out_dims) if self.reduceop is not None else frozenset()
  @property
  def row_thread_axes(self) -> list[int]:
    """The LOCAL parts of the row's dims (see launch_dims), slowest first: each thread's place along the row."""
    rows = self.row_dims
    return sorted((i for i, a in enumerate(self.axes) if a.kind is AxisKind.LOCAL and a.dim in rows),
                  key=lambda i: (self.axes[i].dim, -self.axes[i].stride))
  @property
  def thread_axes(self) -> list[int]:
    """A workgroup's thread parts (LOCAL and GROUP axes), slowest first: the linear thread id is taken apart with the last fastest.
    LOCAL parts by dim (a dim's inner part fastest), and the GROUP parts (the same) fastest where the reduce reads an input contiguous along a
    grouped dim (a row sum: neighbouring threads read neighbouring elements of the row), else slowest (a column sum: neighbouring
    threads read along the kept row, each group of them down its own share of the rows)."""
    rows = self.row_dims
    local = sorted((i for i, a in enumerate(self.axes) if a.kind is AxisKind.LOCAL and a.dim not in rows),
                   key=lambda i: (self.axes[i].dim, -self.axes[i].stride))
    group = sorted((i for i, a in enumerate(self.axes) if a.kind is AxisKind.GROUP), key=lambda i: (self.axes[i].dim, -self.axes[i].stride))
    if not local or not group: return local + group
    dims = {self.axes[i].dim for i in group}
    return local + group if any(st[d] == 1 for st in input_strides(self) for d in dims) else group + local
  def copy(self) -> Kernel:
    ret = copy.copy(self)
    ret.axes, ret.sizes, ret.global_order = [copy.copy(a) for a in self.axes], list(self.sizes), list(self.global_order)
    ret.padded, ret.opts = dict(self.padded), list(self.opts)
    return ret

  @property
  def name(self) -> str:
    prefix = "attn_" if self.attention is not None else "r_" if self.reduceop is not None else "E_"
    return prefix + "_".join(str(s) for s in self.sizes or [1])

  # ***** identity *****
  @cached_property
  def ast_text(self) -> str:
    """A canonical text of the AST: ops, dtypes, views, constants and buffer positions, never addresses or ids."""
    index: dict[UOp, int] = {}
    lines = []
    for u in self.ast.toposort:
      index[u] = len(index)
      arg = f"buf{self.bufs.index(u.arg)}:{u.arg.size}" if u.op is Ops.BUFFER else repr(u.arg)
      lines.append(f"{index[u]} {u.op.name} {u.dtype.name} {[index[s] for s in u.src]} {arg}")
    return "\n".join(lines)

  @cached_property
  def key(self) -> str: return hashlib.sha256(self.ast_text.encode()).hexdigest()[:24]

  @cached_property
  def flops(self) -> int:
    if (at := self.attention) is not None:  # per query and key: a dot product of E, one of Ev, the softmax's few
      return prod(at.shape[:-1]) * at.src[1].shape[-2] * (2 * at.src[0].shape[-1] + 2 * at.shape[-1] + 5)
    ops = 0
    for u in self.ast.toposort:
      if u.op in ALU and u.op is not Ops.CAST: ops += prod(u.shape)
      if u.op is Ops.REDUCE: ops += prod(u.src[0].shape)
    return ops

  @cached_property
  def reduce_out_dims(self) -> frozenset[int]:
    """The output dims along which the reduce's value changes: all of them, but for a row's statistic that the output reads back
    along its row (softmax's sum, layernorm's variance), which does not change along the row's dims."""
    return frozenset().union(*(dims_read(self.ast, r) for r in self.reduceops))

  @property
  def mem_bytes(self) -> int: return sum(b.nbytes for b in self.bufs) + prod(self.out_shape) * self.ast.dtype.itemsize

  # ***** opts *****
  def apply_opts(self, opts: Sequence[Opt]) -> Kernel:
    for opt in opts: self.apply_opt(opt)
    return self

  def apply_opt(self, opt: Opt) -> None:
    """Apply one opt in place, or raise KernelOptError (leaving the kernel unchanged) if it is not valid here."""
    check(isinstance(opt, Opt) and type(opt.axis) is int and type(opt.arg) is int, f"not an opt: {opt!r}")
    if opt.op is OptOps.TC and self.attention is not None: self.flash_opt(opt)
    elif opt.op in KERNEL_OPTS: KERNEL_OPTS[opt.op](self, opt)
    elif self.attention is not None and self.flash_takes(opt): self.flash_opt(opt)
    else: AXIS_OPTS[opt.op](self, opt, self.opt_dim(opt))
    self.opts.append(opt)

  def has(self, kind: AxisKind) -> bool: return any(a.kind is kind for a in self.axes)
  def split_inner(self, kind: AxisKind, dim: int, size: int) -> None:
    """Split the inner `size` of dim's loop off as an axis of `kind`."""
    rem = self.remaining(dim)
    self.axes.append(Axis(size, kind, dim, rem.stride))
    rem.stride, rem.size = rem.stride * size, rem.size // size
  def split_outer(self, kind: AxisKind, dim: int, size: int) -> None:
    """Split the outer `size` of dim's loop off as an axis of `kind`."""
    rem = self.remaining(dim)
    self.axes.append(Axis(size, kind, dim, rem.stride * (rem.size // size)))
    rem.size //= size

  # ***** the opts of the whole kernel *****
  def tc_opt(self, opt: Opt) -> None:
    arg = opt.arg
    check(opt.axis == 0 and arg in (0, 1, 2), "TC takes axis 0 and arg 0 (wmma), 1 (mma.sync) or 2 (wgmma): the kernel's matmul picks its axes")
    check(arg == 0 or self.caps.has_local, f"TC's arg {arg} ({'mma.sync' if arg == 1 else 'wgmma'}) is a GPU's")
    tc = replace(find_tensor_core(self), mma=arg == 1, wgmma=arg == 2)
    check(arg != 2 or 2 in self.caps.tc_args, "TC's arg 2 (wgmma) is sm_90's (Hopper): this GPU's TC takes args "
          + " and ".join(map(str, self.caps.tc_args)))
    check(arg in self.caps.tc_args, f"TC's arg {arg} (PTX mma.sync) is CUDA's: this GPU's TC takes arg 0")
    check(arg != 2 or self.sizes[tc.row] % WARPGROUP_ROWS == 0,
          f"TC's arg 2 (wgmma) needs the matmul's rows a multiple of {WARPGROUP_ROWS}: a warpgroup's 4 warps take 16 each")
    if arg == 0 and self.caps.has_local:  # load_matrix_sync: each 16x16 tile's first element 32-byte aligned, wherever its batch is
      check(all(v.arg.offset % 16 == 0 and all(st % 16 == 0 for d, st in enumerate(v.arg.strides) if d not in (tc.row, tc.col, self.n_global))
                for v in (tc.a, tc.b)), "TC's arg 0 (wmma) needs each 16x16 tile 32-byte aligned: arg 1 takes 16-byte aligned rows")
    for dim in (tc.row, tc.col, self.n_global) if self.caps.has_local else (self.n_global,):  # the CPU: K in pairs
      self.split_inner(AxisKind.TC, dim, TC_SIZE if self.caps.has_local else TC_PAIR)
    self.tc = tc
    if tc.wgmma:  # the warpgroup (4 warps along A's rows, 16 each), and STAGE's K tiles, which its descriptors name: 64 of K where K allows
      self.split_inner(AxisKind.LOCAL, tc.row, 4)
      k = self.remaining(self.n_global).size
      self.split_outer(AxisKind.STAGE, self.n_global, k // next(s for s in (4, 2, 1) if k % s == 0))

  def prefetch_opt(self, opt: Opt) -> None:
    check(opt.axis == 0 and opt.arg == 0, "PREFETCH takes axis 0 and arg 0")
    check(any(a.kind is AxisKind.STAGE and a.size > 1 for a in self.axes), "PREFETCH needs STAGE with more than one K tile")
    check(not self.prefetch and self.stages == 1, "one PREFETCH opt per kernel, not with PIPELINE")
    self.prefetch = True

  def pack_opt(self, opt: Opt) -> None:
    check(opt.axis == 0 and opt.arg in (0, 1), "PACK takes axis 0 and arg 0 (panels) or 1 (blocks)")
    check(not self.caps.has_local and not self.pack and self.tc is None, "PACK is for the CPU, once per kernel, without TC")
    self.pack_block = opt.arg == 1
    if not self.pack_tiles():
      self.pack_block = False
      raise KernelOptError("PACK needs an input read along the reduce that a loop inside its own loops reads again (a matmul's B with the "
                           "row loop inside the column loop; PACK 1: the column loop inside the row loop)")
    self.pack = True

  def pipeline_opt(self, opt: Opt) -> None:
    arg = opt.arg
    check(opt.axis == 0 and 2 <= arg <= 8, "PIPELINE takes axis 0 and 2 to 8 stages")
    check(self.caps.async_copy, "PIPELINE is cp.async, CUDA's on sm_80 and later: on HIP and OpenCL STAGE copies its tiles with plain loads "
          "and stores (PREFETCH overlaps them with the compute)")
    check(any(a.kind is AxisKind.STAGE and a.size > 1 for a in self.axes), "PIPELINE needs STAGE with more than one K tile")
    check(self.stages == 1 and not self.prefetch, "one PIPELINE opt per kernel, not with PREFETCH")
    check(self.tc is None or self.tc.mma or self.tc.wgmma, "PIPELINE with TC needs TC's arg 1 (mma.sync) or 2 (wgmma): wmma's tiles hold "
          "A transposed, which cp.async cannot copy")
    check((need := self.stage_bytes() * arg + self.tc_shared()) <= self.caps.shared_bytes,
          f"PIPELINE {arg} needs {need} bytes of shared memory, over {self.caps.shared_bytes}")
    self.stages = arg

  def raster_opt(self, opt: Opt) -> None:
    check(self.caps.has_local, "RASTER needs a device with workgroups")
    check(self.raster is None, "one RASTER opt per kernel")
    order = [d for d in self.global_order if d not in self.row_dims]  # the dims of the workgroups (see launch_dims)
    check(opt.axis in order and order.index(opt.axis) < len(order) - 1, "RASTER needs an axis of workgroups, and another after it")
    size = self.remaining(opt.axis).size
    check(1 < opt.arg < size and size % opt.arg == 0, f"RASTER {opt.arg} does not split the {size} workgroups along axis {opt.axis} into bands")
    self.raster = (opt.axis, opt.arg)

  def stream_opt(self, opt: Opt) -> None:
    check(opt.axis == 0 and opt.arg == 0, "STREAM takes axis 0 and arg 0")
    check(not self.caps.has_local and not self.stream, "STREAM is for the CPU, once per kernel")
    self.stream = True

  # ***** the opts of one axis: the checks they share, then each one's own *****
  def opt_dim(self, opt: Opt) -> int:
    """The kernel dim that an opt of one axis splits, after the checks these opts share: what STAGE, TC and RASTER combine with."""
    op = opt.op
    if self.has(AxisKind.STAGE): check(op not in (OptOps.GROUP, OptOps.GROUPTOP, OptOps.LANES), f"{op.name} does not combine with STAGE")
    if self.tc is not None:
      combine = (OptOps.UPCAST, OptOps.LOCAL, OptOps.UNROLL, OptOps.SWAP, OptOps.STAGE) if self.caps.has_local else \
        (OptOps.UPCAST, OptOps.UNROLL, OptOps.SWAP, OptOps.THREAD, OptOps.PADTO, OptOps.KBLOCK, OptOps.LANES)
      check(op in combine, f"{op.name} does not combine with TC")
      check(not self.tc.wgmma or op is not OptOps.LOCAL, "TC's arg 2 (wgmma) keeps one warpgroup a workgroup: LOCAL does not combine with it")
    if op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP): check(self.caps.has_local, f"{op.name} needs a device with workgroups")
    if op in (OptOps.UPCAST, OptOps.LOCAL, OptOps.THREAD, OptOps.SWAP):
      check(0 <= opt.axis < self.n_global, f"{op.name} axis {opt.axis} is not one of the {self.n_global} global axes")
      dim = opt.axis
    elif op is OptOps.PADTO:
      check(0 <= opt.axis < len(self.sizes), f"PADTO axis {opt.axis} is not one of the {len(self.sizes)} axes")
      dim = opt.axis
    else:
      check(0 <= opt.axis < self.n_reduce, f"{op.name} axis {opt.axis} is not one of the {self.n_reduce} reduce axes")
      dim = self.n_global + opt.axis
    if self.raster is not None:  # RASTER's bands stay whole
      check(op is not OptOps.SWAP, "SWAP comes before RASTER: it changes the workgroups' order")
      (along, bands), size, arg = self.raster, self.remaining(dim).size, opt.arg
      if dim == along and op in (OptOps.PADTO, OptOps.UPCAST, OptOps.LOCAL, OptOps.THREAD):
        check(op is not OptOps.PADTO and arg > 0 and (size // arg) % bands == 0 and size // arg > bands,
              f"{op.name} after RASTER {bands} would leave axis {dim}'s workgroups in no whole number of bands")
    return dim

  def check_divides(self, opt: Opt, dim: int) -> None:
    size = self.remaining(dim).size
    check(opt.arg > 1 and size % opt.arg == 0 and size > 0, f"{opt.op.name} {opt.arg} does not divide axis {opt.axis} of size {size}")
  def check_registers(self, kind: AxisKind, dim: int, arg: int) -> None:
    check(self.upcast_size(kind, dim, arg) <= self.caps.max_upcast, f"upcast product over {self.caps.max_upcast}")
  def check_workgroup(self, arg: int) -> None:
    check(self.launch_dims[1] * arg <= self.caps.max_local, f"a workgroup of over {self.caps.max_local} threads")

  def check_shared(self, dim: int, arg: int, group: bool = False) -> None:
    """The shared memory of STAGE's tiles (as UPCAST or LOCAL grows them) and of GROUP's partials: one per accumulator and thread."""
    if self.has(AxisKind.STAGE) and not group and (need := self.stage_bytes(dim, arg) + self.tc_shared()) > self.caps.shared_bytes:
      raise KernelOptError(f"the staged tiles would need {need} bytes of shared memory, over {self.caps.shared_bytes}")
    rows = self.row_dims  # a row's parts add no accumulators nor threads (see launch_dims)
    if self.reduceop is not None and (group or self.has(AxisKind.GROUP)) and dim not in rows:
      shared = prod(a.size for a in self.axes if a.kind is AxisKind.UPCAST and a.dim not in rows) * self.launch_dims[1] * arg * \
        max(r.dtype.itemsize for r in self.reduceops)
      check(shared <= self.caps.shared_bytes, f"GROUP partials need {shared} bytes of shared memory, over {self.caps.shared_bytes}")

  def upcast_opt(self, opt: Opt, dim: int) -> None:
    self.check_divides(opt, dim)
    self.check_registers(AxisKind.UPCAST, dim, opt.arg)
    if self.tc is not None and self.caps.has_local:  # a 4096^3 float16 TC candidate of 128 tiles compiled 38 s
      need = TC_SIZE * TC_SIZE // self.caps.warp * self.sizes_of(AxisKind.UPCAST) * opt.arg  # a 16x16 float32 tile over the warp's lanes
      check(need <= self.caps.vector_registers, f"TC's accumulators would take {need} registers a thread, over {self.caps.vector_registers}")
    self.check_shared(dim, opt.arg)
    self.split_inner(AxisKind.UPCAST, dim, opt.arg)

  def unroll_opt(self, opt: Opt, dim: int) -> None:
    self.check_divides(opt, dim)
    self.check_registers(AxisKind.UNROLL, dim, opt.arg)
    self.split_inner(AxisKind.UNROLL, dim, opt.arg)

  def lanes_opt(self, opt: Opt, dim: int) -> None:
    self.check_divides(opt, dim)
    check(bool(self.reduceops) and all(r.arg[0] in (Ops.ADD, Ops.MAX) for r in self.reduceops), "LANES needs a sum or max")
    check(not self.has(AxisKind.LANES), "one LANES opt per kernel")
    check(not self.has(AxisKind.KBLOCK), LANES_KBLOCK)
    self.check_registers(AxisKind.LANES, dim, opt.arg)
    self.split_inner(AxisKind.LANES, dim, opt.arg)

  def local_opt(self, opt: Opt, dim: int) -> None:
    arg = opt.arg
    self.check_divides(opt, dim)
    if dim in self.row_dims:  # a row's threads are the workgroup's, the GROUP's fastest, each a share of it
      group, threads, shared = self.sizes_of(AxisKind.GROUP), self.thread_axes, prod(self.axes[i].size for i in self.row_thread_axes)
      check(bool(threads) and self.axes[threads[-1]].kind is AxisKind.GROUP and group % (arg * shared) == 0,
            "LOCAL along a row written after its statistic splits it over the reduce's GROUP threads, fastest: its product divides theirs")
    else: self.check_workgroup(arg)
    if self.tc is not None:  # each warp's accumulator tiles go through 256 floats of shared memory
      need = self.tc_shared(arg) + (self.stage_bytes(dim, arg) if self.has(AxisKind.STAGE) else 0)
      check(need <= self.caps.shared_bytes, f"TC needs {need} bytes of shared memory, over {self.caps.shared_bytes}")
    self.check_shared(dim, arg)
    self.split_inner(AxisKind.LOCAL, dim, arg)

  def group_opt(self, opt: Opt, dim: int) -> None:
    """GROUP, and GROUPTOP: the outer part."""
    self.check_divides(opt, dim)
    self.check_workgroup(opt.arg)
    self.check_shared(dim, opt.arg, group=True)
    (self.split_outer if opt.op is OptOps.GROUPTOP else self.split_inner)(AxisKind.GROUP, dim, opt.arg)

  def thread_opt(self, opt: Opt, dim: int) -> None:
    self.check_divides(opt, dim)
    check(self.caps.threads > 1 and opt.arg <= 4 * self.caps.threads, f"THREAD {opt.arg} over this device's {self.caps.threads} threads")
    check(not self.has(AxisKind.THREAD), "one THREAD opt per kernel")
    self.split_outer(AxisKind.THREAD, dim, opt.arg)

  def swap_opt(self, opt: Opt, dim: int) -> None:
    check(dim < opt.arg < self.n_global, f"SWAP {dim} needs a later global axis, got {opt.arg}")  # one spelling per swap: no (1, 0) after (0, 1)
    i, j = self.global_order.index(dim), self.global_order.index(opt.arg)
    check(i < j, "SWAP moves an axis inward past a later one; use the earlier axis first")
    self.global_order[i], self.global_order[j] = self.global_order[j], self.global_order[i]

  def stage_opt(self, opt: Opt, dim: int) -> None:
    arg, rem = opt.arg, self.remaining(dim)
    check(self.caps.has_local, "STAGE needs a device with workgroups and shared memory")
    check(self.tc is None or not self.tc.wgmma, "TC's arg 2 (wgmma) stages its K tiles itself: STAGE does not combine with it")
    check(not self.has(AxisKind.STAGE), "one STAGE opt per kernel")
    check(not self.has(AxisKind.GROUP) and not self.has(AxisKind.LANES), "STAGE does not combine with GROUP or LANES")
    check(bool(self.stage_inputs), "STAGE needs an input read along the kernel's one reduce dim, its last, straight from memory")
    check(1 < arg <= rem.size and rem.size % arg == 0, f"STAGE {arg} does not split reduce axis {opt.axis} of size {rem.size} into tiles")
    whole = rem.size
    self.split_outer(AxisKind.STAGE, dim, whole // arg)
    if (need := self.stage_bytes() + self.tc_shared()) > self.caps.shared_bytes:  # the tiles' size needs the STAGE axis in place
      self.axes.pop()
      rem.size = whole
      raise KernelOptError(f"STAGE {arg} needs {need} bytes of shared memory, over {self.caps.shared_bytes}")

  def kblock_opt(self, opt: Opt, dim: int) -> None:
    arg, size = opt.arg, self.remaining(dim).size
    check(not self.caps.has_local, "KBLOCK needs a CPU: on a device with workgroups each thread keeps its sums in registers")
    check(not self.has(AxisKind.KBLOCK), "one KBLOCK opt per kernel")
    check(not self.has(AxisKind.LANES), LANES_KBLOCK)
    check(1 < arg < size and size % arg == 0, f"KBLOCK {arg} does not split reduce axis {opt.axis} of size {size} into blocks")
    check((why := self.kblock_problem()) is None, f"KBLOCK: {why}")
    self.split_outer(AxisKind.KBLOCK, dim, size // arg)

  def padto_opt(self, opt: Opt, dim: int) -> None:
    arg, rem = opt.arg, self.remaining(dim)
    check(dim not in self.padded and sum(a.dim == dim for a in self.axes) == 1, "PADTO comes before any split of its axis")
    new = round_up(rem.size, arg) if arg > 1 else 0
    check(arg > 1 and new != rem.size and new <= 2 * rem.size, f"PADTO {arg} does not fit axis of size {rem.size}")
    self.padded[dim], rem.size, self.sizes[dim] = rem.size, new, new

  def flash_takes(self, opt: Opt) -> bool:
    """Whether an opt of one axis on attention is one of attention in tiles (flash_opt: STAGE, GROUP and any after STAGE), after the
    checks of those that apply to attention in one kernel."""
    op, at = opt.op, self.attention
    assert at is not None
    check(op in (OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.THREAD, OptOps.SWAP, OptOps.STAGE, OptOps.GROUP),
          f"{op.name} does not apply to attention in one kernel")
    if op in (OptOps.STAGE, OptOps.GROUP) or self.has(AxisKind.STAGE): return True
    if op is OptOps.UPCAST and 0 <= opt.axis < self.n_global and opt.arg > 0:  # each row keeps its query and output in registers
      held = self.sizes_of(AxisKind.UPCAST) * opt.arg * (at.src[0].shape[-1] + at.shape[-1])
      check(held <= 4 * self.caps.max_upcast, f"UPCAST {opt.arg}: the rows' queries and outputs would take {held} registers")
    return False

  def flash_opt(self, opt: Opt) -> None:
    """An opt of attention in tiles (lower.flash.flash_attention): STAGE t, the keys in tiles of t that a workgroup copies to shared memory
    (before any other opt along the keys), then GROUP g (threads per row: a row's keys of a tile and its output's dims split over g
    threads) and the rows' LOCAL (the workgroup's rows) and UPCAST parts (each thread's rows), nothing else; the tiles fit in shared memory."""
    op, arg, rows = opt.op, opt.arg, self.n_global - 1
    check(self.caps.has_local, f"{op.name} on attention needs a device with workgroups and shared memory")
    if op is OptOps.TC: return self.flash_tc_opt(opt)
    if self.flash_tc: check(op is OptOps.LOCAL and opt.axis == rows, f"TC on attention takes its tiles itself, then the rows' LOCAL, axis {rows}")
    if op is OptOps.STAGE:
      check(opt.axis == 0 and not self.has(AxisKind.STAGE), "one STAGE opt, on axis 0 (the keys)")
      check(all(a.kind in (AxisKind.GLOBAL, AxisKind.REDUCE) or a.kind in (AxisKind.LOCAL, AxisKind.UPCAST, AxisKind.TC) and a.dim == rows
                for a in self.axes),
            "STAGE on attention comes before any opt but the rows' LOCAL and UPCAST")
      check(1 < arg <= self.sizes[-1] and self.sizes[-1] % arg == 0 and arg % 4 == 0 and arg <= STAGE_MAX,
            f"STAGE {arg} does not split the {self.sizes[-1]} keys into tiles of a multiple of 4")
    else:
      check(self.has(AxisKind.STAGE), f"{op.name} on attention comes after STAGE (attention in tiles)")
      check(op in (OptOps.GROUP, OptOps.LOCAL, OptOps.UPCAST), f"{op.name} does not combine with STAGE on attention")
      check(op is OptOps.GROUP or opt.axis == rows, f"{op.name} on attention in tiles splits the rows, axis {rows}")
      if op is OptOps.GROUP:
        check(opt.axis == 0 and self.sizes_of(AxisKind.GROUP) == 1, "one GROUP opt, on axis 0 (the keys)")
        check(self.attention is not None and arg != 0 and self.attention.shape[-1] % arg == 0, f"GROUP {arg} does not divide the output's dims")
    rem = self.remaining(self.n_global if op in (OptOps.STAGE, OptOps.GROUP) else rows)
    check(arg > 1 and rem.size % arg == 0, f"{op.name} {arg} does not divide axis {opt.axis} of size {rem.size}")
    self.check_flash_fits(op, arg)
    if op is OptOps.STAGE: self.split_outer(AxisKind.STAGE, rem.dim, rem.size // arg)
    else: self.split_inner(AxisKind[op.name], rem.dim, arg)

  def check_flash_fits(self, op: OptOps, arg: int) -> None:
    """Attention in tiles after STAGE, GROUP, LOCAL or UPCAST `arg`: a workgroup's threads, each thread's rows and the tiles' shared memory."""
    block, tile, group = self.flash_sizes()
    if op in (OptOps.LOCAL, OptOps.UPCAST): block *= arg
    if op is OptOps.STAGE: tile = arg
    if op is OptOps.GROUP: group = arg
    upcast = self.sizes_of(AxisKind.UPCAST) * (arg if op is OptOps.UPCAST else 1)  # each thread's rows
    check((block * 2 if self.flash_tc else group * block // upcast) <= self.caps.max_local, f"a workgroup of over {self.caps.max_local} threads")
    check(upcast <= 16, "over 16 rows a thread")
    check((need := self.flash_bytes(block, tile, group)) <= self.caps.shared_bytes,
          f"attention's tiles need {need} bytes of shared memory, over {self.caps.shared_bytes}")

  def flash_tc_opt(self, opt: Opt) -> None:
    """TC on attention: each warp 16 rows (a TC axis), by mma.sync; then STAGE (tiles of 16 keys) and the rows' LOCAL (warps)."""
    at, rows = self.attention, self.n_global - 1
    assert at is not None
    check(opt.axis == 0 and opt.arg == 1 and not self.opts, "TC on attention takes axis 0 and arg 1 (mma.sync), before any other opt")
    check(1 in self.caps.tc_args and self.caps.async_copy, "TC on attention is mma.sync's, CUDA's on sm_80 and later")
    check(len(at.src) == 3 and all(x.dtype == at.src[0].dtype for x in at.src) and at.src[0].dtype in (dtypes.float16, dtypes.bfloat16),
          "TC on attention takes queries, keys and values of one 16-bit float dtype, and no mask")
    check(at.src[0].shape[-1] % 16 == 0 and at.shape[-1] % 16 == 0, "TC on attention needs the head dims multiples of 16")
    check(all(x.op is Ops.VIEW and x.src[0].op is Ops.BUFFER and x.arg.mask is None and x.arg.strides[-1] == 1 and x.arg.offset % 8 == 0
              and all(st % 8 == 0 for st in x.arg.strides[:-1]) for x in at.src),
          "TC on attention copies its inputs from memory 16 bytes at a time: rows contiguous and 16-byte aligned")
    check((n := self.remaining(rows).size) % 16 == 0, f"TC on attention needs the rows a multiple of 16, not {n}")
    check((keys := self.remaining(self.n_global).size) % 16 == 0, f"TC on attention needs the keys a multiple of 16, not {keys}")
    self.flash_tc = True  # flash_bytes counts TC's tiles
    tile = next((t for t in TC_TILES if keys % t == 0 and self.flash_bytes(16, t, 1) <= self.caps.shared_bytes), 0)
    self.flash_tc = tile > 0
    check(tile > 0, f"TC on attention: no tile of {', '.join(map(str, TC_TILES))} keys divides the {keys} keys and fits in shared memory")
    self.split_inner(AxisKind.TC, rows, 16)
    self.split_outer(AxisKind.STAGE, self.n_global, keys // tile)

  def flash_sizes(self) -> tuple[int, int, int]:
    """Attention in tiles: (the workgroup's rows, the keys' tile, the threads per row)."""
    rows = prod(a.size for a in self.axes if a.dim == self.n_global - 1 and a.kind in (AxisKind.LOCAL, AxisKind.UPCAST, AxisKind.TC))
    return rows, next((a.stride for a in self.axes if a.kind is AxisKind.STAGE), 1), self.sizes_of(AxisKind.GROUP)

  def flash_arrays(self, block: int, tile: int, group: int) -> tuple[tuple[str, int], ...]:
    """The shared arrays of attention in tiles (lower.flash.flash_attention declares them), by name and float32 count: tiles of the queries,
    keys, values and probabilities, rows padded by 16 bytes, and each thread's row maxima and sums."""
    at = self.attention
    assert at is not None
    e, ev = at.src[0].shape[-1], at.shape[-1]
    return (("fq", block * (e + FLASH_PAD)), ("fk", tile * (e + FLASH_PAD)), ("fv", tile * (ev + FLASH_PAD)), ("fp", block * (tile + FLASH_PAD)),
            ("fm", group * block), ("fl", group * block))

  def flash_bytes(self, block: int, tile: int, group: int) -> int:
    """The shared memory of attention in tiles: with TC its 16-bit tiles of queries, keys and values (rows padded by TC_PAD) and each
    warp's 256-float output tile, else flash_arrays' float32 arrays."""
    if not self.flash_tc: return 4 * sum(n for _, n in self.flash_arrays(block, tile, group))
    at = self.attention
    assert at is not None
    e, ev = at.src[0].shape[-1], at.shape[-1]
    return 2 * (block * (e + TC_PAD) + tile * (e + TC_PAD) + tile * (ev + TC_PAD)) + 4 * 256 * block // 16

  def kblock_problem(self) -> str | None:
    """Why the reduce's partial sums cannot wait in the output buffer between K blocks (None where they can): that needs each output
    element to read exactly one element of the reduce, of the output's own dtype, so the output holds the sum so far."""
    red = self.reduceop
    if red is None: return "the kernel has no reduce"
    if len(self.reduceops) > 1: return "the kernel has a chain of reduces"
    if red.dtype != self.ast.dtype or red.dtype == dtypes.bfloat16: return f"the sum is {red.dtype.name}, the output {self.ast.dtype.name}"
    if prod(red.shape) != prod(self.out_shape): return "the output reads the reduce's elements more than once"
    @functools.cache
    def direct(u: UOp) -> bool:  # every path from the output to the reduce passes elementwise ops and reshapes that keep the order
      if u is red: return True
      if u.op is Ops.VIEW:
        v = u.arg
        return v.mask is None and v.offset == 0 and tuple(v.strides) == tuple(strides_for(v.shape)) and prod(u.src[0].shape) == prod(v.shape) \
          and (red not in u.src[0].toposort or direct(u.src[0]))
      return u.op not in (Ops.REDUCE, Ops.GATHER) and all(red not in s.toposort or direct(s) for s in u.src)
    return None if direct(self.ast) else "the output reads the reduce through a view that reorders it"

  def cpu_loops(self) -> tuple[list[int], int, int]:
    """The CPU's loop nest outside the reduce, outermost first: (axes, t, n): the THREAD parts (the first t), the K block, the global
    loops in their order; the reduce runs inside the first n, what follows it inside them all (see lower.loops.LoopNest.cpu)."""
    threads = [i for i, a in enumerate(self.axes) if a.kind is AxisKind.THREAD and a.size != 1]
    outer = threads + [i for i, a in enumerate(self.axes) if a.kind is AxisKind.KBLOCK]
    n = len(outer)
    outer += [next(i for i, a in enumerate(self.axes) if a.dim == d and a.kind in LOOPS) for d in self.global_order]
    n = max([n] + [j + 1 for j, i in enumerate(outer) if self.reduceop is None or self.axes[i].dim in self.reduce_out_dims])
    return outer, len(threads), n

  def pack_tiles(self) -> list[PackTile]:
    """PACK's copies on the CPU: each input of the one reduce that it reads straight from memory at its own index (a matmul's B), that
    changes along a reduce dim and that a loop between its own loops and the reduce reads again. PACK 0 copies a panel inside the last
    loop that reads the input (B's columns loop, the rows inside), PACK 1 a block outside the first that does not (the rows loop, the
    columns inside: a K block of B many column tiles wide, which stays in the L2 while every row tile passes it), where a loop inside
    reads it (the block holds each of its iterations, outermost first). A panel holds what one iteration of the loops inside reads:
    the reduce dims' parts within the K block outermost, then the output dims' register parts, in order. Copies over PACK_BYTES
    (PACK 1: PACK_BLOCK_BYTES) are not made."""
    red = self.reduceop
    if self.caps.has_local or red is None or len(self.reduceops) != 1 or red.arg[1] != tuple(range(self.n_global, len(self.sizes))) or \
       red.src[0].shape[:self.n_global] != tuple(self.out_shape): return []
    outer, t, n = self.cpu_loops()
    ret, seen = [], set[UOp]()
    for u in red.src[0].toposort:
      if u.op is not Ops.VIEW or u.src[0].op is not Ops.BUFFER or u.shape != red.src[0].shape or u.dtype != dtypes.float32 or u in seen: continue
      seen.add(u)
      used = self.dims_used(u)
      if not any(d >= self.n_global for d in used): continue
      def reads(j: int) -> bool: return self.axes[outer[j]].dim in used or self.axes[outer[j]].kind is AxisKind.KBLOCK
      if self.pack_block:
        at = next((j for j in range(t, n) if not reads(j) and self.axes[outer[j]].size > 1), n)
        loops = [(outer[j], self.axes[outer[j]].size) for j in range(at, n) if reads(j) and self.axes[outer[j]].size > 1]
        if not loops: continue
      else: at, loops = max([t] + [j + 1 for j in range(t, n) if reads(j)]), []
      if prod(self.axes[i].size for i in outer[at:n]) <= 1: continue  # nothing reads the panel again
      dims = [(d, prod(a.size for a in self.axes if a.dim == d and a.kind not in (AxisKind.GLOBAL, AxisKind.THREAD, AxisKind.KBLOCK)))
              for d in [*(d for d in used if d >= self.n_global), *(d for d in used if d < self.n_global)]]
      tile = PackTile(u, at, loops, dims)
      if tile.size * u.dtype.itemsize <= (PACK_BLOCK_BYTES if self.pack_block else PACK_BYTES): ret.append(tile)
    return ret

  def dims_used(self, view: UOp) -> list[int]:
    """The kernel dims along which a view of a buffer changes (a stride, or a mask that cuts the dim)."""
    v = view.arg
    return [d for d in range(len(self.sizes)) if v.strides[d] != 0 or v.mask is not None and v.mask[d] != (0, v.shape[d])]

  def wgmma_cols(self) -> tuple[int, int]:
    """TC's arg 2: (axis, size) of the UPCAST part of B's columns right after TC's 16, whose tiles one m64nNk16 computes side by side
    (N = 16 x size, at most 256); (-1, 1) where there is none."""
    tc = self.tc
    if tc is None or not tc.wgmma: return -1, 1
    return next(((i, a.size) for i, a in enumerate(self.axes) if a.kind is AxisKind.UPCAST and a.dim == tc.col and a.stride == TC_SIZE
                 and a.size * TC_SIZE <= 256), (-1, 1))

  def tc_shared(self, grow: int = 1) -> int:
    """The shared memory TC's accumulator tiles take: 256 floats a warp (with LOCAL about to grow by `grow`)."""
    return self.sizes_of(AxisKind.LOCAL) * grow * 1024 if self.tc is not None else 0

  @property
  def stage_inputs(self) -> tuple[UOp, ...]:
    """The inputs STAGE copies to shared memory: views of a buffer that the reduce's source reads at its own index (no view between)
    and that change along the reduce dim, in a dtype that shared memory holds as loaded (not bool; a 16-bit float only for TC, whose
    fragments load it as it is). The kernel's one reduce sums over its last dim, after the output's (a matmul's K), so the source's
    dims are the kernel's."""
    memo = self.__dict__.setdefault("_stage_memo", {})  # shared by copies: it depends on the graph and on TC alone
    if (tc := self.tc is not None) not in memo: memo[tc] = self._stage_inputs(tc)
    return memo[tc]

  def _stage_inputs(self, half: bool) -> tuple[UOp, ...]:
    red = self.reduceop
    if red is None or len(self.reduceops) != 1 or red.arg[1] != (self.n_global,) or red.src[0].shape[:self.n_global] != tuple(self.out_shape):
      return ()
    src, kd, found = red.src[0], self.n_global, dict[UOp, None]()
    def walk(u: UOp) -> None:
      if u.op is Ops.VIEW:
        v = u.arg
        if u.src[0].op is Ops.BUFFER and u.shape == src.shape and (half or not u.dtype.is_half) and u.dtype != dtypes.bool and \
           (v.strides[kd] != 0 or v.mask is not None and v.mask[kd] != (0, v.shape[kd])): found[u] = None
      elif u.op not in (Ops.REDUCE, Ops.GATHER):
        for s in u.src: walk(s)
    walk(src)
    return tuple(found)

  def stage_extent(self, dim: int, grow: int = 1) -> int:
    """How far a workgroup's tile reaches along `dim` in one K tile (STAGE): a global dim's workgroup and register parts (times `grow`,
    a split about to be made), the reduce dim's tile."""
    if dim >= self.n_global: return next(a.stride for a in self.axes if a.kind is AxisKind.STAGE)
    return prod(a.size for a in self.axes if a.dim == dim and a.kind is not AxisKind.GLOBAL) * grow

  def stage_tiles(self, dim: int = -1, grow: int = 1) -> list[tuple[UOp, list[tuple[int, int]], int]]:
    """Each staged input's tile in shared memory: (view, [(dim, extent)] outermost first, the padding after each row). The reduce dim
    is outermost, then the output dims in order, so the register tile's reads are contiguous along both output dims (A is stored
    transposed); with TC, the fragment's dim innermost. A row that the copy writes across (its fastest dim in memory is not the row's)
    is padded by 16 bytes (32 for TC's wmma fragments), which keeps their alignment and spreads the column's stores over the banks.
    mma.sync's tiles keep the fragment's two dims in memory's order (rows whole 16-byte chunks, copied as they are: cp.async), swizzled
    or padded (see swizzle_line)."""
    ret = []
    for view in self.stage_inputs:
      v, used = view.arg, self.dims_used(view)
      dims = [(d, self.stage_extent(d, grow if d == dim else 1)) for d in [self.n_global, *(d for d in used if d < self.n_global)]]
      dims = [(d, n) for d, n in dims if n > 1 or d == self.n_global]
      if self.tc is not None:  # TC's rows of A or columns of B innermost, where a 16x16 fragment is contiguous (a batch dim outside them)
        inner = self.tc.row if view is self.tc.a else self.tc.col
        dims = [dn for dn in dims if dn[0] != inner] + [dn for dn in dims if dn[0] == inner]
      fastest = min((d for d, n in dims if n > 1), key=lambda d: (abs(v.strides[d]) or 1 << 62, -d), default=dims[-1][0])
      if self.tc is not None and self.tc.mma:  # ldmatrix reads and cp.async writes 16-byte rows: the fragment's dims innermost (a batch
        # dim outside them) in memory's order, swizzled
        frag = (self.n_global, self.tc.row if view is self.tc.a else self.tc.col)
        dims = [dn for dn in dims if dn[0] not in frag] + sorted((dn for dn in dims if dn[0] in frag), key=lambda dn: dn[0] == fastest)
        row = dims[-1][1] * view.dtype.itemsize
        ret.append((view, dims, 16 // view.dtype.itemsize if row % 32 == 0 and swizzle_line(row) == 0 else 0))
      else:  # load_matrix_sync takes 32-byte aligned fragments; wgmma's core matrices (see lower.staged.StagedTiles.offset) are not padded
        pad = 0 if self.tc is not None and self.tc.wgmma else 32 if self.tc is not None else 16
        ret.append((view, dims, pad // view.dtype.itemsize if fastest != dims[-1][0] else 0))
    return ret

  def stage_bytes(self, dim: int = -1, grow: int = 1) -> int:
    """The shared memory of the staged tiles (with a split of `grow` about to be made along `dim`), PIPELINE's ring of them."""
    tiles = self.stage_tiles(dim, grow)
    return self.stages * sum(prod(n for _, n in dims[:-1]) * (dims[-1][1] + pad) * view.dtype.itemsize for view, dims, pad in tiles)

  def __repr__(self) -> str:
    return f"<Kernel {self.name} key={self.key[:8]} opts={self.opts}>"


KERNEL_OPTS: dict[OptOps, Callable[[Kernel, Opt], None]] = {  # the opts of the whole kernel
  OptOps.TC: Kernel.tc_opt, OptOps.PREFETCH: Kernel.prefetch_opt, OptOps.PACK: Kernel.pack_opt, OptOps.PIPELINE: Kernel.pipeline_opt,
  OptOps.RASTER: Kernel.raster_opt, OptOps.STREAM: Kernel.stream_opt}
AXIS_OPTS: dict[OptOps, Callable[[Kernel, Opt, int], None]] = {  # the opts of one axis, each given its kernel dim (Kernel.opt_dim)
  OptOps.UPCAST: Kernel.upcast_opt, OptOps.UNROLL: Kernel.unroll_opt, OptOps.LANES: Kernel.lanes_opt, OptOps.LOCAL: Kernel.local_opt,
  OptOps.GROUP: Kernel.group_opt, OptOps.GROUPTOP: Kernel.group_opt, OptOps.THREAD: Kernel.thread_opt, OptOps.SWAP: Kernel.swap_opt,
  OptOps.STAGE: Kernel.stage_opt, OptOps.KBLOCK: Kernel.kblock_opt, OptOps.PADTO: Kernel.padto_opt}


def swizzle_line(row: int) -> int:
  """The bytes of a swizzled tile's line for rows of `row` bytes (0: not swizzled). Eight rows at one 16-byte column (a warp's ldmatrix
  matrix, read in one pass) hit all 32 banks where the rows' 16-byte chunks (2, 4, or a multiple of 8 a row) are XORed with the line's
  index: the 128 bytes of one row (or of the rows in 128 bytes) a line, chunk c of line i at c ^ (i % 8). Rows of an odd number of chunks
  are conflict-free as they are; other even ones are padded by one chunk (Kernel.stage_tiles), which makes them odd."""
  chunks = row // 16 if row % 16 == 0 else 0
  return 128 if chunks in (2, 4) else row if chunks and chunks % 8 == 0 else 0


CANDIDATE_ARGS = (2, 3, 4, 5, 6, 7, 8, 16, 32)  # 6: rows of a 16-register target's register tile (see plan_register_tile)


RASTER_ARGS = (4, 8, 16)  # workgroups a RASTER band holds
STAGE_MAX = 64  # the longest K tile to try: a 128x128 workgroup tile's two inputs take 4 KiB of shared memory per 4 of K
TC_TILES = (64, 32, 16)  # TC on attention: the keys' tile, the first that divides them (S, a warp's 16 rows by 64 keys: 32 floats a lane)
TC_PAD = 8  # 16-bit elements after each row of TC attention's tiles: 16 bytes, ldmatrix's 8 rows of a block in distinct banks
FLASH_PAD = 4  # floats after each row of attention's tiles in shared memory: 16 bytes, so a warp's 16-byte reads of 8 rows hit all 32 banks


def candidate_opts(k: Kernel) -> list[Opt]:
  """Every opt to try next on this kernel, valid or not (apply_opt on a copy decides): splits by the divisors of each
  axis's remaining size and a few small amounts, swaps of global axes, pads, the workgroup and tensor core opts, STREAM, PREFETCH and
  PACK."""
  ret: list[Opt] = []
  for d in range(len(k.sizes)):
    size = k.remaining(d).size
    args = sorted(set(divisors(size)[1:]) | set(CANDIDATE_ARGS))
    if d < k.n_global:
      ret += [Opt(op, d, a) for op in (OptOps.UPCAST, OptOps.THREAD, OptOps.LOCAL) for a in args]
      ret += [Opt(OptOps.SWAP, d, o) for o in range(d + 1, k.n_global)]
      ret += [Opt(OptOps.RASTER, d, a) for a in RASTER_ARGS]
    else:
      ret += [Opt(op, d - k.n_global, a) for op in (OptOps.UNROLL, OptOps.LANES, OptOps.GROUP, OptOps.GROUPTOP) for a in args]
      ret += [Opt(OptOps.KBLOCK, d - k.n_global, a) for a in divisors(size)[1:-1]]
      ret += [Opt(OptOps.STAGE, d - k.n_global, a) for a in args if a <= STAGE_MAX]
    ret += [Opt(OptOps.PADTO, d, a) for a in CANDIDATE_ARGS]
  return ret + [Opt(OptOps.TC, 0, 0), Opt(OptOps.TC, 0, 1), Opt(OptOps.TC, 0, 2), Opt(OptOps.STREAM, 0, 0), Opt(OptOps.PREFETCH, 0, 0),
                *(Opt(OptOps.PIPELINE, 0, s) for s in (2, 3, 4)), Opt(OptOps.PACK, 0, 0), Opt(OptOps.PACK, 0, 1)]
