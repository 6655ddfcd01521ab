"""The core of lowering: statements, values, loops and reduces of one kernel."""
from __future__ import annotations

import functools
import itertools

from tinytune.codegen.kernel import AxisKind, Kernel
from tinytune.codegen.lower.dots import DotPairs
from tinytune.codegen.lower.kblock import kblocked
from tinytune.codegen.lower.lanes import LanePartials
from tinytune.codegen.lower.loops import LoopNest
from tinytune.codegen.lower.packed import PackedPanels
from tinytune.codegen.lower.program import (
  ARITH,
  CMP,
  TRUE,
  AccArg,
  Kind,
  LinearProgram,
  Target,
  Val,
  identity,
  load_arg,
  stmt,
  store_arg,
  value_arg,
)
from tinytune.codegen.lower.rows import RowArrays
from tinytune.codegen.lower.staged import StagedTiles
from tinytune.dtype import DType, dtypes
from tinytune.shape import split_offset, strides_for
from tinytune.uop import Ops, UOp, from_linear, is_linear, linear, linear_sum, simplify


class Lowerer:
  """One kernel's lowering: statements made into `lines` (emit, value, read, store), the AST's values at an index (node, memoized
  per loop body), the register parts' instances and their dims, the reduces' accumulators and loop bodies, and program(), which
  puts them in the loops (LoopNest). Each feature that changes them is an object of its own module that owns its state: STAGE's
  tiles (StagedTiles, staged.py), PACK's panels (PackedPanels, packed.py), LANES's partial accumulators and their combines
  (LanePartials, lanes.py), the CPU's row arrays (RowArrays, rows.py) and TC pairs (DotPairs, dots.py); K blocks are a step of
  program() (kblock.py). The kernels lowered as a whole (tensor_cores.py, attention.py, flash.py) take their values from one."""
  def __init__(self, k: Kernel, target: Target, rows: bool):
    self.k, self.target, self.bufs = k, target, {b: i + 1 for i, b in enumerate(k.bufs)}
    self.lines: list[UOp] = []  # where statements go now: a loop body, or what follows the loops
    self.decls: list[UOp] = []  # before the loops: accumulators, arrays
    self.count = 0  # values made so far: the next one's name
    self.memo: dict[tuple, Val] = {}  # the values made in `lines`, by node and index (reset with it)
    self.simplified: dict[UOp, UOp] = {}  # index math is simplified once per kernel, however many lanes and instances share it
    self.view_indices: dict[tuple, tuple[UOp, UOp, tuple[UOp, ...]]] = {}
    # the reduces: each accumulator (reduce, the output index that made it, its value), where each is, and the dims of the output
    # instance that made it; a chain's reduces run one loop each, in `stage` order
    self.accs: list[tuple[UOp, tuple[UOp, ...], Val]] = []
    self.acc_at: dict[tuple[UOp, tuple[UOp, ...]], Val] = {}
    self.acc_dims: dict[tuple[UOp, tuple[UOp, ...]], list[UOp]] = {}
    self.stage = {r: i for i, r in enumerate(k.reduceops)}
    self.in_body = False  # lowering a reduce loop's body
    self.at_dims: list[UOp] = []  # the dims (unclamped) at which add() reads the reduce's source: staged tiles are read by them
    self.unpadded = -1  # a padded dim lowered as if unpadded (split)
    self.cell: UOp | None = None  # TC: the reduce's value is this element of shared memory
    self.flags: dict[int, tuple[UOp, int]] = {}  # the CPU's CHECK flags: each one's register (a thread's) and the flag's first value
    # the features' state
    self.staged, self.packed, self.lanes = StagedTiles(self), PackedPanels(self), LanePartials(self)
    self.rows = RowArrays.of(self) if rows else None
    pair_axis = next((i for i, a in enumerate(k.axes) if a.kind is AxisKind.TC and not k.caps.has_local), -1)  # the CPU's TC
    self.dot_pairs = DotPairs(self, pair_axis) if pair_axis >= 0 else None
    # the SIMD lane axis: the innermost UPCAST part of the contiguous output dim (size-1 dims after it do not count), for outputs the
    # target computes in float32 lanes, or, where a LANES part splits a float32 reduce, that part: its lanes are partial accumulators,
    # combined after the loop
    self.width, self.lane_axis, self.vf = 1, -1, target.vector_floats
    lane_dim = next((d for d in reversed(range(k.n_global)) if k.sizes[d] > 1), -1)  # the last output dim longer than 1
    for i, a in enumerate(k.axes if k.attention is None else ()):  # attention's rows are scalars (see attention)
      if i == self.lanes.axis and k.reduceop is not None and k.reduceop.dtype == dtypes.float32 or \
         self.lanes.axis < 0 and a.kind is AxisKind.UPCAST and a.dim == lane_dim and a.stride == 1 and k.ast.dtype in self.vf:
        self.width = next((w for w in (k.caps.simd_width, 8, 4) if a.size % w == 0 and w <= k.caps.simd_width), 1)
        self.lane_axis = i if self.width > 1 else -1
    # a row written after its statistic (see Kernel.reduce_out_dims): its UPCAST along the row in vectors too, beside the reduce's lanes
    self.row_axis = next((i for i, a in enumerate(k.axes) if self.lanes.axis >= 0 and self.width > 1 and a.kind is AxisKind.UPCAST
                          and a.dim == lane_dim and a.stride == 1 and a.size % self.width == 0 and lane_dim not in k.reduce_out_dims
                          and k.ast.dtype in self.vf), -1)
    self.lane = UOp.var("lane", 0, self.width - 1)
    self.nesting = LoopNest(k)

  def simplify(self, u: UOp) -> UOp: return simplify(u, self.simplified)

  # ***** statements *****
  def emit(self, op: Ops, *src: UOp, arg: object = None, dtype: DType = dtypes.void) -> UOp:
    self.lines.append(u := UOp.unique(op, dtype, src, arg))
    return u

  def value(self, op: Ops, dtype: DType, src: tuple[UOp, ...], width: int = 1, prefix: str = "v") -> UOp:
    self.count += 1
    return self.emit(op, *src, arg=value_arg(prefix, self.count, width), dtype=dtype)

  def vec(self, v: Val) -> UOp:
    if v.kind is not Kind.LANES: return v.items[0]  # scalars mix with vectors in the C vector operators
    return self.value(Ops.VECTORIZE, dtypes.float32, v.items, self.width)

  def splat(self, v: Val) -> UOp:
    """A float32 value as a native vector: a scalar repeated in every lane."""
    return UOp.unique(Ops.VECTORIZE, dtypes.float32, v.items * self.width) if v.kind is Kind.SCALAR else self.vec(v)

  def mask(self, v: Val) -> UOp:
    """A bool value as a vector of -1 (true) and 0 lanes."""
    if v.kind is Kind.VECTOR: return v.items[0]
    return self.value(Ops.VECTORIZE, dtypes.bool, tuple(v.lane(i) for i in range(self.width)), self.width)

  def vectorizable(self, base: UOp) -> bool:
    """Whether a vector access may start at index `base` (aligned where the device needs it: the GPUs' 16-byte accesses)."""
    return not self.target.aligned_vectors or self.simplify(base % self.width) is UOp.const(base.dtype, 0)

  def subst_lane(self, u: UOp, i: int) -> UOp:
    if not (u.dtype.is_int and is_linear(u)): return self.simplify(u.substitute({self.lane: UOp.const(dtypes.int64, i)}))
    terms, c = linear(u)  # the lane's term joins the constant, as simplify would fold it
    return from_linear(u.dtype, {t: v for t, v in terms.items() if t is not self.lane}, c + terms.get(self.lane, 0) * i)
  def lane_dep(self, *us: UOp) -> bool: return self.width > 1 and any(self.lane in u.vars for u in us)
  def contiguous(self, off: UOp, base: UOp) -> bool: return self.simplify(off - base) is self.lane and self.vectorizable(base)

  def index_val(self, u: UOp) -> Val:
    if not self.lane_dep(u): return Val(Kind.SCALAR, (u,))
    return Val(Kind.LANES, tuple(self.subst_lane(u, i) for i in range(self.width)))

  # ***** dims *****
  def dims(self, inst: dict[int, UOp]) -> list[UOp]:
    """Each kernel dim's index: loop variables, plus the register parts fixed by `inst` (0 where it has none)."""
    zero = UOp.const(dtypes.int64, 0)
    def parts(d: int) -> list[tuple[UOp, int]]:
      return [(self.nesting.vars[i] if i in self.nesting.vars else inst.get(i, zero), a.stride) for i, a in enumerate(self.k.axes) if a.dim == d]
    return [linear_sum(dtypes.int64, parts(d), 0, self.simplified) for d in range(len(self.k.sizes))]

  def clamp(self, d: int, e: UOp) -> UOp:
    """Padded dims index memory clamped to the last real element; the store and the reduce mask the padding."""
    if d not in self.k.padded or d == self.unpadded: return e
    real = self.k.padded[d]
    return self.simplify(UOp(Ops.WHERE, e.dtype, (e.lt(real), e, UOp.const(e.dtype, real - 1))))

  def guard(self, dims: list[UOp], which: range) -> UOp:
    g = TRUE
    for d in which:
      if d in self.k.padded and d != self.unpadded: g = g.logical_and(dims[d].lt(self.k.padded[d]))
    return self.simplify(g)

  def instances(self, kinds: tuple[AxisKind, ...]) -> list[dict[int, UOp]]:
    """The register parts' values, each dim's outer part first, so an unrolled reduce over one dim adds in memory order."""
    axes = sorted((i for i, a in enumerate(self.k.axes) if a.kind in kinds), key=lambda i: (self.k.axes[i].dim, -self.k.axes[i].stride))
    lane_axes = (self.lane_axis, self.row_axis)
    ranges = [range(0, self.k.axes[i].size, self.width if i in lane_axes else 1) for i in axes]
    return [{i: UOp.const(dtypes.int64, v) + (self.lane if i in lane_axes else 0) for i, v in zip(axes, vals)}
            for vals in itertools.product(*ranges)]

  def view_index(self, view: UOp, idx: tuple[UOp, ...]) -> tuple[UOp, UOp, tuple[UOp, ...]]:
    """A view's simplified offset and validity at `idx`, and the index of its source (where that is not a buffer), computed once
    for the indices the view reads (not those of stride 0 and no mask)."""
    v = view.arg
    used = tuple(i if st != 0 or (v.mask is not None and v.mask[d] != (0, v.shape[d])) else None for d, (i, st) in enumerate(zip(idx, v.strides)))
    if (key := (view, used)) not in self.view_indices:
      valid = TRUE if v.mask is None else self.simplify(v.index(idx)[1])
      off, src = linear_sum(dtypes.int64, [(i, st) for i, st in zip(idx, v.strides) if st != 0], v.offset, self.simplified), view.src[0]
      child = () if src.op is Ops.BUFFER else split_offset(off, src.shape, self.simplify)
      self.view_indices[key] = (off, valid, child)
    return self.view_indices[key]

  # ***** values *****
  def node(self, u: UOp, idx: tuple[UOp, ...]) -> Val:
    key = (u, idx)
    if key in self.memo: return self.memo[key]
    if u.op is Ops.CONST: ret = Val(Kind.SCALAR, (u,))
    elif u.op is Ops.VIEW:
      off, valid, child = self.view_index(u, idx)
      if valid.op is Ops.CONST and not valid.arg: ret = Val(Kind.SCALAR, (UOp.const(u.dtype, 0),), padding=True)
      elif self.in_body and u in self.staged.tiles: ret = self.staged.read(u)
      elif self.in_body and u in self.packed.panels: ret = self.packed.read(u)
      elif (src := u.src[0]).op is Ops.BUFFER:
        if (lkey := (src, off, valid)) not in self.memo: self.memo[lkey] = self.load(src, off, valid)
        ret = self.memo[lkey]
      else:
        ret = self.node(src, child)
        if valid is not TRUE: ret = self.alu(Ops.WHERE, u.dtype, [self.index_val(valid), ret, Val(Kind.SCALAR, (UOp.const(u.dtype, 0),))])
    elif u.op is Ops.REDUCE: ret = self.acc(u, idx)
    elif self.rows is not None and u is self.rows.source and not self.in_body and self.rows.holds(idx): ret = self.rows.load(idx)
    elif u.op is Ops.CONTIGUOUS: ret = self.node(u.src[0], idx)
    elif u.op is Ops.GATHER: ret = self.gather(u, idx)
    elif u.op is Ops.CHECK: ret = self.check(u, idx)
    else: ret = self.alu(u.op, u.dtype, [self.node(s, idx) for s in u.src], [s.dtype for s in u.src])
    self.memo[key] = ret
    return ret

  def gather(self, u: UOp, idx: tuple[UOp, ...]) -> Val:
    """x at idx but for dim d, whose index is the value of the index expression there: a variable clamped into range, the read
    zeroed where it was out of range. Where that value differs by lane, each lane reads on its own."""
    d, n = u.arg, u.src[0].shape[u.arg]
    at = self.node(u.src[1], idx)
    lanes = [idx] if at.kind is Kind.SCALAR else [tuple(self.subst_lane(e, i) for e in idx) for i in range(self.width)]
    vals, oks = [], []
    for i, lane_idx in enumerate(lanes):
      ok = self.value(Ops.INRANGE, dtypes.bool, (at.lane(i), UOp.const(dtypes.int64, n)))
      var = UOp.var(self.value(Ops.DEFINE_VAR, dtypes.int64, (ok, at.lane(i)), prefix="at").arg.name, 0, max(n - 1, 0))
      vals.append(self.node(u.src[0], lane_idx[:d] + (var,) + lane_idx[d + 1:]))
      oks.append(ok)
    val = vals[0] if at.kind is Kind.SCALAR else Val(Kind.LANES, tuple(v.lane(0) for v in vals))
    ok_val = Val(Kind.SCALAR, (oks[0],)) if at.kind is Kind.SCALAR else Val(Kind.LANES, tuple(oks))
    return self.alu(Ops.WHERE, u.dtype, [ok_val, val, Val(Kind.SCALAR, (UOp.const(u.dtype, 0),))], [dtypes.bool, u.dtype, u.dtype])

  def check(self, u: UOp, idx: tuple[UOp, ...]) -> Val:
    """CHECK's value, and a store of each lane's value outside [lo, hi) into the flag (threads that find one race to store theirs:
    the flag ends up holding one of them). On the CPU (loops lowered by program()) a lane's value out of range goes into a register
    the thread stores once after its loops (flag_registers): a store in the loop kept GCC from vectorizing it."""
    val, (lo, hi), buf, dt = self.node(u.src[0], idx), u.arg, self.bufs[u.src[1].arg], u.src[1].dtype  # the flag's: int32 or int64
    kept = not self.target.has_local and self.k.attention is None
    if kept and buf not in self.flags:
      self.flags[buf] = (stmt(Ops.DEFINE_ACC, UOp.const(dt, lo), arg=AccArg(f"flag{buf}", 1, Ops.WHERE), dtype=dt), lo)
    for i in range(1 if val.kind is Kind.SCALAR else self.width):
      v = val.lane(i) if u.dtype == dt else self.value(Ops.CAST, dt, (val.lane(i),))
      below, above = self.value(Ops.CMPLT, dtypes.bool, (v, UOp.const(dt, lo))), self.value(Ops.CMPLT, dtypes.bool, (UOp.const(dt, hi - 1), v))
      bad = self.value(Ops.OR, dtypes.bool, (below, above))
      if kept: self.emit(Ops.ASSIGN, flag := self.flags[buf][0], self.value(Ops.WHERE, dt, (bad, v, flag)), TRUE)
      else:  # a guard is index math: the value by its name
        self.emit(Ops.STORE, UOp.const(dtypes.int64, 0), v, UOp.var(bad.arg.name, 0, 1), arg=store_arg(1, buf, False, "", True), dtype=dt)
    return val

  def flag_registers(self) -> tuple[list[UOp], list[UOp]]:
    """The CPU's CHECK flag registers (see check): their declarations, first in a thread's share, and the stores of those that hold a
    value out of range, last in it."""
    lines, self.lines = self.lines, []
    for buf, (flag, lo) in self.flags.items():
      bad = UOp.var(self.value(Ops.CMPNE, dtypes.bool, (flag, UOp.const(flag.dtype, lo))).arg.name, 0, 1)
      self.emit(Ops.STORE, UOp.const(dtypes.int64, 0), flag, bad, arg=store_arg(1, buf, False, "", True), dtype=flag.dtype)
    stores, self.lines = self.lines, lines
    return [flag for flag, _ in self.flags.values()], stores

  def alu(self, op: Ops, dtype: DType, srcs: list[Val], src_dtypes: list[DType] | None = None) -> Val:
    if op is Ops.ADD and (kept := [s for s in srcs if not s.padding]) != srcs: return kept[0] if kept else srcs[0]  # a cat's piece alone
    if all(s.kind is Kind.SCALAR for s in srcs): return Val(Kind.SCALAR, (self.value(op, dtype, tuple(s.items[0] for s in srcs)),))
    floats = src_dtypes or ([dtypes.bool, dtype, dtype] if op is Ops.WHERE else [dtype])
    if op in self.target.vector_ops and all(d in self.vf for d in floats[op is Ops.WHERE:]) and (dtype in self.vf or op in CMP):
      if op is Ops.WHERE: args = (self.mask(srcs[0]), *(self.splat(s) for s in srcs[1:]))
      else: args = tuple(self.vec(s) if op in ARITH else self.splat(s) for s in srcs)  # operators take scalars beside vectors
      return Val(Kind.VECTOR, (self.value(op, dtype, args, self.width),))
    return Val(Kind.LANES, tuple(self.value(op, dtype, tuple(s.lane(i) for s in srcs)) for i in range(self.width)))

  def load(self, buf: UOp, off: UOp, valid: UOp) -> Val: return self.read(buf.dtype, self.bufs[buf.arg], off, valid)

  def read(self, dtype: DType, buf: int | str, off: UOp, valid: UOp) -> Val:
    def value(off: UOp, valid: UOp, width: int = 1) -> UOp:
      self.count += 1
      return self.emit(Ops.LOAD, off, valid, arg=load_arg(self.count, width, buf), dtype=dtype)
    if not self.lane_dep(off, valid): return Val(Kind.SCALAR, (value(off, valid),))
    base = self.subst_lane(off, 0)
    if dtype in self.vf and not self.lane_dep(valid) and self.contiguous(off, base):
      return Val(Kind.VECTOR, (value(base, valid, self.width),))
    return Val(Kind.LANES, tuple(value(self.subst_lane(off, j), self.subst_lane(valid, j)) for j in range(self.width)))

  def define_acc(self, red: UOp, name: str, width: int = 1) -> UOp:
    self.decls.append(u := stmt(Ops.DEFINE_ACC, identity(red), arg=AccArg(name, width, red.arg[0]), dtype=red.dtype))
    return u

  def acc(self, red: UOp, idx: tuple[UOp, ...]) -> Val:
    if self.cell is not None: return Val(Kind.SCALAR, (self.cell,))
    if (ret := self.acc_at.get((red, idx))) is not None: return ret  # a chain's earlier statistic, read by a later reduce's loop
    self.count += 1
    name = f"acc{self.count}"
    if self.lanes.axis >= 0: ret = self.lanes.acc(red, name)
    elif not self.lane_dep(*idx): ret = Val(Kind.SCALAR, (self.define_acc(red, name),))
    elif red.dtype == dtypes.float32 and red.arg[0] is Ops.ADD: ret = Val(Kind.VECTOR, (self.define_acc(red, name, self.width),))
    else: ret = Val(Kind.LANES, tuple(self.define_acc(red, f"{name}_{i}") for i in range(self.width)))
    self.accs.append((red, idx, ret))
    self.acc_at[(red, idx)] = ret
    return ret

  def reduce_index(self, idx: tuple[UOp, ...], dims: list[UOp]) -> tuple[UOp, ...]:
    """The reduce's source index: the output's `idx` with the reduce dims at `dims`."""
    in_idx = list(idx)
    for j, a in enumerate(self.k.reduce_axes): in_idx[a] = self.clamp(self.k.n_global + j, dims[self.k.n_global + j])
    return tuple(in_idx)

  def accumulate(self, red: UOp, idx: tuple[UOp, ...], acc: Val, dims: list[UOp], inst: dict[int, UOp]) -> None:
    if self.dot_pairs is not None: self.dot_pairs.accumulate(red, idx, acc, dims, inst)
    else: self.add(red, idx, acc, dims, inst)

  def add(self, red: UOp, idx: tuple[UOp, ...], acc: Val, dims: list[UOp], inst: dict[int, UOp]) -> None:
    """acc op= the reduce's source at the reduce dims' `dims` (`inst`: the register parts' values)."""
    k, op = self.k, red.arg[0]
    in_idx = self.reduce_index(idx, dims)
    self.at_dims = self.acc_dims.get((red, idx), dims)[:k.n_global] + dims[k.n_global:]
    val, g = self.node(red.src[0], in_idx), self.guard(dims, range(k.n_global, len(k.sizes)))
    if red is k.reduceop and self.rows is not None and self.rows.row_of(in_idx) in self.rows.arrays: self.rows.write(in_idx, g)
    if g is not TRUE:
      val = self.alu(Ops.WHERE, red.dtype, [self.index_val(g), val, Val(Kind.SCALAR, (identity(red),))])
    acc = self.lanes.partial(acc, inst)
    if acc.kind is Kind.VECTOR: self.emit(Ops.ASSIGN, acc.items[0], self.vec(val) if op is Ops.ADD else self.splat(val), TRUE, arg=op)
    else:
      for i, u in enumerate(acc.items): self.emit(Ops.ASSIGN, u, val.lane(i), TRUE, arg=op)

  def store(self, val: Val, off: UOp, guard: UOp, buf: int | str = 0, dtype: DType | None = None, stream: bool = False) -> None:
    """Store `val` at `off` where `guard` holds; `stream`: a vector store of a whole 64-byte line, or of half of one where the next
    store writes the other half (see half_lines), goes past the caches (the CPU's)."""
    dt = dtype or self.k.ast.dtype
    if self.lane_dep(off) and val.kind is not Kind.SCALAR or self.lane_dep(off, guard):
      base = self.subst_lane(off, 0)
      if val.kind is Kind.VECTOR and not self.lane_dep(guard) and self.contiguous(off, base):
        stream = stream and not self.target.has_local and (self.width * dt.itemsize == 64 or self.half_lines and dt == dtypes.float32)
        self.emit(Ops.STORE, base, val.items[0], guard, arg=store_arg(self.width, buf, stream), dtype=dt)
        return
      for i in range(self.width):
        self.emit(Ops.STORE, self.subst_lane(off, i), val.lane(i), self.subst_lane(guard, i), arg=store_arg(1, buf, False), dtype=dt)
      return
    self.emit(Ops.STORE, off, val.lane(0), guard, arg=store_arg(1, buf, False), dtype=dt)

  @functools.cached_property
  def half_lines(self) -> bool:
    """8 float32 lanes whose output part along its contiguous dim spans whole 64-byte lines: each line's two vectors stored one after
    the other (the register parts' instances, see instances), so that a CPU's write-combining joins them into a whole line."""
    axis = self.row_axis if self.row_axis >= 0 else self.lane_axis
    return self.width == 8 and axis >= 0 and self.k.axes[axis].kind is AxisKind.UPCAST and self.k.axes[axis].size % 16 == 0

  def out_offset(self, dims: list[UOp]) -> UOp:
    return self.simplify(sum((dims[d] * st for d, st in enumerate(strides_for(self.k.out_shape)) if st), UOp.const(dtypes.int64, 0)))

  # ***** the kernel *****
  def program(self) -> LinearProgram:
    k = self.k
    partials: list[tuple[Val, UOp, UOp]] = []  # with KBLOCK: each instance's accumulator, and where its output goes
    for inst in self.instances((AxisKind.UPCAST,)):
      dims = self.dims(inst)
      n_accs = len(self.accs)
      val = self.node(k.ast, tuple(self.clamp(d, dims[d]) for d in range(k.n_global)))
      self.store(val, off := self.out_offset(dims), self.guard(dims, range(k.n_global)), stream=k.stream)
      partials += [(acc, off, self.guard(dims, range(k.n_global))) for _, _, acc in self.accs[n_accs:]]
      self.acc_dims.update({(red, idx): dims for red, idx, _ in self.accs[n_accs:]})
    post, bodies, full_bodies = self.lines, self.reduce_bodies(), list[list[UOp]]()
    if (split := self.split) is not None:  # the iterations with no padding: no clamps, no masks, whole vector loads
      self.unpadded = k.axes[split].dim
      full_bodies, self.unpadded = self.reduce_bodies(), -1
    if any(a.kind is AxisKind.KBLOCK for a in k.axes): post = kblocked(self, post, partials)
    self.lanes.fold_all()  # every accumulator made: the output's, and the earlier statistics of a chain (made by the later loops)
    in_order = any(u.op is Ops.DEFINE_ACC and u.arg.width == 1 and u.dtype.is_float and u.arg.op is Ops.ADD for u in self.decls)
    tile = k.reduceop is None and len({a.dim for a in k.axes if a.kind is AxisKind.UPCAST}) > 1
    # STAGE: the first tile's copy, and each tile's (PREFETCH: the next tile's loads before the compute, its stores after)
    copies = self.staged.copies()
    if self.target.has_local: uops = self.nesting.workgroups(bodies, self.lanes.combine, self.decls, self.accs, self.width, post, copies)
    else: uops = self.nesting.cpu(bodies, full_bodies, split, self.lanes.combine, self.decls, post, self.packed.copies(), self.flag_registers())
    return LinearProgram(k, self.width, uops, in_order or tile)

  def reduce_bodies(self) -> list[list[UOp]]:
    """Each reduce loop's body. A chain's later reduce reads the earlier ones' values: lowered first, it makes their accumulators."""
    bodies: list[list[UOp]] = [[] for _ in self.k.reduceops]
    for stage in reversed(range(len(bodies))):
      self.lines, self.memo, self.in_body = bodies[stage], {}, True
      if self.dot_pairs is not None: self.dot_pairs.names.clear()  # pairs are made once per reduce body
      for inst in self.instances((AxisKind.UNROLL, AxisKind.LANES, AxisKind.TC)):
        dims = self.dims(inst)
        for red, idx, acc in list(self.accs):
          if self.stage[red] == stage: self.accumulate(red, idx, acc, dims, inst)
    self.in_body = False
    return bodies

  @functools.cached_property
  def split(self) -> int | None:
    """On the CPU, the loop of a padded reduce dim whose other parts are all inside it (UNROLL, LANES; not KBLOCK): its iterations
    before the padding run a body without clamps and masks, the rest the full one."""
    k = self.k
    if self.target.has_local: return None
    blocked = {a.dim for a in k.axes if a.kind is AxisKind.KBLOCK}
    for i, a in enumerate(k.axes):
      if a.kind is AxisKind.REDUCE and a.dim in k.padded and a.dim not in blocked and a.size > 1 and k.padded[a.dim] // a.stride > 0: return i
    return None
