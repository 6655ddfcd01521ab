"""The C-style renderer family: one walk over a kernel emits C; dialects set types, qualifiers and prefixes.

Register parts of the kernel (UPCAST, UNROLL) are expanded into straight-line code. One UPCAST part along the
contiguous output axis becomes SIMD lanes: a value is one scalar for all lanes, one native vector, or one
scalar per lane, whichever the loads and ops allow."""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tinytune.codegen.kernel import LOOPS, AxisKind, Kernel
from tinytune.dtype import DType, dtypes
from tinytune.shape import strides_for
from tinytune.uop import Ops, UOp, from_linear, is_linear, linear, linear_sum, simplify

TRUE = UOp.const(dtypes.bool, True)


@dataclass(frozen=True)
class Val:
  """A rendered value: kind "s" (one scalar for every lane), "v" (a native vector), "l" (a scalar per lane)."""
  kind: str
  names: tuple[str, ...]
  lane_fmt: str = "{}[{}]"  # a native vector's lane i
  padding: bool = False  # a zero that a pad put where its view's mask is false here (a cat's other pieces): adding it is a no-op

  def lane(self, i: int) -> str:
    return self.names[0] if self.kind == "s" else self.lane_fmt.format(self.names[0], i) if self.kind == "v" else self.names[i]


class CStyleRenderer:
  types = {dtypes.bool: "_Bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short", dtypes.uint16: "unsigned short",
           dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long", dtypes.uint64: "unsigned long",
           dtypes.float16: "_Float16", dtypes.bfloat16: "float", dtypes.float32: "float", dtypes.float64: "double"}
  # where a buffer's element type differs from its value type: bfloat16 is stored as its 16 bits and computed in float32
  buffer_types: dict[DType, str] = {dtypes.bfloat16: "unsigned short"}
  index_type = "long"  # loop variables and index math
  restrict = "restrict"
  buffer_prefix = ""  # an address space for buffers
  func_prefix = "static inline"  # helper functions
  in_order_reduce_prefix = ""  # before kernels that add floats into a scalar accumulator, in order
  vector_ops = {Ops.ADD, Ops.MUL, Ops.NEG, Ops.RECIP}  # ops with native float32 vector code
  includes = "#include <math.h>\n"
  inf, nan = "INFINITY", "NAN"
  math, math_suffix = "", "f"  # float32 math functions: exp2f, ...
  # devices with workgroups: the global loops become workgroups, LOCAL and GROUP parts the threads of one
  has_local = False
  group_id, local_id, barrier, shared_prefix = "", "", "", ""

  def kernel_head(self, name: str, args: list[str], threads: int) -> str: return f"void {name}({', '.join(args)})"
  bf16_in, bf16_out = "tt_bf16_to_f32", "tt_f32_to_bf16"  # bfloat16's storage to float32, and float32 rounded to nearest even to storage

  def load(self, ptr: str, idx: str, dtype: DType) -> str: return f"{self.bf16_in}({ptr}[{idx}])" if dtype == dtypes.bfloat16 else f"{ptr}[{idx}]"
  def store(self, ptr: str, idx: str, val: str, dtype: DType) -> str:
    return f"{ptr}[{idx}] = {f'{self.bf16_out}({val})' if dtype == dtypes.bfloat16 else val};"

  def to_bits(self, x: str, dtype: DType) -> str:
    """A value as its buffer's element type (a 16-bit float computed in float32 rounded to its 16 bits)."""
    return f"{self.bf16_out}({x})" if dtype == dtypes.bfloat16 else x
  def from_bits(self, x: str, dtype: DType) -> str: return f"{self.bf16_in}({x})" if dtype == dtypes.bfloat16 else x
  def reinterpret(self, x: str, src: str, dst: str) -> str:
    return f"({{ {src} tt_a = {x}; {dst} tt_b; __builtin_memcpy(&tt_b, &tt_a, sizeof tt_b); tt_b; }})"
  def bitcast(self, x: str, src: DType, dst: DType) -> str:
    """x's bits, as stored in a buffer of `src`, read as `dst`."""
    st, dt = (self.buffer_types.get(d, self.types[d]) for d in (src, dst))
    return self.from_bits(self.reinterpret(self.to_bits(x, src), st, dt), dst)

  def bits_prelude(self) -> str:
    """tt_f32_bits and tt_bits_f32: a float32's bits as an unsigned int and back."""
    fp = self.func_prefix
    return (f"{fp} unsigned int tt_f32_bits(float f) {{ unsigned int u; __builtin_memcpy(&u, &f, 4); return u; }}\n"
            f"{fp} float tt_bits_f32(unsigned int u) {{ float f; __builtin_memcpy(&f, &u, 4); return f; }}\n")

  def bf16_prelude(self) -> str:
    """bfloat16 <-> float32 by bits: round to nearest even, a NaN becomes the quiet NaN of its sign (as ml_dtypes does)."""
    fp, st = self.func_prefix, self.buffer_types[dtypes.bfloat16]
    return self.bits_prelude() + (
      f"{fp} float tt_bf16_to_f32({st} h) {{ return tt_bits_f32((unsigned int)h << 16); }}\n"
      f"{fp} {st} tt_f32_to_bf16(float f) {{ unsigned int u = tt_f32_bits(f); "
      f"return ({st})((u & 0x7fffffff) > 0x7f800000 ? ((u >> 16) & 0x8000) | 0x7fc0 : (u + 0x7fff + ((u >> 16) & 1)) >> 16); }}\n")

  def prelude(self, k: Kernel) -> str:
    it, fp = self.index_type, self.func_prefix
    bf16 = self.bf16_prelude() if dtypes.bfloat16 in _dtypes(k) else ""
    return self.includes + bf16 + (f"{fp} {it} tt_fdiv({it} a, {it} b) {{ {it} q = a / b; return q - ((a % b != 0) && ((a < 0) != (b < 0))); }}\n"
                                   f"{fp} {it} tt_fmod({it} a, {it} b) {{ {it} r = a % b; return r + ((r != 0) && ((r < 0) != (b < 0))) * b; }}\n")

  lane_fmt = "{}[{}]"
  aligned_vectors = False  # vector loads and stores need addresses aligned to the vector

  def vtype(self, width: int) -> str: return f"tt_f{width}"
  def mask_type(self, width: int) -> str: return f"tt_i{width}"
  mask_lane_fmt = "(-{}[{}])"  # a mask lane as 1 or 0
  def vector_code(self, op: Ops, args: Sequence[str], width: int) -> str:
    """Vector code for the ops past the arithmetic ones: comparisons give masks, WHERE takes one."""
    raise NotImplementedError(f"{type(self).__name__} has no vector {op.name}")
  def vector(self, vt: str, items: list[str]) -> str: return f"({vt}){{{', '.join(items)}}}"
  def vector_prelude(self, width: int) -> str:
    vt = self.vtype(width)
    return (f"typedef float {vt} __attribute__((vector_size({4 * width})));\n"
            f"{self.func_prefix} {vt} {vt}_load(const float* p) {{ {vt} v; __builtin_memcpy(&v, p, sizeof v); return v; }}\n"
            f"{self.func_prefix} void {vt}_store(float* p, {vt} v) {{ __builtin_memcpy(p, &v, sizeof v); }}\n")

  def literal(self, v: object, dtype: DType) -> str:
    if dtype == dtypes.bool: return "1" if v else "0"
    if dtype.is_int:  # negative literals in parentheses, so negating one renders (-(-3)), not (--3)
      i = int(v)  # type: ignore[call-overload]
      if dtype.itemsize == 8: text = f"{i}UL" if dtype.is_unsigned else f"{i}L" if i > -2**63 else f"{i + 1}L-1"  # -2**63 has no literal
      else: text = f"{i}u" if dtype == dtypes.uint32 else str(i)
      return f"({text})" if i < 0 else text
    f = float(v)  # type: ignore[arg-type]
    if dtype.itemsize == 2:  # a 16-bit float constant is the value it rounds to
      with np.errstate(over="ignore"): f = float(dtype.np(f))
    if math.isnan(f): return self.nan
    if math.isinf(f): return self.inf if f > 0 else f"(-{self.inf})"
    text = f"{f!r}" if dtype == dtypes.float64 else f"{f!r}f"
    return f"(({self.types[dtype]}){text})" if dtype.itemsize == 2 else f"({text})" if f < 0 else text

  # each op's spelling: {0}, {1}, {2} are the operands, {m} and {s} the float32 math functions' prefix and suffix
  code_table = {
    Ops.NEG: "(-{0})", Ops.EXP2: "{m}exp2{s}({0})", Ops.LOG2: "{m}log2{s}({0})", Ops.SIN: "{m}sin{s}({0})", Ops.SQRT: "{m}sqrt{s}({0})",
    Ops.RECIP: "(1.0f/{0})", Ops.ADD: "({0}+{1})", Ops.MUL: "({0}*{1})", Ops.IDIV: "({0}/{1})", Ops.MOD: "({0}%{1})",
    Ops.MAX: "({0}>{1}?{0}:{1})", Ops.CMPLT: "({0}<{1})", Ops.CMPNE: "({0}!={1})", Ops.AND: "({0}&{1})",
    Ops.OR: "({0}|{1})", Ops.XOR: "({0}^{1})", Ops.WHERE: "({0}?{1}:{2})",
  }

  def code(self, op: Ops, args: Sequence[str], dtype: DType) -> str:
    a = args[0]
    if op is Ops.CAST: return f"{self.bf16_in}({self.bf16_out}((float)({a})))" if dtype == dtypes.bfloat16 else f"(({self.types[dtype]})({a}))"
    if op is Ops.MAX and dtype.is_float: return f"(({a}>{args[1]}||{a}!={a})?{a}:{args[1]})"  # a NaN in either operand wins, as in numpy
    return self.code_table[op].format(*args, "", "", m=self.math, s="" if dtype == dtypes.float64 else self.math_suffix)

  def index(self, u: UOp, memo: dict[UOp, str] | None = None) -> str:
    """Render integer index math (each node once, where `memo` keeps them); division and modulo are floor operations where the
    numerator can be negative."""
    if memo is not None and (ret := memo.get(u)) is not None: return ret
    if u.op is Ops.CONST: ret = str(int(u.arg)) if u.arg >= 0 else f"({int(u.arg)})"
    elif u.op is Ops.VAR: ret = u.arg[0]
    else:
      s = [self.index(x, memo) for x in u.src]
      if u.op in (Ops.IDIV, Ops.MOD) and u.src[0].vmin < 0: ret = f"tt_f{'div' if u.op is Ops.IDIV else 'mod'}({s[0]},{s[1]})"
      else: ret = f"({s[0]}&&{s[1]})" if u.op is Ops.AND else self.code(u.op, s, u.dtype)
    if memo is not None: memo[u] = ret
    return ret

  def render(self, k: Kernel) -> str: return _KernelRender(self, k).source()


class _KernelRender:
  def __init__(self, r: CStyleRenderer, k: Kernel):
    self.r, self.k, self.count = r, k, 0
    self.lines: list[str] = []
    self.memo: dict[tuple, Val] = {}
    self.simplified: dict[UOp, UOp] = {}  # index math is simplified once per render, however many lanes and instances share it
    self.index_text: dict[UOp, str] = {}
    self.view_indices: dict[tuple, tuple[UOp, UOp, tuple[UOp, ...]]] = {}
    self.accs: list[tuple[UOp, tuple[UOp, ...], Val]] = []
    self.unpadded, self.full_body = -1, list[str]()  # a padded dim rendered as if unpadded, and the reduce body so rendered (split)
    self.partials: dict[str, list[Val]] = {}  # a LANES reduce's accumulator: its partial accumulators, one per vector of lanes
    self.combine: list[str] = []  # after the reduce loops: each LANES accumulator from its partials
    self.decls: list[str] = []
    self.bufs = {b: i + 1 for i, b in enumerate(k.bufs)}
    # the SIMD lane axis: the innermost UPCAST part of the contiguous output dim (size-1 dims after it do not count), for float32 outputs
    # or, where a LANES part splits a float32 reduce, that part: its lanes are partial accumulators, combined after the loop
    self.width, self.lane_axis = 1, -1
    self.lanes = next((i for i, a in enumerate(k.axes) if a.kind is AxisKind.LANES), -1)
    lane_dim = next((d for d in reversed(range(k.n_global)) if k.sizes[d] > 1), -1)  # the last output dim longer than 1
    for i, a in enumerate(k.axes):
      if i == self.lanes and k.reduceop is not None and k.reduceop.dtype == dtypes.float32 or \
         self.lanes < 0 and a.kind is AxisKind.UPCAST and a.dim == lane_dim and a.stride == 1 and k.ast.dtype == dtypes.float32:
        self.width = next((w for w in (k.caps.simd_width, 8, 4) if a.size % w == 0 and w <= k.caps.simd_width), 1)
        self.lane_axis = i if self.width > 1 else -1
    self.lane = UOp.var("lane", 0, self.width - 1)
    self.vt = r.vtype(self.width)
    names = {AxisKind.GLOBAL: "g", AxisKind.REDUCE: "r", AxisKind.THREAD: "t", AxisKind.LOCAL: "l", AxisKind.GROUP: "q", AxisKind.KBLOCK: "k"}
    self.loopvars = {i: UOp.var(f"{names[a.kind]}{i}", 0, max(a.size - 1, 0)) if a.size != 1 else UOp.const(dtypes.int64, 0)
                     for i, a in enumerate(k.axes) if a.kind in names}

  def simplify(self, u: UOp) -> UOp: return simplify(u, self.simplified)
  def index(self, u: UOp) -> str: return self.r.index(u, self.index_text)

  # ***** emitting *****
  def emit(self, ctype: str, expr: str, prefix: str = "v") -> str:
    self.count += 1
    self.lines.append(f"{ctype} {prefix}{self.count} = {expr};")
    return f"{prefix}{self.count}"

  def vec(self, v: Val) -> str:
    if v.kind == "v": return v.names[0]
    if v.kind == "s": return v.names[0]  # scalars mix with vectors in C vector extensions
    return self.emit(self.vt, self.r.vector(self.vt, list(v.names)))

  def splat(self, v: Val) -> str:
    """A float32 value as a native vector: a scalar repeated in every lane."""
    return self.r.vector(self.vt, [v.names[0]] * self.width) if v.kind == "s" else self.vec(v)

  def mask(self, v: Val) -> str:
    """A bool value as a vector of -1 (true) and 0 lanes."""
    if v.kind == "v": return v.names[0]
    return self.emit(self.r.mask_type(self.width), self.r.vector(self.r.mask_type(self.width), [f"-({v.lane(i)}!=0)" for i in range(self.width)]))

  def vectorizable(self, base: UOp) -> bool:
    """Whether a vector access may start at index `base` (aligned where the dialect needs it)."""
    return not self.r.aligned_vectors or self.simplify(base % self.width) is UOp.const(base.dtype, 0)

  def subst_lane(self, u: UOp, i: int) -> UOp:
    if not (u.dtype.is_int and is_linear(u)): return self.simplify(u.substitute({self.lane: UOp.const(dtypes.int64, i)}))
    terms, c = linear(u)  # the lane's term joins the constant, as simplify would fold it
    return from_linear(u.dtype, {t: v for t, v in terms.items() if t is not self.lane}, c + terms.get(self.lane, 0) * i)
  def lane_dep(self, *us: UOp) -> bool: return self.width > 1 and any(self.lane in u.vars for u in us)

  def index_val(self, u: UOp) -> Val:
    if not self.lane_dep(u): return Val("s", (self.index(u),))
    return Val("l", tuple(self.index(self.subst_lane(u, i)) for i in range(self.width)))

  # ***** dims *****
  def dims(self, inst: dict[int, UOp]) -> list[UOp]:
    """Each kernel dim's index: loop variables, plus the register parts fixed by `inst` (0 where it has none)."""
    zero = UOp.const(dtypes.int64, 0)
    def parts(d: int) -> list[tuple[UOp, int]]:
      return [(self.loopvars[i] if i in self.loopvars else inst.get(i, zero), a.stride) for i, a in enumerate(self.k.axes) if a.dim == d]
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
    ranges = [range(0, self.k.axes[i].size, self.width if i == self.lane_axis else 1) for i in axes]
    return [{i: UOp.const(dtypes.int64, v) + (self.lane if i == self.lane_axis else 0) for i, v in zip(axes, vals)}
            for vals in itertools.product(*ranges)]

  def view_index(self, view: UOp, idx: tuple[UOp, ...]) -> tuple[UOp, UOp, tuple[UOp, ...]]:
    """A view's simplified offset and validity at `idx`, and the index of its source (where that is not a buffer), computed once
    for the indices the view reads (not those of stride 0 and no mask)."""
    v = view.arg
    used = tuple(i if st != 0 or (v.mask is not None and v.mask[d] != (0, v.shape[d])) else None for d, (i, st) in enumerate(zip(idx, v.strides)))
    if (key := (view, used)) not in self.view_indices:
      valid = TRUE if v.mask is None else self.simplify(v.index(idx)[1])
      off, src = linear_sum(dtypes.int64, [(i, st) for i, st in zip(idx, v.strides) if st != 0], v.offset, self.simplified), view.src[0]
      child = () if src.op is Ops.BUFFER else \
        tuple(self.simplify((off // st) % s) if s != 1 else UOp.const(dtypes.int64, 0) for s, st in zip(src.shape, strides_for(src.shape)))
      self.view_indices[key] = (off, valid, child)
    return self.view_indices[key]

  # ***** values *****
  def node(self, u: UOp, idx: tuple[UOp, ...]) -> Val:
    key = (u, idx)
    if key in self.memo: return self.memo[key]
    if u.op is Ops.CONST: ret = Val("s", (self.r.literal(u.arg, u.dtype),))
    elif u.op is Ops.VIEW:
      off, valid, child = self.view_index(u, idx)
      if valid.op is Ops.CONST and not valid.arg: ret = Val("s", (self.r.literal(0, u.dtype),), padding=True)
      elif (src := u.src[0]).op is Ops.BUFFER:
        if (lkey := (src, off, valid)) not in self.memo: self.memo[lkey] = self.load(src, off, valid)
        ret = self.memo[lkey]
      else:
        ret = self.node(src, child)
        if valid is not TRUE: ret = self.alu(Ops.WHERE, u.dtype, [self.index_val(valid), ret, Val("s", (self.r.literal(0, u.dtype),))])
    elif u.op is Ops.REDUCE: ret = self.acc(u, idx)
    elif u.op is Ops.CONTIGUOUS: ret = self.node(u.src[0], idx)
    elif u.op is Ops.GATHER: ret = self.gather(u, idx)
    else: ret = self.alu(u.op, u.dtype, [self.node(s, idx) for s in u.src], [s.dtype for s in u.src])
    self.memo[key] = ret
    return ret

  def gather(self, u: UOp, idx: tuple[UOp, ...]) -> Val:
    """x at idx but for dim d, whose index is the value of the index expression there: a variable clamped into range, the read
    zeroed where it was out of range. Where that value differs by lane, each lane reads on its own."""
    d, n, r = u.arg, u.src[0].shape[u.arg], self.r
    at = self.node(u.src[1], idx)
    lanes = [idx] if at.kind == "s" else [tuple(self.subst_lane(e, i) for e in idx) for i in range(self.width)]
    vals, oks = [], []
    for i, lane_idx in enumerate(lanes):
      ok = self.emit(r.types[dtypes.bool], f"(0<={at.lane(i)}&&{at.lane(i)}<{n})")
      var = UOp.var(self.emit(r.index_type, f"({ok}?{at.lane(i)}:0)", "g"), 0, max(n - 1, 0))
      vals.append(self.node(u.src[0], lane_idx[:d] + (var,) + lane_idx[d + 1:]))
      oks.append(ok)
    val = vals[0] if at.kind == "s" else Val("l", tuple(v.lane(0) for v in vals))
    ok_val = Val("s", (oks[0],)) if at.kind == "s" else Val("l", tuple(oks))
    return self.alu(Ops.WHERE, u.dtype, [ok_val, val, Val("s", (r.literal(0, u.dtype),))], [dtypes.bool, u.dtype, u.dtype])

  def alu(self, op: Ops, dtype: DType, srcs: list[Val], src_dtypes: list[DType] | None = None) -> Val:
    if op is Ops.ADD and (kept := [s for s in srcs if not s.padding]) != srcs: return kept[0] if kept else srcs[0]  # a cat's piece alone
    ctype = self.r.types[dtype]
    def code(args: list[str]) -> str:  # a 16-bit float computed in float32 rounds each result to its type
      if op is Ops.BITCAST: return self.r.bitcast(args[0], (src_dtypes or [dtype])[0], dtype)
      expr = self.r.code(op, args, dtype)
      return self.r.code(Ops.CAST, [expr], dtype) if dtype.itemsize == 2 and ctype == "float" and op is not Ops.CAST else expr
    if all(s.kind == "s" for s in srcs): return Val("s", (self.emit(ctype, code([s.names[0] for s in srcs])),))
    floats = src_dtypes or ([dtypes.bool, dtype, dtype] if op is Ops.WHERE else [dtype])
    if op in self.r.vector_ops and op is Ops.WHERE and dtype == dtypes.float32 and floats[1:] == [dtypes.float32] * 2:
      args = [self.mask(srcs[0])] + [self.splat(s) for s in srcs[1:]]
      return Val("v", (self.emit(self.vt, self.r.vector_code(op, args, self.width)),), self.r.lane_fmt)
    if op in self.r.vector_ops and dtype == dtypes.float32 and all(d == dtypes.float32 for d in floats):
      arith = op in CStyleRenderer.vector_ops  # operators take scalars beside vectors; the vector functions take vectors
      args = [self.vec(s) if arith else self.splat(s) for s in srcs]
      expr = self.r.code(op, args, dtype) if arith else self.r.vector_code(op, args, self.width)
      return Val("v", (self.emit(self.vt, expr),), self.r.lane_fmt)
    if op in self.r.vector_ops and op in (Ops.CMPLT, Ops.CMPNE) and all(d == dtypes.float32 for d in floats):  # lanes of -1 (true) or 0
      return Val("v", (self.emit(self.r.mask_type(self.width), self.r.vector_code(op, [self.splat(s) for s in srcs], self.width)),),
                 self.r.mask_lane_fmt)
    return Val("l", tuple(self.emit(ctype, code([s.lane(i) for s in srcs])) for i in range(self.width)))

  def load(self, buf: UOp, off: UOp, valid: UOp) -> Val:
    ptr, ctype, zero = f"data{self.bufs[buf.arg]}", self.r.types[buf.dtype], self.r.literal(0, buf.dtype)
    def scalar(o: UOp, v: UOp) -> str:
      load = self.r.load(ptr, self.index(o), buf.dtype)
      return load if v is TRUE else f"({self.index(v)}?{load}:{zero})"
    if not self.lane_dep(off, valid): return Val("s", (self.emit(ctype, scalar(off, valid)),))
    base = self.subst_lane(off, 0)
    if buf.dtype == dtypes.float32 and not self.lane_dep(valid) and self.simplify(off - base) is self.lane and self.vectorizable(base):
      load, zero = f"{self.vt}_load({ptr}+{self.index(base)})", self.r.vector(self.vt, ["0.0f"] * self.width)
      return Val("v", (self.emit(self.vt, load if valid is TRUE else f"({self.index(valid)}?{load}:{zero})"),), self.r.lane_fmt)
    return Val("l", tuple(self.emit(ctype, scalar(self.subst_lane(off, i), self.subst_lane(valid, i))) for i in range(self.width)))

  def acc(self, red: UOp, idx: tuple[UOp, ...]) -> Val:
    op, ctype = red.arg[0], self.r.types[red.dtype]
    ident = self.r.literal(0 if op is Ops.ADD else -math.inf if red.dtype.is_float else _dtype_min(red.dtype), red.dtype)
    self.count += 1
    if self.lanes >= 0: return self.lanes_acc(red, idx, ident)
    if not self.lane_dep(*idx): ret, decl = Val("s", (f"acc{self.count}",)), [f"{ctype} acc{self.count} = {ident};"]
    elif red.dtype == dtypes.float32 and op is Ops.ADD:
      ret, decl = Val("v", (f"acc{self.count}",), self.r.lane_fmt), [f"{self.vt} acc{self.count} = {self.r.vector(self.vt, [ident] * self.width)};"]
    else:
      ret = Val("l", tuple(f"acc{self.count}_{i}" for i in range(self.width)))
      decl = [f"{ctype} {n} = {ident};" for n in ret.names]
    self.decls += decl
    self.accs.append((red, idx, ret))
    return ret

  def vector_acc(self, op: Ops, dtype: DType) -> bool:
    return self.width > 1 and dtype == dtypes.float32 and op in self.r.vector_ops
  def lanes_acc(self, red: UOp, idx: tuple[UOp, ...], ident: str) -> Val:
    """A reduce split by LANES: a partial accumulator per vector of lanes (a vector where the dialect has the op, else a scalar per
    lane), each reading its own elements; after the loop the partials combine lane by lane into the one scalar accumulator."""
    op, ctype, name = red.arg[0], self.r.types[red.dtype], f"acc{self.count}"
    parts = []
    for j in range(self.k.axes[self.lanes].size // self.width):
      if self.vector_acc(op, red.dtype):
        parts.append(Val("v", (f"{name}_{j}",), self.r.lane_fmt))
        self.decls.append(f"{self.vt} {name}_{j} = {self.r.vector(self.vt, [ident] * self.width)};")
      else:
        parts.append(Val("l", tuple(f"{name}_{j}_{i}" for i in range(self.width))))
        self.decls += [f"{ctype} {n} = {ident};" for n in parts[-1].names]
    self.partials[name], ret = parts, Val("s", (name,))
    if parts[0].kind == "v":  # the vectors into one first, then its lanes
      vec = parts[0].names[0]
      for p in parts[1:]:
        vec = self.r.code(op, [vec, p.names[0]], red.dtype) if op is Ops.ADD else self.r.vector_code(op, [vec, p.names[0]], self.width)
      self.combine.append(f"{self.vt} {name}_v = {vec};")
      parts = [Val("v", (f"{name}_v",), self.r.lane_fmt)]
    lanes = [p.lane(i) for p in parts for i in range(self.width)]
    while len(lanes) > 2:  # a tree of named values (an operand may be spelled more than once in an op's code): neighbouring lanes first
      pairs, lanes = [lanes[i:i + 2] for i in range(0, len(lanes), 2)], []
      for pair in pairs:
        lanes.append(f"{name}_c{len(self.combine)}" if len(pair) == 2 else pair[0])
        if len(pair) == 2: self.combine.append(f"{ctype} {lanes[-1]} = {self.r.code(op, pair, red.dtype)};")
    self.combine.append(f"{ctype} {name} = {self.r.code(op, lanes, red.dtype) if len(lanes) == 2 else lanes[0]};")
    self.accs.append((red, idx, ret))
    return ret

  def accumulate(self, red: UOp, idx: tuple[UOp, ...], acc: Val, dims: list[UOp], inst: dict[int, UOp]) -> None:
    k = self.k
    in_idx = list(idx)
    for j, a in enumerate(k.reduce_axes): in_idx[a] = self.clamp(k.n_global + j, dims[k.n_global + j])
    val = self.node(red.src[0], tuple(in_idx))
    if (g := self.guard(dims, range(k.n_global, len(k.sizes)))) is not TRUE:
      ident = self.r.literal(0 if red.arg[0] is Ops.ADD else -math.inf if red.dtype.is_float else _dtype_min(red.dtype), red.dtype)
      val = self.alu(Ops.WHERE, red.dtype, [self.index_val(g), val, Val("s", (ident,))])
    if (parts := self.partials.get(acc.names[0])) is not None:  # the partial of this instance's vector of lanes
      acc = parts[int(self.subst_lane(inst[self.lanes], 0).arg) // self.width]
      if acc.kind == "v" and red.arg[0] is not Ops.ADD:
        self.lines.append(f"{acc.names[0]} = {self.r.vector_code(red.arg[0], [acc.names[0], self.splat(val)], self.width)};")
        return
    if acc.kind == "v": self.lines.append(f"{acc.names[0]} = {self.r.code(red.arg[0], [acc.names[0], self.vec(val)], red.dtype)};")
    else:
      for i, name in enumerate(acc.names): self.lines.append(f"{name} = {self.r.code(red.arg[0], [name, val.lane(i)], red.dtype)};")

  def store(self, val: Val, off: UOp, guard: UOp) -> None:
    ptr = "data0"
    if self.lane_dep(off) and val.kind != "s" or self.lane_dep(off, guard):
      base = self.subst_lane(off, 0)
      if val.kind == "v" and not self.lane_dep(guard) and self.simplify(off - base) is self.lane and self.vectorizable(base):
        line = f"{self.vt}_store({ptr}+{self.index(base)}, {val.names[0]});"
        self.lines.append(line if guard is TRUE else f"if ({self.index(guard)}) {line}")
        return
      for i in range(self.width):
        g, line = self.subst_lane(guard, i), self.r.store(ptr, self.index(self.subst_lane(off, i)), val.lane(i), self.k.ast.dtype)
        self.lines.append(line if g is TRUE else f"if ({self.index(g)}) {line}")
      return
    line = self.r.store(ptr, self.index(off), val.names[0] if val.kind == 's' else val.lane(0), self.k.ast.dtype)
    self.lines.append(line if guard is TRUE else f"if ({self.index(guard)}) {line}")

  # ***** the kernel *****
  def source(self) -> str:
    k = self.k
    out_strides = strides_for(k.out_shape)
    partials: list[tuple[Val, UOp, UOp]] = []  # with KBLOCK: each instance's accumulator, and where its output goes
    for inst in self.instances((AxisKind.UPCAST,)):
      dims = self.dims(inst)
      n_accs = len(self.accs)
      val = self.node(k.ast, tuple(self.clamp(d, dims[d]) for d in range(k.n_global)))
      off = self.simplify(sum((dims[d] * st for d, st in enumerate(out_strides) if st), UOp.const(dtypes.int64, 0)))
      self.store(val, off, self.guard(dims, range(k.n_global)))
      partials += [(acc, off, self.guard(dims, range(k.n_global))) for _, _, acc in self.accs[n_accs:]]
    post, body = self.lines, self.reduce_body()
    if (split := self.split) is not None:  # the iterations with no padding: no clamps, no masks, whole vector loads
      self.unpadded = k.axes[split].dim
      self.full_body, self.unpadded = self.reduce_body(), -1
    if any(a.kind is AxisKind.KBLOCK for a in k.axes): post = self.kblocked(post, partials)
    return self.assemble_workgroups(body, post) if self.r.has_local else self.assemble(body, post)

  def kblocked(self, post: list[str], partials: list[tuple[Val, UOp, UOp]]) -> list[str]:
    """K blocks: the output buffer holds the sums so far between blocks (apply_opt checked that each output element has its own
    accumulator, of its dtype). Each block after the first starts from them; each before the last stores them, and only the
    last runs what follows the reduce."""
    assert len(partials) == len(self.accs), "KBLOCK needs one accumulator per output element"
    kb = next(i for i, a in enumerate(self.k.axes) if a.kind is AxisKind.KBLOCK)
    var, last = self.loopvars[kb].arg[0], self.k.axes[kb].size - 1
    self.lines = []
    for acc, off, guard in partials:
      base = self.subst_lane(off, 0)
      if acc.kind == "v" and not self.lane_dep(guard) and self.simplify(off - base) is self.lane and self.vectorizable(base):
        line = f"{acc.names[0]} = {self.vt}_load(data0+{self.index(base)});"
        self.lines.append(line if guard is TRUE else f"if ({self.index(guard)}) {line}")
        continue
      names = [acc.lane_fmt.format(acc.names[0], i) for i in range(self.width)] if acc.kind == "v" else list(acc.names)
      offs = [self.subst_lane(off, i) for i in range(len(names))] if acc.kind != "s" else [off]
      guards = [self.subst_lane(guard, i) for i in range(len(names))] if acc.kind != "s" else [guard]
      for name, o, g in zip(names, offs, guards):
        line = f"{name} = {self.r.load('data0', self.index(o), self.k.ast.dtype)};"
        self.lines.append(line if g is TRUE else f"if ({self.index(g)}) {line}")
    reload, self.lines = self.lines, []
    for acc, off, guard in partials: self.store(acc, off, guard)
    stores, self.lines = self.lines, []
    self.decls += [f"if ({var} != 0) {{", *("  " + line for line in reload), "}"]
    return [f"if ({var} != {last}) {{", *("  " + line for line in stores), "} else {", *("  " + line for line in post), "}"]

  def reduce_body(self) -> list[str]:
    self.lines, self.memo = [], {}
    for inst in self.instances((AxisKind.UNROLL, AxisKind.LANES)):
      dims = self.dims(inst)
      for red, idx, acc in list(self.accs): self.accumulate(red, idx, acc, dims, inst)
    return self.lines

  @functools.cached_property
  def split(self) -> int | None:
    """On the CPU, the loop of a padded reduce dim whose other parts are all inside it (UNROLL, LANES; not KBLOCK): its iterations
    before the padding run a body without clamps and masks, the rest the full one."""
    k = self.k
    if self.r.has_local: return None
    blocked = {a.dim for a in k.axes if a.kind is AxisKind.KBLOCK}
    for i, a in enumerate(k.axes):
      if a.kind is AxisKind.REDUCE and a.dim in k.padded and a.dim not in blocked and a.size > 1 and k.padded[a.dim] // a.stride > 0: return i
    return None

  def assemble(self, body: list[str], post: list[str]) -> str:
    k, out, depth, split = self.k, [], 1, self.split
    def loop(i: int, start: int = 0) -> None:
      nonlocal depth
      if k.axes[i].size != 1:  # a size-0 loop runs no times
        var, end = self.loopvars[i].arg[0], k.axes[i].size if i != split or start else k.padded[k.axes[i].dim] // k.axes[i].stride
        out.append("  " * depth + f"for ({self.r.index_type} {var} = {start}; {var} < {end}; {var}++) {{")
        depth += 1
    def close(n: int) -> None:
      nonlocal depth
      for _ in range(n):
        depth -= 1
        out.append("  " * depth + "}")
    loops = [i for i, a in enumerate(k.axes) if a.kind is AxisKind.THREAD and a.size != 1]
    if loops: out.append("  #pragma omp parallel for schedule(static)")
    loops += [i for i, a in enumerate(k.axes) if a.kind is AxisKind.KBLOCK]  # inside the threads, which own their outputs
    loops += [next(i for i, a in enumerate(k.axes) if a.dim == d and a.kind in LOOPS) for d in k.global_order]
    for i in loops: loop(i)
    opened = sum(k.axes[i].size != 1 for i in loops)
    out += ["  " * depth + line for line in self.decls]
    red_loops = [i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE]
    def nest(loops: list[int], lines: list[str], start: int = 0) -> None:
      for n, i in enumerate(loops): loop(i, start if n == 0 else 0)
      out.extend("  " * depth + line for line in lines)
      close(sum(k.axes[i].size != 1 for i in loops))
    if split is None: nest(red_loops, body)
    else:  # the loop of the padded dim twice: its whole iterations with the body that has no masks, then the rest
      j = red_loops.index(split)
      for i in red_loops[:j]: loop(i)
      nest(red_loops[j:], self.full_body)
      nest(red_loops[j:], body, k.padded[k.axes[split].dim] // k.axes[split].stride)
      close(sum(k.axes[i].size != 1 for i in red_loops[:j]))
    out += ["  " * depth + line for line in self.combine + post]
    close(opened)
    return self.wrap(out)

  def unflatten(self, axes: list[int], linear: str) -> list[str]:
    """Declare the index of each axis from one linear id, the last axis fastest."""
    out, mult = [], 1
    for n, i in enumerate(reversed(axes)):
      size = self.k.axes[i].size
      if size > 1:
        e = linear if mult == 1 else f"({linear}/{mult})"
        out.append(f"  {self.r.index_type} {self.loopvars[i].arg[0]} = {e if n == len(axes) - 1 else f'{e}%{size}'};")
      mult *= size
    return out

  def assemble_workgroups(self, body: list[str], post: list[str]) -> str:
    """The global loops become workgroups and the LOCAL and GROUP parts their threads (GROUP parts fastest), each index
    taken apart from one linear id. Each GROUP thread reduces its share; thread 0 of a group adds the partials from shared
    memory and stores."""
    k, r = self.k, self.r
    out = self.unflatten([self.k.axes.index(k.remaining(d)) for d in k.global_order], r.group_id)
    local = sorted((i for i, a in enumerate(k.axes) if a.kind is AxisKind.LOCAL), key=lambda i: k.axes[i].dim)
    group = sorted((i for i, a in enumerate(k.axes) if a.kind is AxisKind.GROUP), key=lambda i: (k.axes[i].dim, -k.axes[i].stride))
    if local or group: out.append(f"  {r.index_type} lid = {r.local_id};")
    out += self.unflatten(local + group, "lid")
    out += ["  " + line for line in self.decls]
    red_loops = [i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE and a.size != 1]
    for depth, i in enumerate(red_loops):
      var = self.loopvars[i].arg[0]
      out.append("  " * (depth + 1) + f"for ({r.index_type} {var} = 0; {var} < {k.axes[i].size}; {var}++) {{")
    out += ["  " * (len(red_loops) + 1) + line for line in body]
    out += ["  " * depth + "}" for depth in range(len(red_loops), 0, -1)]
    out += ["  " + line for line in self.combine]
    if (groups := k.sizes_of(AxisKind.GROUP)) > 1:
      threads = k.launch_dims[1]
      partials = [(red, acc.lane(i) if acc.kind == "v" else name) for red, _, acc in self.accs
                  for i, name in enumerate(acc.names * self.width if acc.kind == "v" else acc.names)]
      out.append(f"  {r.shared_prefix}{r.types[partials[0][0].dtype]} partials[{len(partials) * threads}];")
      out += [f"  partials[{j * threads}+lid] = {name};" for j, (_, name) in enumerate(partials)]
      out += [f"  {r.barrier}", f"  if (lid%{groups} != 0) return;", f"  for ({r.index_type} q = 1; q < {groups}; q++) {{"]
      out += [f"    {name} = {r.code(red.arg[0], [name, f'partials[{j * threads}+lid+q]'], red.dtype)};" for j, (red, name) in enumerate(partials)]
      out.append("  }")
    out += ["  " + line for line in post]
    return self.wrap(out)

  def wrap(self, out: list[str]) -> str:
    r, k = self.r, self.k
    def ptr(dt: DType) -> str: return f"{r.buffer_prefix}{r.buffer_types.get(dt, r.types[dt])}* {r.restrict}"
    args = [f"{ptr(k.ast.dtype)} data0"] + [f"const {ptr(b.dtype)} data{i}" for b, i in self.bufs.items()]
    head = r.prelude(k) + (r.vector_prelude(self.width) if self.width > 1 else "")
    accs = [(red, p) for red, _, acc in self.accs for p in self.partials.get(acc.names[0], [acc])]
    if any(acc.kind != "v" and red.dtype.is_float and red.arg[0] is Ops.ADD for red, acc in accs): head += r.in_order_reduce_prefix
    return f"{head}{r.kernel_head(k.name, args, k.launch_dims[1])} {{\n" + "\n".join(out) + "\n}\n"


def _dtype_min(dt: DType) -> int: return int(dtypes.min(dt))


def _f32(x: float) -> str: return f"{float(np.float32(x))!r}f"


# 2**f = e**(f ln 2) on [-1/2, 1/2]: its Taylor coefficients (ln 2)**k / k!; the degree-7 remainder is under 1e-8 relative
EXP2_POLY = [_f32(math.log(2) ** i / math.factorial(i)) for i in range(8)]
# sin and cos on [-pi/4, pi/4]: Taylor coefficients (-1)**k / (2k+1)! and (-1)**k / (2k)!; remainders under 3e-9 relative
SIN_POLY = [_f32((-1) ** j / math.factorial(2 * j + 1)) for j in range(5)]
COS_POLY = [_f32((-1) ** j / math.factorial(2 * j)) for j in range(6)]


def _split(x: float, bits: int) -> float:  # x cut to its leading `bits` significant bits
  return math.ldexp(math.floor(math.ldexp(x, bits - math.frexp(x)[1])), math.frexp(x)[1] - bits)


# pi/2 as hi + mid + lo in double, hi and mid with 30 significant bits so that q * hi and q * mid are exact for |q| < 2**12 (Cody and
# Waite); the reduction runs in double, so a result near a multiple of pi keeps its relative accuracy
PIO2_HI = _split(math.pi / 2, 30)
PIO2_MID = _split(math.pi / 2 - PIO2_HI, 30)
PIO2_LO = math.pi / 2 - PIO2_HI - PIO2_MID + math.sin(math.pi) / 2  # sin(fl(pi)) = pi - fl(pi) to double precision
SIN_BIG = 4096.0  # past this |x| each lane calls the C library's sinf, which reduces the argument exactly
# log2(m) = 2 atanh(s) / ln 2 with s = (m-1)/(m+1), |s| < 0.172 for m in [sqrt(1/2), sqrt(2)]: coefficients 2 / ((2j+1) ln 2) of s**(2j+1)
LOG2_POLY = [_f32(2 / ((2 * j + 1) * math.log(2))) for j in range(6)]


def vector_math(fp: str, width: int) -> str:
  """Float32 math on GCC/clang vectors of `width` lanes that the compiler keeps in vector registers: where (select by a mask of
  -1 and 0 lanes), max (a NaN in either operand wins), exp2, log2, sin and sqrt (inf, NaN, zero and denormal inputs as NumPy has them).
  Width 0: scalar versions (tt_exp2s, ...) computed the same way on one-lane vectors, so every lane and scalar agree."""
  w = width or 1
  F, I, U, D = f"tt_f{w}", f"tt_i{w}", f"tt_u{w}", f"tt_d{w}"
  def splat(v: str) -> str: return f"({F}){{{', '.join([v] * w)}}}"
  def horner(x: str, coeffs: list[str]) -> str:
    p = coeffs[-1]
    for c in reversed(coeffs[:-1]): p = f"({p})*{x}+{c}"
    return p
  types = (f"typedef float {F} __attribute__((vector_size({4 * w})));\n" if width == 0 else "") + \
    f"typedef int {I} __attribute__((vector_size({4 * w})));\ntypedef unsigned int {U} __attribute__((vector_size({4 * w})));\n" \
    f"typedef double {D} __attribute__((vector_size({8 * w})));\n"
  code = types + f"""\
{fp} {F} tt_where{w}({I} m, {F} a, {F} b) {{ return ({F})((({I})a & m) | (({I})b & ~m)); }}
{fp} {F} tt_max{w}({F} a, {F} b) {{ return tt_where{w}((a > b) | (a != a), a, b); }}
{fp} {F} tt_sqrt{w}({F} x) {{ {F} r; for (int i = 0; i < {w}; i++) r[i] = __builtin_sqrtf(x[i]); return r; }}
{fp} {F} tt_exp2{w}({F} x) {{
  {F} lo = {splat("-160.0f")}, hi = {splat("130.0f")};  /* beyond these 2**x is 0 or inf; a NaN stays */
  {F} xc = tt_where{w}(x < lo, lo, tt_where{w}(x > hi, hi, x));
  {F} n = (xc + 12582912.0f) - 12582912.0f, f = xc - n;  /* n = round(x) by the 1.5*2**23 trick, |f| <= 1/2 */
  {I} ni = __builtin_convertvector(n, {I}), h = ni >> 1;  /* 2**n in two factors, each a normal float, so denormal results round once */
  {F} r = ({horner("f", EXP2_POLY)}) * ({F})(({U})(h + 127) << 23) * ({F})(({U})(ni - h + 127) << 23);
  return tt_where{w}(x != x, x, r);
}}
{fp} {F} tt_log2{w}({F} x) {{
  {I} sub = x < 1.17549435e-38f;  /* denormals (and zero, negatives) scaled by 2**23 first */
  {I} b = ({I})tt_where{w}(sub, x * 8388608.0f, x);
  {I} e = ((b >> 23) & 0xff) - 127 - (sub & 23);
  {F} m = ({F})((b & 0x7fffff) | 0x3f800000);  /* x = m 2**e, m in [1, 2) */
  {I} big = m > 1.41421356f;
  m = tt_where{w}(big, m * 0.5f, m);
  e = e - big;
  {F} s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
  {F} r = __builtin_convertvector(e, {F}) + s * ({horner("s2", LOG2_POLY)});
  {F} zero = {splat("0.0f")}, inf = {splat("__builtin_inff()")};
  r = tt_where{w}(x == zero, -inf, tt_where{w}(x == inf, x, r));
  return tt_where{w}((x < zero) | (x != x), {splat('__builtin_nanf("")')}, r);
}}
{fp} {F} tt_sin{w}({F} x) {{
  {F} q = (x * 0.636619772f + 12582912.0f) - 12582912.0f;  /* the nearest multiple of pi/2 */
  {D} qd = __builtin_convertvector(q, {D});
  {F} r = __builtin_convertvector(((__builtin_convertvector(x, {D}) - qd * {PIO2_HI!r}) - qd * {PIO2_MID!r}) - qd * {PIO2_LO!r}, {F}), r2 = r * r;
  {F} s = r + r * r2 * ({horner("r2", SIN_POLY[1:])}), c = {horner("r2", COS_POLY)};
  {I} n = __builtin_convertvector(q, {I});
  {F} ret = tt_where{w}(((n & 1) != 0), c, s);
  ret = tt_where{w}(((n & 2) != 0), -ret, ret);
  {I} big = (x > {SIN_BIG}f) | (x < -{SIN_BIG}f);
  int any = 0;
  for (int i = 0; i < {w}; i++) any |= big[i];
  if (any) for (int i = 0; i < {w}; i++) if (big[i]) ret[i] = __builtin_sinf(x[i]);
  return tt_where{w}(x != x, x, tt_where{w}((x == {splat("__builtin_inff()")}) | (x == -{splat("__builtin_inff()")}), x - x, ret));
}}
"""
  if width == 0:
    code += "".join(f"{fp} float tt_{f}s(float x) {{ {F} v = {{x}}; return tt_{f}1(v)[0]; }}\n" for f in ("exp2", "log2", "sqrt", "sin"))
    code += f"{fp} float tt_maxs(float a, float b) {{ {F} x = {{a}}, y = {{b}}; return tt_max1(x, y)[0]; }}\n"  # no branch to mispredict
  return code


class CRenderer(CStyleRenderer):
  """C for the CPU (gcc or clang with OpenMP)."""
  # gcc 12.2's loop vectorizer miscompiles an in-order float sum whose loads in one iteration are a permutation of
  # consecutive addresses (acc += x[i+1]; acc += x[i]: it double counts some), as unrolled or fully unrolled reduce loops
  # over flipped or transposed inputs are. Such a sum gains nothing from that vectorizer (its adds stay scalar), so it is off.
  in_order_reduce_prefix = '__attribute__((optimize("no-tree-loop-vectorize")))\n'
  vector_ops = CStyleRenderer.vector_ops | {Ops.MAX, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.CMPLT, Ops.CMPNE, Ops.WHERE}

  def code(self, op: Ops, args: Sequence[str], dtype: DType) -> str:
    return self.vector_code(op, args, 0) if op in {*self.vector_math, Ops.MAX} and dtype == dtypes.float32 else super().code(op, args, dtype)

  vector_math = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt"}  # scalar float32 calls too, so every lane computes alike
  def vector_code(self, op: Ops, args: Sequence[str], width: int) -> str:
    if op in self.vector_math: return f"tt_{self.vector_math[op]}{width or 's'}({args[0]})"
    if op is Ops.MAX: return f"tt_max{width or 's'}({args[0]}, {args[1]})"
    if op is Ops.WHERE: return f"tt_where{width}({args[0]}, {args[1]}, {args[2]})"
    return f"({args[0]}{'<' if op is Ops.CMPLT else '!='}{args[1]})"

  def vector_prelude(self, width: int) -> str: return super().vector_prelude(width) + vector_math(self.func_prefix, width)

  def prelude(self, k: Kernel) -> str: return super().prelude(k) + vector_math(self.func_prefix, 0)



class _GPURenderer(CStyleRenderer):
  """A dialect with workgroups: index math in 32 bits; UPCAST along contiguous memory uses 4-wide vectors (16-byte accesses)."""
  has_local = True
  index_type = "int"
  includes = ""


class CUDARenderer(_GPURenderer):
  """CUDA C++. float16 is stored as half and computed in float32 (half's operators mix badly with float), rounded to half
  where the program casts to float16; bfloat16 likewise as __nv_bfloat16."""
  types = {**CStyleRenderer.types, dtypes.bool: "bool", dtypes.int64: "long long", dtypes.uint64: "unsigned long long", dtypes.float16: "float"}
  buffer_types = {dtypes.float16: "half", dtypes.bfloat16: "__nv_bfloat16"}
  def to_bits(self, x: str, dtype: DType) -> str: return f"__float2half_rn({x})" if dtype == dtypes.float16 else super().to_bits(x, dtype)
  def from_bits(self, x: str, dtype: DType) -> str: return f"__half2float({x})" if dtype == dtypes.float16 else super().from_bits(x, dtype)
  restrict, func_prefix = "__restrict__", "static __device__ inline"
  group_id, local_id, barrier, shared_prefix = "blockIdx.x", "threadIdx.x", "__syncthreads();", "__shared__ "
  inf, nan = "__int_as_float(0x7f800000)", "__int_as_float(0x7fffffff)"

  def kernel_head(self, name: str, args: list[str], threads: int) -> str:
    return f'extern "C" __global__ void __launch_bounds__({threads}) {name}({", ".join(args)})'

  def code(self, op: Ops, args: Sequence[str], dtype: DType) -> str:
    return f"__half2float(__float2half_rn((float)({args[0]})))" if op is Ops.CAST and dtype == dtypes.float16 else super().code(op, args, dtype)
  bf16_in, bf16_out = "__bfloat162float", "__float2bfloat16_rn"
  def bf16_prelude(self) -> str: return ""  # cuda_bf16.h has the conversions

  def render(self, k: Kernel) -> str: return _TensorCoreRender(self, k).source() if k.tc is not None else super().render(k)

  # float4 with a lane subscript and the float32 vector ops; loads and stores are 16-byte aligned
  aligned_vectors = True
  def vector(self, vt: str, items: list[str]) -> str: return f"{vt}{{{{{', '.join(items)}}}}}"
  def vector_prelude(self, width: int) -> str:
    vt, f = self.vtype(width), "__device__ inline"
    def each(expr: str) -> str: return f"{{ {vt} r; for (int i = 0; i < {width}; i++) r.v[i] = {expr}; return r; }}\n"
    return (f"struct {vt} {{ float v[{width}]; {f} float& operator[](int i) {{ return v[i]; }} "
            f"{f} float operator[](int i) const {{ return v[i]; }} }};\n"
            + "".join(f"{f} {vt} operator{o}({vt} a, {vt} b) " + each(f"a.v[i]{o}b.v[i]") + f"{f} {vt} operator{o}({vt} a, float b) "
                      + each(f"a.v[i]{o}b") + f"{f} {vt} operator{o}(float a, {vt} b) " + each(f"a{o}b.v[i]") for o in "+*/")
            + f"{f} {vt} operator-({vt} a) " + each("-a.v[i]")
            + f"{f} {vt} {vt}_load(const float* p) {{ float4 x = *(const float4*)p; return {vt}{{{{x.x, x.y, x.z, x.w}}}}; }}\n"
            f"{f} void {vt}_store(float* p, {vt} v) {{ *(float4*)p = make_float4(v.v[0], v.v[1], v.v[2], v.v[3]); }}\n")

  def prelude(self, k: Kernel) -> str:
    used = _dtypes(k)
    mma = "#include <mma.h>\nusing namespace nvcuda;\n" if k.tc is not None else ""
    return ("#include <cuda_fp16.h>\n" if dtypes.float16 in used else "") + ("#include <cuda_bf16.h>\n" if dtypes.bfloat16 in used else "") \
      + mma + super().prelude(k)


class HIPRenderer(_GPURenderer):
  """HIP for AMD GPUs, free of HIP's headers, so device code compiles with a plain clang (-nogpuinc) as well as hiprtc."""
  types = {**CStyleRenderer.types, dtypes.bool: "bool", dtypes.int64: "long long", dtypes.uint64: "unsigned long long", dtypes.float16: "_Float16"}
  restrict, func_prefix = "__restrict__", "static __attribute__((device)) inline"
  group_id, local_id, shared_prefix = "__builtin_amdgcn_workgroup_id_x()", "__builtin_amdgcn_workitem_id_x()", "__attribute__((shared)) "
  barrier = ('__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); '
             '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");')
  inf, nan = "__builtin_inff()", '__builtin_nanf("")'
  math = "__builtin_"

  def kernel_head(self, name: str, args: list[str], threads: int) -> str:
    return f'extern "C" __attribute__((global)) void __attribute__((amdgpu_flat_work_group_size(1, {threads}))) {name}({", ".join(args)})'

  # float64 exp2, log2 and sin are calls into ROCm's device library (ocml), which hiprtc links; the GPU has no instructions for them
  ocml = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin"}
  def code(self, op: Ops, args: Sequence[str], dtype: DType) -> str:
    return f"__ocml_{self.ocml[op]}_f64({args[0]})" if op in self.ocml and dtype == dtypes.float64 else super().code(op, args, dtype)
  def prelude(self, k: Kernel) -> str:
    decl = "".join(f'extern "C" __attribute__((device, const)) double __ocml_{f}_f64(double);\n' for f in self.ocml.values())
    return (decl if dtypes.float64 in _dtypes(k) else "") + super().prelude(k)


class OpenCLRenderer(_GPURenderer):
  """OpenCL C. Without the cl_khr_fp16 extension, float16 is a storage type: loaded and stored with vload_half and
  vstore_half, computed in float32."""
  buffer_types = {dtypes.bool: "uchar", dtypes.bfloat16: "ushort"}  # bool has no defined size in OpenCL, so it is not allowed in buffers

  def __init__(self, fp16: bool = True, fp64: bool = True):
    self.fp16, self.fp64 = fp16, fp64
    self.types = {**CStyleRenderer.types, dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.uint16: "ushort",
                  dtypes.uint32: "uint", dtypes.uint64: "ulong", dtypes.float16: "half" if fp16 else "float"}
    self.buffer_types = {**self.buffer_types, dtypes.float16: "half"}
  def reinterpret(self, x: str, src: str, dst: str) -> str: return f"as_{dst}({x})"
  def bitcast(self, x: str, src: DType, dst: DType) -> str:
    if self.fp16 or dtypes.float16 not in (src, dst): return super().bitcast(x, src, dst)
    # float16 without cl_khr_fp16 has no half values: its bits go through vstore_half and vload_half on a private ushort
    if src == dtypes.float16: return super().bitcast(f"({{ ushort tt_h; vstore_half({x}, 0, (__private half*)&tt_h); tt_h; }})", dtypes.uint16, dst)
    return f"({{ ushort tt_h = {super().bitcast(x, src, dtypes.uint16)}; vload_half(0, (__private half*)&tt_h); }})"

  def load(self, ptr: str, idx: str, dtype: DType) -> str:
    return f"vload_half({idx}, {ptr})" if dtype == dtypes.float16 and not self.fp16 else super().load(ptr, idx, dtype)
  def store(self, ptr: str, idx: str, val: str, dtype: DType) -> str:
    return f"vstore_half({val}, {idx}, {ptr});" if dtype == dtypes.float16 and not self.fp16 else super().store(ptr, idx, val, dtype)
  def bits_prelude(self) -> str:
    return "static inline uint tt_f32_bits(float f) { return as_uint(f); }\nstatic inline float tt_bits_f32(uint u) { return as_float(u); }\n"
  buffer_prefix, func_prefix, math_suffix = "__global ", "static inline", ""
  group_id, local_id, barrier, shared_prefix = "get_group_id(0)", "get_local_id(0)", "barrier(CLK_LOCAL_MEM_FENCE);", "__local "

  def kernel_head(self, name: str, args: list[str], threads: int) -> str:
    return f"__kernel __attribute__((reqd_work_group_size({threads}, 1, 1))) void {name}({', '.join(args)})"

  # OpenCL's own vector types; vload/vstore need only float alignment
  lane_fmt = "{}.s{:x}"
  def vtype(self, width: int) -> str: return f"float{width}"
  def vector(self, vt: str, items: list[str]) -> str: return f"(({vt})({', '.join(items)}))"
  def vector_prelude(self, width: int) -> str:
    vt = self.vtype(width)
    return (f"static inline {vt} {vt}_load(const __global float* p) {{ return vload{width}(0, p); }}\n"
            f"static inline void {vt}_store(__global float* p, {vt} v) {{ vstore{width}(v, 0, p); }}\n")

  def prelude(self, k: Kernel) -> str:
    used = _dtypes(k)
    if dtypes.float64 in used and not self.fp64: raise NotImplementedError("this OpenCL device has no float64 (no cl_khr_fp64): use float32")
    return ("#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n" if self.fp16 and dtypes.float16 in used else "") + \
      ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if dtypes.float64 in used else "") + super().prelude(k)


def _dtypes(k: Kernel) -> set[DType]: return {u.dtype for u in k.ast.toposort}


class _TensorCoreRender(_KernelRender):
  """A TC kernel in CUDA's wmma: each warp keeps one float32 accumulator fragment per UPCAST tile, loads 16x16 tiles of A
  and B straight from memory in the K loop, then goes through shared memory to apply what follows the sum and store."""

  def source(self) -> str:
    k, r = self.k, self.r
    tc, it = k.tc, r.index_type
    assert tc is not None
    out = self.unflatten([k.axes.index(k.remaining(d)) for d in k.global_order], r.group_id)
    out.append(f"  {it} lid = {r.local_id}, warp = lid / 32, lane = lid % 32, tile_row = lane / 16, tile_col = lane % 16;")
    out += self.unflatten(sorted((i for i, a in enumerate(k.axes) if a.kind is AxisKind.LOCAL), key=lambda i: k.axes[i].dim), "warp")
    tiles = self.instances((AxisKind.UPCAST,))
    out += [f"  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc{j}; wmma::fill_fragment(acc{j}, 0.0f);" for j in range(len(tiles))]
    red_loops = [i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE and a.size != 1]
    for depth, i in enumerate(red_loops):
      var = self.loopvars[i].arg[0]
      out.append("  " * (depth + 1) + f"for ({it} {var} = 0; {var} < {k.axes[i].size}; {var}++) {{")
    frags: dict[tuple[str, str], str] = {}
    body: list[str] = []
    def fragment(which: str, view: UOp, layout: str, ld: int, dims: list[UOp]) -> str:
      ptr = f"data{self.bufs[view.src[0].arg]}+{self.index(self.simplify(view.arg.index(tuple(dims))[0]))}"
      if (which, ptr) not in frags:
        frags[(which, ptr)] = name = f"{which}{len(frags)}"
        body.append(f"wmma::fragment<wmma::matrix_{which}, 16, 16, 16, {r.buffer_types[view.dtype]}, wmma::{layout}> {name};")
        body.append(f"wmma::load_matrix_sync({name}, {ptr}, {ld});")
      return frags[(which, ptr)]
    for unroll in self.instances((AxisKind.UNROLL,)):
      for j, tile in enumerate(tiles):
        dims = self.dims({**tile, **unroll})
        a, b = fragment("a", tc.a, tc.a_layout, tc.a_ld, dims), fragment("b", tc.b, tc.b_layout, tc.b_ld, dims)
        body.append(f"wmma::mma_sync(acc{j}, {a}, {b}, acc{j});")
    out += ["  " * (len(red_loops) + 1) + line for line in body]
    out += ["  " * depth + "}" for depth in range(len(red_loops), 0, -1)]
    out.append(f"  __shared__ float tiles[{k.sizes_of(AxisKind.LOCAL) * 256}];")
    row_axis, col_axis = (next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.TC and a.dim == d) for d in (tc.row, tc.col))
    tile_row, tile_col = UOp.var("tile_row", 0, 1), UOp.var("tile_col", 0, 15)
    out_strides = strides_for(k.out_shape)
    self.lines = []
    for j, tile in enumerate(tiles):  # one tile at a time through the warp's 256 floats of shared memory
      self.lines += [f"wmma::store_matrix_sync(tiles+warp*256, acc{j}, 16, wmma::mem_row_major);", "__syncwarp();"]
      for t in range(8):  # element lane + 32 t of the 16x16 tile: row lane / 16 + 2 t, column lane % 16
        self.cell = f"tiles[warp*256+lane+{32 * t}]"
        dims = self.dims({**tile, row_axis: tile_row + 2 * t, col_axis: tile_col})
        val = self.node(k.ast, tuple(dims[:k.n_global]))
        self.store(val, self.simplify(sum((dims[d] * st for d, st in enumerate(out_strides) if st), UOp.const(dtypes.int64, 0))), TRUE)
      self.lines.append("__syncwarp();")
    out += ["  " + line for line in self.lines]
    return self.wrap(out)

  def acc(self, red: UOp, idx: tuple[UOp, ...]) -> Val: return Val("s", (self.cell,))
