"""The C-style renderer family: it spells a lowered program (codegen/lower/) statement by statement; dialects set types,
qualifiers, prefixes and the spelling of the ops they do differently."""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tinytune.codegen.caps import STATIC_SHARED, DeviceCaps
from tinytune.codegen.clib import dot_pairs, fold_functions, streaming_stores, vector_library, vector_math
from tinytune.codegen.kernel import Kernel
from tinytune.codegen.lower import ARITH, CLOSES, FLOAT_LANES, OPENS, TRUE, VALUES, LinearProgram, lower, tc_kind
from tinytune.dtype import DType, dtypes
from tinytune.uop import ALU, Ops, UOp

EXACT = {Ops.NEG, Ops.MAX, Ops.WHERE, Ops.CMPLT, Ops.CMPNE}  # ops whose result needs no rounding to its operands' type


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
  no_loop_vectorizer_prefix = ""  # before kernels better off without the compiler's loop vectorizer (see LinearProgram)
  vector_ops = {Ops.ADD, Ops.MUL, Ops.NEG, Ops.RECIP}  # ops with native float32 vector code
  vector_floats: tuple[DType, ...] = (dtypes.float32,)  # the float dtypes computed in float32 vector lanes
  includes = "#include <math.h>\n"
  inf, nan = "INFINITY", "NAN"
  math, math_suffix = "", "f"  # float32 math functions: exp2f, ...
  # devices with workgroups: the global loops become workgroups, LOCAL and GROUP parts the threads of one
  has_local = False
  group_id, local_id, barrier, shared_prefix = "", "", "", ""

  def kernel_head(self, name: str, args: list[str], threads: int) -> str: return f"void {name}({', '.join(args)})"
  def program_prelude(self, p: LinearProgram) -> str: return ""  # helpers only some programs' statements call (CRenderer's)
  bf16_in, bf16_out = "tt_bf16_to_f32", "tt_f32_to_bf16"  # bfloat16's storage to float32, and float32 rounded to nearest even to storage

  def load(self, ptr: str, idx: str, dtype: DType) -> str: return f"{self.bf16_in}({ptr}[{idx}])" if dtype == dtypes.bfloat16 else f"{ptr}[{idx}]"
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

  half_suffix = {dtypes.float16: "_f16", dtypes.bfloat16: "_bf16"}  # a vector load, store or rounding of a 16-bit float
  lane_fmt = "{}[{}]"
  aligned_vectors = False  # vector loads and stores need addresses aligned to the vector

  def vtype(self, width: int) -> str: return f"tt_f{width}"
  def mask_type(self, width: int) -> str: return f"tt_i{width}"
  mask_lane_fmt = "(-{}[{}])"  # a mask lane as 1 or 0
  def vector_code(self, op: Ops, args: Sequence[str], width: int) -> str:
    """Vector code for the ops past the arithmetic ones: comparisons give masks, WHERE takes one."""
    raise NotImplementedError(f"{type(self).__name__} has no vector {op.name}")
  def vector(self, vt: str, items: list[str]) -> str: return f"({vt}){{{', '.join(items)}}}"
  def vector_prelude(self, width: int, used: set[DType]) -> str:
    vt = self.vtype(width)
    # stores through a vector type of float's alignment, not memcpy: gcc 12 with AVX-512 turns a memcpy of a constant vector into a
    # 256-bit integer store and stored {1,1,1,1,0,0,0,0} as eight 1s (a padded tensor read its padding as values); loads stay memcpy
    # (through that type, linear 64x1024 @ 1024x1024 ran 25% slower on Zen 4)
    return (f"typedef float {vt} __attribute__((vector_size({4 * width})));\n"
            f"typedef float {vt}_u __attribute__((vector_size({4 * width}), aligned(4), may_alias));\n"
            f"{self.func_prefix} {vt} {vt}_load(const float* p) {{ {vt} v; __builtin_memcpy(&v, p, sizeof v); return v; }}\n"
            f"{self.func_prefix} void {vt}_store(float* p, {vt} v) {{ *({vt}_u*)p = v; }}\n")

  def literal(self, v: object, dtype: DType) -> str:
    """A constant's C spelling (kept per renderer: a kernel spells the same few constants many times)."""
    key = (dtype, v) if v and v == v else (dtype, repr(v))  # -0.0 is not 0.0, and a NaN is not equal to itself
    if (ret := self._literals.get(key)) is None:
      if len(self._literals) > 4096: self._literals.clear()
      ret = self._literals[key] = self._literal(v, dtype)
    return ret

  def _literal(self, v: object, dtype: DType) -> str:
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
    if (template := self._templates.get((op, dtype is dtypes.float64))) is None:  # the math functions' prefix and suffix filled in once
      suffix = "" if dtype is dtypes.float64 else self.math_suffix
      template = self._templates[(op, dtype is dtypes.float64)] = self.code_table[op].replace("{m}", self.math).replace("{s}", suffix)
    return template.format(*args)

  @functools.cached_property
  def _literals(self) -> dict[tuple, str]: return {}
  @functools.cached_property
  def _templates(self) -> dict[tuple[Ops, bool], str]: return {}

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

  # ***** spelling a lowered program *****
  def render(self, k: Kernel) -> str: return self.spell(lower(k, self))

  def spell(self, p: LinearProgram) -> str:
    """The program's source: each statement on its line, indented by the loops and branches around it."""
    k, at, indent, statements = p.kernel, _At(), "  ", self.statements
    out = [indent + line for line in self.body_start(p, at)]
    for u in p.uops:
      if (op := u.op) in CLOSES: at.depth -= 1; indent = "  " * at.depth  # noqa: E702
      if (fn := statements.get(op)) is None:
        raise NotImplementedError(f"{type(self).__name__} has no {op.name} statement: the kernel's opts need a device with more (TC: CUDA, HIP)")
      out.append(indent + fn(self, u, at))
      if op in OPENS: at.depth += 1; indent = "  " * at.depth  # noqa: E702
    def ptr(dt: DType) -> str: return f"{self.buffer_prefix}{self.buffer_types.get(dt, self.types[dt])}* {self.restrict}"
    written = {u.arg.buf for u in p.uops if u.op is Ops.STORE}  # besides the output: CHECK's flags
    args = [f"{ptr(k.ast.dtype)} data0"] + [f"{'' if i in written else 'const '}{ptr(b.dtype)} data{i}"
                                            for b, i in {b: i + 1 for i, b in enumerate(k.bufs)}.items()]
    head = self.prelude(k) + (self.vector_prelude(p.width, _dtypes(k)) if p.width > 1 else "")
    head += self.program_prelude(p) + (self.no_loop_vectorizer_prefix if p.no_loop_vectorizer else "")
    return f"{head}{self.kernel_head(k.name, args, k.launch_dims[1])} {{\n" + "\n".join(out) + "\n}\n"

  def body_start(self, p: LinearProgram, at: _At) -> list[str]: return []  # lines before the program's statements (CUDA's dynamic shared memory)
  def define_local(self, u: UOp, at: _At) -> str: return f"{self.shared_prefix}{self.local_type(u.dtype, u.arg.stored)} {u.arg.name}[{u.arg.size}];"

  def ctype(self, u: UOp) -> str:
    if (w := u.arg.width) > 1: return self.mask_type(w) if u.dtype == dtypes.bool else self.vtype(w)
    return self.index_type if u.op is Ops.DEFINE_VAR else self.types[u.dtype]

  def operand(self, u: UOp, at: _At) -> str:
    """A value where another uses it: its name where a statement defines it, else its expression (a lane, a splat, index math)."""
    if u.op in VALUES and u.arg is not None and u.arg.name is not None: return u.arg.name
    if u.op is Ops.CONST: return self.literal(u.arg, u.dtype)
    if u.op is Ops.GEP: return (self.mask_lane_fmt if u.src[0].dtype == dtypes.bool else self.lane_fmt).format(self.operand(u.src[0], at), u.arg)
    if u.op in (Ops.VECTORIZE, Ops.LOAD, Ops.CELL): return self.expr(u, at)
    return self.index(u, at.index)

  lane_folds = False  # lane_fold: a vector whose lane j folds the lanes of vector j
  def lane_fold(self, op: Ops, args: list[str], width: int) -> str: raise NotImplementedError(f"{type(self).__name__} folds no lanes")
  def fold(self, op: Ops, args: list[str], dtype: DType, width: int) -> str:
    """args[0] op args[1] op ..., from the left (native vectors: the vector code where C's operators do not spell it)."""
    ret = args[0]
    for a in args[1:]: ret = self.code(op, [ret, a], dtype) if width == 1 or op is Ops.ADD else self.vector_code(op, [ret, a], width)
    return ret

  def expr(self, u: UOp, at: _At) -> str:
    """What a value statement (or an inline load, vector or shared element) computes."""
    if (op := u.op) in ALU:
      args, w = [self.operand(s, at) for s in u.src], u.arg.width
      if w > 1:  # a 16-bit float in float32 lanes rounds each new result to its type, as the scalar code does
        if op is Ops.CAST: ret = args[0]
        else: ret = self.code(op, args, u.dtype) if op in ARITH else self.vector_code(op, args, w)
        return f"{self.vtype(w)}_round{sfx}({ret})" if (sfx := self.half_suffix.get(u.dtype)) and op not in EXACT else ret
      if op is Ops.BITCAST: return self.bitcast(args[0], u.src[0].dtype, u.dtype)
      ret = self.code(op, args, u.dtype)  # a 16-bit float computed in float32 rounds each result to its type
      return self.code(Ops.CAST, [ret], u.dtype) if u.dtype.itemsize == 2 and self.types[u.dtype] == "float" and op is not Ops.CAST else ret
    if op is Ops.LOAD:
      ptr, (idx, valid), w = self.ptr(u.arg.buf), u.src, u.arg.width
      if w > 1:
        load = f"{self.vtype(w)}_load{self.half_suffix.get(u.dtype, '')}({ptr}+{self.index(idx, at.index)})"
        zero = self.vector(self.vtype(w), ["0.0f"] * w)
      else: load, zero = self.load(ptr, self.index(idx, at.index), u.dtype), self.literal(0, u.dtype)
      return load if valid is TRUE else f"({self.index(valid, at.index)}?{load}:{zero})"
    if op is Ops.DEFINE_ACC:
      ident = self.literal(u.src[0].arg, u.dtype)
      return ident if (w := u.arg.width) == 1 else self.vector(self.vtype(w), [ident] * w)
    if op is Ops.CELL: return f"{u.arg[0]}[{u.arg[1]}]"
    args = [self.operand(s, at) for s in u.src]
    if op is Ops.VECTORIZE:
      if u.dtype is dtypes.bool: return self.vector(self.mask_type(len(args)), [f"-({a}!=0)" for a in args])
      return self.vector(self.vtype(len(args)), args)
    if op is Ops.FOLD: return self.lane_fold(u.arg.op, args, u.arg.width) if u.arg.across else self.fold(u.arg.op, args, u.dtype, u.arg.width)
    if op is Ops.INRANGE: return f"(0<={args[0]}&&{args[0]}<{u.src[1].arg})"
    assert op is Ops.DEFINE_VAR, f"no expression for {op.name}"
    return f"({args[0]}?{args[1]}:0)"

  def local_type(self, dtype: DType, stored: bool = False) -> str:
    """An array's element type in shared memory: as computed, or as a buffer holds it (LocalArg.stored)."""
    return self.buffer_types.get(dtype, self.types[dtype]) if stored else self.types[dtype]
  def ptr(self, buf: int | str) -> str: return buf if isinstance(buf, str) else f"data{buf}"  # a kernel argument or a local array
  def guarded(self, line: str, guard: UOp, at: _At) -> str: return line if guard is TRUE else f"if ({self.index(guard, at.index)}) {line}"
  def cond(self, u: UOp, at: _At) -> str:  # a branch's `x != c`, x without the parentheses that index math has around it
    x = self.index(u.src[0].src[0], at.index)
    return f"{x[1:-1] if x[0] == '(' and x[-1] == ')' else x} != {self.index(u.src[0].src[1], at.index)}"
  def assign(self, u: UOp, at: _At) -> str:
    (target, val, guard), t = u.src, self.operand(u.src[0], at)
    w = target.arg.width if target.op is Ops.DEFINE_ACC else 1
    rhs = self.operand(val, at) if u.arg is None else self.fold(u.arg, [t, self.operand(val, at)], target.dtype, w)
    return self.guarded(f"{t} = {rhs};", guard, at)
  def store(self, ptr: str, idx: str, val: str, dtype: DType) -> str:
    return f"{ptr}[{idx}] = {f'{self.bf16_out}({val})' if dtype == dtypes.bfloat16 else val};"
  def flag_size(self, caps: DeviceCaps) -> int:
    """The elements of a CHECK's flag that store_any stores into: all to the one here."""
    return 1
  def store_any(self, ptr: str, idx: str, val: str, dtype: DType) -> str:
    """A store that other threads may make to the same element at once (see StoreArg.any): C11's relaxed atomic, a plain store on x86."""
    return f"__atomic_store_n({ptr}+{idx}, {val}, __ATOMIC_RELAXED);"
  def store_stmt(self, u: UOp, at: _At) -> str:
    (idx, val, guard), (w, buf, stream) = u.src, u.arg[:3]
    ptr, i, v = self.ptr(buf), self.index(idx, at.index), self.operand(val, at)
    if u.arg.any: return self.guarded(self.store_any(ptr, i, v, u.dtype), guard, at)
    vector = f"{self.vtype(w)}_{'stream' if stream else 'store'}{self.half_suffix.get(u.dtype, '')}({ptr}+{i}, {v});"  # see clib.streaming_stores
    return self.guarded(vector if w > 1 else self.store(ptr, i, v, u.dtype), guard, at)
  def special(self, u: UOp, at: _At) -> str:
    name, base, mult, mod = u.arg
    e = base = {"group_id": self.group_id, "local_id": self.local_id}.get(base, base)
    if mult != 1: e = f"({base}/{mult})"
    return f"{self.index_type} {name} = {e if not mod else f'{e}%{mod}'};"
  def loop(self, u: UOp, at: _At) -> str:
    var, start, end, parallel = u.arg
    return (self.parallel_prefix + "  " * at.depth if parallel else "") + f"for ({self.index_type} {var} = {start}; {var} < {end}; {var}++) {{"
  parallel_prefix = ""  # before a loop whose iterations run on the cores
  def sync(self, arg: object) -> str:  # a BARRIER other than the workgroup's
    if arg == "stores": return "tt_fence();"
    raise NotImplementedError(f"{type(self).__name__} has no BARRIER {arg}: PIPELINE's cp.async is CUDA's")

  statements: dict[Ops, Callable[..., str]] = {
    Ops.RANGE: loop, Ops.ENDRANGE: lambda r, u, at: "}", Ops.IF: lambda r, u, at: f"if ({r.cond(u, at)}) {{",
    Ops.ELSE: lambda r, u, at: "} else {", Ops.ENDIF: lambda r, u, at: "}", Ops.EXIT: lambda r, u, at: f"if ({r.cond(u, at)}) return;",
    Ops.ASSIGN: assign, Ops.STORE: store_stmt, Ops.SPECIAL: special,
    Ops.BARRIER: lambda r, u, at: r.barrier if u.arg is None else r.sync(u.arg),
    Ops.DEFINE_LOCAL: lambda r, u, at: r.define_local(u, at),
    **{op: lambda r, u, at: f"{r.ctype(u)} {u.arg.name} = {r.expr(u, at)};" for op in VALUES},
  }


# Where float16 arithmetic is native (AVX512-FP16; ARMv8.2's FP16, with -march=native on most ARM servers), -ffp-contract=fast lets
# gcc and clang fuse a float16 product and a later add into one float16 FMA (vfmadd*sh/ph, fmadd h), rounded once where NumPy rounds
# the product and the sum; clang also narrows float32 lanes rounded to float16 back into float16 ops and fuses those. There each
# float16 product goes through an empty asm, which no FMA can see through (it costs no instruction); float32 products, as in a float16
# matmul's float32 sum, still fuse. Such vectors have at most 16 bytes on ARM (4 lanes) and 64 on x86 (AVX-512): one register.
HALF_PRODUCT = """#if defined(__AVX512FP16__) || defined(__ARM_FEATURE_FP16_SCALAR_ARITHMETIC)
#define tt_hmul(a, b) ({ __typeof__((a) * (b)) tt_p = (a) * (b); __asm__("" : TT_HOLD(tt_p)); tt_p; })
#if defined(__x86_64__)
#define TT_HOLD "+v"
#else
#define TT_HOLD "+w"
#endif
#else
#define tt_hmul(a, b) ((a) * (b))
#endif
"""


class CRenderer(CStyleRenderer):
  """C for the CPU (gcc or clang with OpenMP)."""
  # gcc 12.2's loop vectorizer miscompiles an in-order float sum whose loads in one iteration are a permutation of
  # consecutive addresses (acc += x[i+1]; acc += x[i]: it double counts some), as unrolled or fully unrolled reduce loops
  # over flipped or transposed inputs are. Such a sum gains nothing from that vectorizer (its adds stay scalar), so it is off.
  # A tile copied across rows (a transpose's 8x8) gains nothing either, and took it 2-6 s to compile where the rows are short
  # (4x512x64 -> 4x64x512: float32 1.9 s, float16 6.0 s; 0.2 s without it, as fast to run)
  no_loop_vectorizer_prefix = '__attribute__((optimize("no-tree-loop-vectorize")))\n'
  parallel_prefix = "#pragma omp parallel for schedule(static)\n"
  vector_ops = CStyleRenderer.vector_ops | {Ops.MAX, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.CMPLT, Ops.CMPNE, Ops.WHERE, Ops.CAST}

  def code(self, op: Ops, args: Sequence[str], dtype: DType) -> str:
    if op is Ops.MUL and dtype == dtypes.float16: return f"tt_hmul({args[0]}, {args[1]})"  # see HALF_PRODUCT
    return self.vector_code(op, args, 0) if op in {*self.vector_math, Ops.MAX} and dtype in self.vector_floats else super().code(op, args, dtype)

  vector_math = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt"}  # scalar float32 calls too, so every lane computes alike
  def vector_code(self, op: Ops, args: Sequence[str], width: int) -> str:
    if op in self.vector_math: return f"tt_{self.vector_math[op]}{width or 's'}({args[0]})"
    if op is Ops.MAX: return f"tt_max{width or 's'}({args[0]}, {args[1]})"
    if op is Ops.WHERE: return f"tt_where{width}({args[0]}, {args[1]}, {args[2]})"
    return f"({args[0]}{'<' if op is Ops.CMPLT else '!='}{args[1]})"

  vector_floats = FLOAT_LANES
  # a thread's array of a row (see lower.rows, RowArrays) holds its values as a buffer would, loaded and stored the same way
  def local_type(self, dtype: DType, stored: bool = False) -> str: return super().local_type(dtype, True)  # a thread's arrays: as stored
  def vector_prelude(self, width: int, used: set[DType]) -> str:
    return super().vector_prelude(width, used) + vector_library(self.func_prefix, width, used)

  def prelude(self, k: Kernel) -> str: return super().prelude(k) + vector_math(self.func_prefix, 0)
  def program_prelude(self, p: LinearProgram) -> str:
    """TC's bfloat16 pairs and dot products, the lane folds and 8 lanes' streaming stores, where the program's statements call them;
    tt_hmul in float16 programs."""
    dots, folds = any(u.op is Ops.WMMA for u in p.uops), any(u.op is Ops.FOLD and u.arg.across for u in p.uops)
    streams = p.width == 8 and any(u.op is Ops.STORE and u.arg.stream for u in p.uops)
    return (dot_pairs(self.func_prefix, p.width) if dots else "") + (fold_functions(self.func_prefix, p.width) if folds else "") \
      + (streaming_stores(8) if streams else "") + (HALF_PRODUCT if dtypes.float16 in _dtypes(p.kernel) else "")
  lane_folds = True
  def lane_fold(self, op: Ops, args: list[str], width: int) -> str:
    return f"tt_fold_{'add' if op is Ops.ADD else 'max'}{width}((tt_f{width}[]){{{', '.join(args + args[:1] * (width - len(args)))}}})"

  def wmma(self, u: UOp, at: _At) -> str:
    """The TC statements: bfloat16 pairs (see dot_pairs) and the dot products that add them into an accumulator."""
    what, *arg = u.arg
    if what == "pair":
      name, w, buf, kind = arg
      return f"tt_p{w} {name} = tt_{kind}{w}({', '.join(f'data{buf}+{self.index(s, at.index)}' for s in u.src)});"
    acc = self.operand(u.src[0], at)
    return f"{acc} = tt_dot{arg[0]}({acc}, {arg[1]}, {arg[2]});"
  statements = {**CStyleRenderer.statements, Ops.WMMA: wmma}



class _GPURenderer(CStyleRenderer):
  """A dialect with workgroups: index math in 32 bits; UPCAST along contiguous memory uses 4-wide vectors (16-byte accesses)."""
  has_local = True
  index_type = "int"
  includes = ""


class CUDARenderer(_GPURenderer):
  """CUDA C++. float16 is stored as half and computed in float32 (half's operators mix badly with float), rounded to half
  where the program casts to float16; bfloat16 likewise as __nv_bfloat16. Their conversions keep a NaN's sign (see half_prelude)."""
  types = {**CStyleRenderer.types, dtypes.bool: "bool", dtypes.int64: "long long", dtypes.uint64: "unsigned long long", dtypes.float16: "float"}
  buffer_types = {dtypes.float16: "half", dtypes.bfloat16: "__nv_bfloat16"}
  def store_any(self, ptr: str, idx: str, val: str, dtype: DType) -> str:  # CHECK's flags: int32 or int64
    if dtype.itemsize == 4: return f"atomicExch({ptr}+{idx}, {val});"
    return f"atomicExch((unsigned long long*)({ptr}+{idx}), (unsigned long long)({val}));"
  def to_bits(self, x: str, dtype: DType) -> str: return f"tt_f2h({x})" if dtype == dtypes.float16 else super().to_bits(x, dtype)
  def from_bits(self, x: str, dtype: DType) -> str: return f"tt_h2f({x})" if dtype == dtypes.float16 else super().from_bits(x, dtype)
  # a buffer's half converts by tt_h2f and tt_f2h (explicit: `mask ? half : float` is ambiguous to nvcc and NVRTC); shared memory
  # holds float32 (CUDA's float16 values)
  def load(self, ptr: str, idx: str, dtype: DType) -> str:
    return f"tt_h2f({ptr}[{idx}])" if dtype == dtypes.float16 and ptr.startswith("data") else super().load(ptr, idx, dtype)
  def store(self, ptr: str, idx: str, val: str, dtype: DType) -> str:
    return f"{ptr}[{idx}] = tt_f2h({val});" if dtype == dtypes.float16 and ptr.startswith("data") else super().store(ptr, idx, val, dtype)
  def half_prelude(self) -> str:
    """float16 <-> float32 where cuda_fp16.h's conversions (cvt) give the GPU's canonical NaN, 0x7fffffff or 0x7fff, whatever the
    sign (an H200 lost a NaN's sign in copysign): a NaN keeps its sign and top payload bits and is quiet, as x86's F16C makes it;
    tt_rh rounds a float32 to float16's precision and leaves a NaN as it is. The NaN is a select of integers, never a branch: nvcc kept
    an `if` as one per element loaded or stored (see bf16_prelude)."""
    fp = self.func_prefix
    return (f"{fp} float tt_h2f(half h) {{ unsigned short s; memcpy(&s, &h, 2); unsigned int u = s, n = (u & 0x8000) << 16 | 0x7fc00000 | "
            "(u & 0x3ff) << 13; float f = __half2float(h), nan; memcpy(&nan, &n, 4); return (u & 0x7fff) > 0x7c00 ? nan : f; }\n"
            f"{fp} half tt_f2h(float f) {{ unsigned int u; memcpy(&u, &f, 4); unsigned short n = (u >> 16 & 0x8000) | 0x7e00 | (u >> 13 & 0x3ff), s; "
            "half h = __float2half_rn(f); memcpy(&s, &h, 2); s = f != f ? n : s; memcpy(&h, &s, 2); return h; }\n"
            f"{fp} float tt_rh(float f) {{ float r = __half2float(__float2half_rn(f)); return f != f ? f : r; }}\n")
  restrict, func_prefix = "__restrict__", "static __device__ inline"
  group_id, local_id, barrier, shared_prefix = "blockIdx.x", "threadIdx.x", "__syncthreads();", "__shared__ __align__(32) "  # wmma
  inf, nan = "__int_as_float(0x7f800000)", "__int_as_float(0x7fffffff)"

  def kernel_head(self, name: str, args: list[str], threads: int) -> str:
    return f'extern "C" __global__ void __launch_bounds__({threads}) {name}({", ".join(args)})'

  def code(self, op: Ops, args: Sequence[str], dtype: DType) -> str:
    return f"tt_rh((float)({args[0]}))" if op is Ops.CAST and dtype == dtypes.float16 else super().code(op, args, dtype)
  def bf16_prelude(self) -> str:
    """cuda_bf16.h rounds to nearest even, but makes every NaN 0x7fff: ml_dtypes (and the CPU) give the quiet NaN of its sign. Its
    __bfloat162float is a cvt on sm_90, which may make a NaN canonical too: a bfloat16 is a float32's high half, so a shift. The NaN
    is chosen between two 16-bit integers (a select): between two bfloat16 values nvcc branched, once per element stored (wgmma's
    bfloat16 tile copies, 96 a thread a K tile: 40.9 TFLOPS on an H200 where float16's took 132)."""
    return (f"{self.func_prefix} float tt_bf16_to_f32(__nv_bfloat16 h) {{ unsigned short s; memcpy(&s, &h, 2); "
            "unsigned int u = (unsigned int)s << 16; float f; memcpy(&f, &u, 4); return f; }\n"
            f"{self.func_prefix} __nv_bfloat16 tt_f32_to_bf16(float f) {{ unsigned int u; memcpy(&u, &f, 4); "
            "unsigned short nan = (u >> 16 & 0x8000) | 0x7fc0, s = __bfloat16_as_ushort(__float2bfloat16_rn(f)); "
            "return __ushort_as_bfloat16(f != f ? nan : s); }\n")
  # NVRTC refuses GNU statement expressions: a bitcast is a call of a template
  def reinterpret(self, x: str, src: str, dst: str) -> str: return f"tt_bitcast<{dst}>({x})"

  def wmma(self, u: UOp, at: _At) -> str:
    """The tensor core statements: each warp's ids, its accumulator fragments, loads of A and B tiles, products, and stores of
    the accumulators to the warp's 256 floats of shared memory."""
    kind, what, *arg = u.arg
    if what == "ids":
      return (f"{self.index_type} lid = {self.local_id}, warp = lid / 32, lane = lid % 32, tile_row = lane / 16, tile_col = lane % 16"
              + (", mg = lane / 4, mt = lane % 4;" if kind != "wmma" else ";"))
    if kind == "wgmma" and what in ("proxy", "fence", "wait"): return f"tt_wgmma_{what}();"
    if kind == "wgmma" and what == "accs":  # one array of the wgmma's D, each tile's 8 floats of it named as mma.sync's acc
      js = arg[0]
      return f"float accw{js[0]}[{8 * len(js)}] = {{}}; float " + ", ".join(f"*acc{j} = accw{js[0]} + {8 * i}" for i, j in enumerate(js)) + ";"
    if kind == "wgmma" and what == "mma":  # the descriptors' leading offset: K's next core matrix, 128 bytes on (StagedTiles.offset)
      js, ta, sa, tb, sb, _ = arg
      def desc(tile: str, src: UOp, sbo: int) -> str:
        return f"tt_wgmma_desc((unsigned)__cvta_generic_to_shared({tile}+{self.index(src, at.index)}), 128, {sbo})"
      return f"tt_wgmma_m64n{16 * len(js)}k16(accw{js[0]}, {desc(ta, u.src[0], sa)}, {desc(tb, u.src[1], sb)});"
    if kind in ("mma", "wgmma") and what != "sync": return self.mma(u, at, what, arg)
    if what == "acc": return f"wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc{arg[0]}; wmma::fill_fragment(acc{arg[0]}, 0.0f);"
    if what == "fragment":
      name, which, dtype, layout = arg
      return f"wmma::fragment<wmma::matrix_{which}, 16, 16, 16, {self.buffer_types[dtype]}, wmma::{layout}> {name};"
    if what == "load": return f"wmma::load_matrix_sync({arg[0]}, {self.ptr(arg[1])}+{self.index(u.src[0], at.index)}, {arg[2]});"
    if what == "mma": return f"wmma::mma_sync(acc{arg[0]}, {arg[1]}, {arg[2]}, acc{arg[0]});"
    if what == "store": return f"wmma::store_matrix_sync(tiles+warp*256, acc{arg[0]}, 16, wmma::mem_row_major);"
    return "__syncwarp();"

  # PTX's m16n8k16 fragments, lane = 4 g + t, in 32-bit registers of two elements each: A (16x16) at (g, 2t), (g+8, 2t), (g, 2t+8),
  # (g+8, 2t+8) and the next along K; B (16x8, twice for a 16x16 tile) at (2t, g), (2t+8, g), (2t, g+8), (2t+8, g+8) and the next along
  # K; C (16x8, twice) floats at (g, 2t + e) and (g+8, 2t + e) for e in 0, 1
  MMA_PAIRS = ((0, 0), (8, 0), (0, 8), (8, 8))  # each register's (row of A or k of B, k of A or column of B) from (g, 2t) or (2t, g)
  def mma(self, u: UOp, at: _At, what: str, arg: list) -> str:
    """The tensor core statements as PTX mma.sync.m16n8k16: each lane loads its own pairs of A and B (one 32-bit load where a pair is
    contiguous), or from shared memory the warp loads a 16x16 tile by ldmatrix (.trans where the pairs are not contiguous); two
    instructions per 16x16 tile, and the lanes store their floats of C where store_matrix_sync would."""
    if what == "acc": return f"float acc{arg[0]}[8] = {{}};"
    if what == "fragment": return f"unsigned {arg[0]}[4];"
    if what == "load":
      name, buf, ld, which, layout, rows, *line = arg  # a swizzled tile's line (lower.staged.StagedTile.line) last
      along_k = (which == "a") == (layout == "row_major")  # the pair's two elements are neighbours in memory
      def off(i: str, j: str) -> str: return f"({i})*{ld}+{j}" if layout == "row_major" else f"({j})*{ld}+{i}"
      out = [f"{{ const auto* p = {self.ptr(buf)}+{self.index(u.src[0], at.index)};"]
      if rows:  # ldmatrix: register r's 8x8 block at MMA_PAIRS[r] is matrix r, lane 8 r + e gives the address of its row e in memory
        row = f"tile_col*{ld}+tile_row*8" if layout == "row_major" else f"(tile_row*8+lane%8)*{ld}+(lane&8)"
        # a swizzled tile (lower.staged.StagedTile.line): the row's offset from the array's start XORs its 16-byte chunk with its line's index
        at_row = f"{self.ptr(buf)}+tt_swizzle(p-{self.ptr(buf)}+{row}, {line[0]})" if line else f"p+{row}"
        return f"{out[0]} tt_ldmatrix_x4{'' if along_k else '_trans'}({name}, {at_row}); }}"
      for r, (di, dj) in enumerate(self.MMA_PAIRS):
        i, j = (f"mg+{di}", f"2*mt+{dj}") if which == "a" else (f"2*mt+{di}", f"mg+{dj}")
        nxt = off(i, f"{j}+1") if which == "a" else off(f"{i}+1", j)
        out.append(f"{name}[{r}] = *(const unsigned*)(p+{off(i, j)});" if along_k else f"{name}[{r}] = tt_pack(p[{off(i, j)}], p[{nxt}]);")
      return " ".join(out) + " }"
    if what == "mma": return f"tt_mma(acc{arg[0]}, {arg[1]}, {arg[2]}); tt_mma(acc{arg[0]}+4, {arg[1]}, {arg[2]}+2);"
    if what in ("state", "softmax", "pack", "finish"): return self.flash_tc(u, at, what, arg)
    assert what == "store", what
    return (f"for (int h = 0; h < 2; h++) for (int e = 0; e < 2; e++) {{ tiles[warp*256+mg*16+8*h+2*mt+e] = acc{arg[0]}[4*h+e]; "
            f"tiles[warp*256+(mg+8)*16+8*h+2*mt+e] = acc{arg[0]}[4*h+2+e]; }}")
  def flash_tc(self, u: UOp, at: _At, what: str, arg: list) -> str:
    """TC attention's statements (lower.flash.flash_attention_tc) on the lanes' accumulators: each 16x16 tile's 8 floats, element 4 h + r at
    row mg + 8 (r / 2), column 8 h + 2 mt + r % 2; fm and fl, the running max and the lane's share of the sum of rows mg and mg + 8."""
    inf, full = self.inf, "0xffffffffu"
    def rows(x: str, op: str) -> str:  # a row's value across its 4 lanes (lane 4 mg + mt)
      return " ".join(f"{x}[{h}] = {op.format(f'{x}[{h}]', f'__shfl_xor_sync({full}, {x}[{h}], {d})')};" for h in range(2) for d in (1, 2))
    if what == "state": return f"float fm[2] = {{-{inf}, -{inf}}}, fl[2] = {{0.0f, 0.0f}};"
    if what == "pack":
      return f"unsigned {arg[0]}[4] = {{" + ", ".join(f"tt_pack_f32(acc{arg[1]}[{2 * r}], acc{arg[1]}[{2 * r + 1}])" for r in range(4)) + "};"
    if what == "finish":
      return "{ " + rows("fl", "{} + {}") + " " + " ".join(f"acc{o}[{i}] /= fl[{i % 4 // 2}];" for o in arg[0] for i in range(8)) + " }"
    s_accs, o_accs, scale, causal = arg
    row0, key0 = (self.index(x, at.index) for x in u.src)
    out = [f"{{ float mx[2] = {{-{inf}, -{inf}}}, base[2], alpha[2];"]
    for n, j in enumerate(s_accs):
      for i in range(8):
        x, h, r = f"acc{j}[{i}]", i // 4, i % 4
        mask = f"{key0}+{16 * n + 8 * h}+2*mt+{r % 2} > {row0}+mg+{8 * (r // 2)} ? -{inf} : " if causal else ""
        out.append(f"{x} = {mask}{x}*{float(scale)!r}f; mx[{r // 2}] = fmaxf(mx[{r // 2}], {x});")
    out.append(rows("mx", "fmaxf({}, {})"))
    out.append("for (int h = 0; h < 2; h++) { float m = fmaxf(fm[h], mx[h]); "
               f"base[h] = m == -{inf} ? 0.0f : m; alpha[h] = exp2f(fm[h]-base[h]); fm[h] = m; fl[h] *= alpha[h]; }}")
    out += [f"acc{j}[{i}] = exp2f(acc{j}[{i}]-base[{i % 4 // 2}]); fl[{i % 4 // 2}] += acc{j}[{i}];" for j in s_accs for i in range(8)]
    out += [f"acc{o}[{i}] *= alpha[{i % 4 // 2}];" for o in o_accs for i in range(8)]
    return " ".join(out) + " }"
  def mma_prelude(self, dtype: DType) -> str:
    """tt_mma: c (4 floats) += A (4 registers) @ B (2 registers); tt_pack: two 16-bit elements in a register, the first in the low half;
    tt_ldmatrix_x4 (and _trans): a warp's four 8x8 matrices from shared memory, each lane giving the address of one 16-byte row;
    tt_swizzle: where a swizzled tile's element `e` is (lines of `line` elements, 8 a chunk: see lower.staged.StagedTile)."""
    ty, f = "bf16" if dtype == dtypes.bfloat16 else "f16", self.func_prefix
    return (f"{f} void tt_mma(float* c, const unsigned* a, const unsigned* b) {{\n"
            f'  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"\n'
            '    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1])); }\n'
            f"template <class T> {f} unsigned tt_pack(T x, T y) {{ unsigned short lo, hi; memcpy(&lo, &x, 2); memcpy(&hi, &y, 2); "
            "return lo | (unsigned)hi << 16; }\n"
            f"{f} int tt_swizzle(int e, int line) {{ return e ^ (int)((unsigned)e / line % 8) * 8; }}\n"
            + "".join(f"{f} void tt_ldmatrix_x4{t}(unsigned* d, const void* row) {{\n"
                      f'  asm volatile("ldmatrix.sync.aligned.m8n8.x4{t.replace("_", ".")}.shared.b16 {{%0,%1,%2,%3}}, [%4];"\n'
                      '    : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])\n'
                      '    : "r"((unsigned)__cvta_generic_to_shared(row))); }\n' for t in ("", "_trans")))
  def wgmma_prelude(self, dtype: DType, n: int) -> str:
    """sm_90a's warpgroup MMA from shared memory (PTX wgmma): tt_wgmma_desc packs a K-major, unswizzled operand's matrix descriptor
    from its shared-memory byte address and the byte offsets between core matrices (8 rows of 16 bytes, 128 contiguous bytes) along K
    (leading) and along M or N (stride); tt_wgmma_m64n{n}k16: d (n / 2 floats a lane, the warpgroup's 64 x n tile) += A (64 x 16) @ B
    (16 x n, K-major: B's columns as rows); tt_wgmma_proxy, after a thread's stores to shared memory (before the barrier), makes them
    visible to wgmma's reads (the async proxy); tt_wgmma_fence orders d's registers before the wgmmas; tt_wgmma_wait commits the
    wgmmas issued and waits for them all."""
    ty, f, regs = "bf16" if dtype == dtypes.bfloat16 else "f16", self.func_prefix, n // 2
    outs, ins = ", ".join(f'"+f"(d[{i}])' for i in range(regs)), '"l"(a), "l"(b)'
    d = ",".join(f"%{i}" for i in range(regs))
    return (f"{f} unsigned long long tt_wgmma_desc(unsigned addr, unsigned lbo, unsigned sbo) {{\n"
            "  return (unsigned long long)(addr >> 4 & 0x3FFF) | (unsigned long long)(lbo >> 4 & 0x3FFF) << 16 "
            "| (unsigned long long)(sbo >> 4 & 0x3FFF) << 32; }\n"
            f"{f} void tt_wgmma_m64n{n}k16(float* d, unsigned long long a, unsigned long long b) {{\n"
            f'  asm volatile("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{d}}}, %{regs}, %{regs + 1}, 1, 1, 1, 0, 0;"\n'
            f"    : {outs} : {ins}); }}\n"
            f'{f} void tt_wgmma_proxy() {{ asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }}\n'
            f'{f} void tt_wgmma_fence() {{ asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }}\n'
            f'{f} void tt_wgmma_wait() {{ asm volatile("wgmma.commit_group.sync.aligned;\\n\\twgmma.wait_group.sync.aligned 0;" ::: "memory"); }}\n')

  def sync(self, arg: object) -> str:
    if arg == "commit_group": return "tt_cp_commit();"
    return f"tt_cp_wait<{arg[1]}>();" if isinstance(arg, tuple) and arg[0] == "wait_group" else super().sync(arg)
  def store_stmt(self, u: UOp, at: _At) -> str:
    """A store, or PIPELINE's cp.async of its inline load's elements to shared memory: zeros where the load is not valid (its source
    then reads 0 bytes, from the buffer's start)."""
    if not u.arg.cp_async: return super().store_stmt(u, at)
    (dst, load, guard), (src, valid) = u.src, u.src[1].src
    nbytes = u.arg.width * u.dtype.itemsize
    full, s = ("true", self.index(src, at.index)) if valid is TRUE else (v := self.index(valid, at.index), f"({v}?{self.index(src, at.index)}:0)")
    return self.guarded(f"tt_cp_async<{nbytes}>({u.arg.buf}+{self.index(dst, at.index)}, {self.ptr(load.arg.buf)}+{s}, {full});", guard, at)
  def async_prelude(self) -> str:
    """tt_cp_async<N>: cp.async of N bytes (.cg, past L1, for 16; .ca for 4 and 8), all zeros where not `full`; tt_cp_commit: the
    thread's cp.asyncs so far are a group; tt_cp_wait<N>: until all but the newest N groups have landed."""
    f = self.func_prefix
    return (f"template <int N> {f} void tt_cp_async(void* dst, const void* src, bool full) {{\n"
            '  if (N == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), '
            '"l"(src), "r"(full ? 16 : 0) : "memory");\n'
            '  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), '
            '"n"(N), "r"(full ? N : 0) : "memory"); }\n'
            f'{f} void tt_cp_commit() {{ asm volatile("cp.async.commit_group;" ::: "memory"); }}\n'
            f'template <int N> {f} void tt_cp_wait() {{ asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }}\n')
  def body_start(self, p: LinearProgram, at: _At) -> list[str]:
    """Where the program's shared arrays take over STATIC_SHARED, they are in dynamic shared memory (extern), each at its offset, 128-byte
    aligned; the declaration's line says how many bytes the launch gives (dynamic_shared reads it)."""
    arrays = [(u, u.arg.size * (4 if u.dtype in (dtypes.float16, dtypes.bfloat16) and not u.arg.stored else u.dtype.itemsize))
              for u in p.uops if u.op is Ops.DEFINE_LOCAL]
    if sum(-(-n // 32) * 32 for _, n in arrays) <= STATIC_SHARED: return []
    total = 0
    for u, n in arrays: at.shared[u], total = total, total + -(-n // 128) * 128
    return [DYNAMIC_SHARED.format(total)]
  def define_local(self, u: UOp, at: _At) -> str:
    if (off := at.shared.get(u)) is None: return super().define_local(u, at)
    ty = self.local_type(u.dtype, u.arg.stored)
    return f"{ty}* {u.arg.name} = ({ty}*)(tt_shared+{off});"
  statements = {**CStyleRenderer.statements, Ops.WMMA: wmma, Ops.STORE: store_stmt}

  # float4 with a lane subscript and the float32 vector ops; loads and stores are 16-byte aligned
  aligned_vectors = True
  def vector(self, vt: str, items: list[str]) -> str: return f"{vt}{{{{{', '.join(items)}}}}}"
  def vector_prelude(self, width: int, used: set[DType]) -> str:
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
    tc = k.tc
    flash = k.attention.src[0].dtype if k.attention is not None and k.flash_tc else None
    pack = (f"{self.func_prefix} unsigned tt_pack_f32(float x, float y) {{ "
            f"{'__nv_bfloat162 p = __floats2bfloat162_rn' if flash == dtypes.bfloat16 else '__half2 p = __floats2half2_rn'}(x, y); "
            "unsigned u; memcpy(&u, &p, 4); return u; }\n")
    mma = self.mma_prelude(flash) + pack if flash is not None else "" if tc is None else \
      self.wgmma_prelude(tc.a.dtype, 16 * k.wgmma_cols()[1]) if tc.wgmma else self.mma_prelude(tc.a.dtype) if tc.mma else \
      "#include <mma.h>\nusing namespace nvcuda;\n"
    bitcast = (f"template <class D, class S> {self.func_prefix} D tt_bitcast(S s) {{ D d; memcpy(&d, &s, sizeof d); return d; }}\n"
               if any(u.op is Ops.BITCAST for u in k.ast.toposort) else "")
    return ("#include <cuda_fp16.h>\n" if dtypes.float16 in used else "") + ("#include <cuda_bf16.h>\n" if dtypes.bfloat16 in used else "") \
      + mma + (self.async_prelude() if k.stages > 1 or flash is not None else "") \
      + bitcast + (self.half_prelude() if dtypes.float16 in used else "") + super().prelude(k)


@dataclass(frozen=True)
class AMDMatrix:
  """One of AMD's 16x16x16 matrix instructions (float32 sums of float16 or bfloat16 products), by where the lanes of its wave hold
  A, B and C: lane l, at tile_row l / 16 and tile_col l % 16, holds element e (of `elements`) of A's row tile_col and of B's column
  tile_col at K = k_row tile_row + e, and float v (of 256 / wave) of C at row c_row tile_row + c_step v, column tile_col. The renderer
  spells its loads and stores from these numbers; a_at, b_at and c_at give the same places for ints or NumPy arrays."""
  wave: int
  elements: int
  k_row: int
  c_row: int
  c_step: int
  builtins: tuple[str, str]  # float16's and bfloat16's
  modifiers: str = ""  # after the builtin's A, B and C

  @property
  def floats(self) -> int: return 256 // self.wave
  def a_at(self, lane: Any, e: Any) -> tuple[Any, Any]: return lane % 16, self.k_row * (lane // 16) + e  # (row, k)
  def b_at(self, lane: Any, e: Any) -> tuple[Any, Any]: return self.k_row * (lane // 16) + e, lane % 16  # (k, column)
  def c_at(self, lane: Any, v: Any) -> tuple[Any, Any]: return self.c_row * (lane // 16) + self.c_step * v, lane % 16  # (row, column)
  def lane_own(self) -> bool:
    """Whether lane l's floats of C are the elements l + wave p (p < 256 / wave) that TC's epilogue reads (see lower.tensor_cores)."""
    return self.c_row == 1 and self.c_step == self.wave // 16


def _term(n: int, x: str) -> str: return "" if n == 0 else x if n == 1 else f"{n}*{x}"
def _sum(*terms: str) -> str: return "+".join(t for t in terms if t) or "0"


class HIPRenderer(_GPURenderer):
  """HIP for AMD GPUs, free of HIP's headers, so device code compiles with a plain clang (-nogpuinc) as well as hiprtc."""
  types = {**CStyleRenderer.types, dtypes.bool: "bool", dtypes.int64: "long long", dtypes.uint64: "unsigned long long", dtypes.float16: "_Float16"}
  restrict, func_prefix = "__restrict__", "static __attribute__((device)) inline"
  group_id, local_id, shared_prefix = "__builtin_amdgcn_workgroup_id_x()", "__builtin_amdgcn_workitem_id_x()", "__attribute__((shared, aligned(16))) "
  barrier = ('__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); '
             '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");')
  wave_barrier = ('__builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront"); __builtin_amdgcn_wave_barrier(); '
                  '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");')
  inf, nan = "__builtin_inff()", '__builtin_nanf("")'
  math = "__builtin_"
  # TC's arg 0 by the lowered statements' kind (lower.tc_kind), laid out as AMD documents them (RDNA3 ISA, "Wave Matrix Multiply
  # Accumulate"; the matrix instruction calculator for CDNA2 and CDNA3): RDNA3's wave32 WMMA, each lane all 16 of K (lanes 16-31 repeating
  # 0-15) and C's rows 2 v + tile_row; CDNA's v_mfma_f32_16x16x16{f16,bf16_1k}, each lane 4 of K and C's rows 4 tile_row + v
  MATRIX = {"wmma": AMDMatrix(32, 16, 0, 1, 2, ("__builtin_amdgcn_wmma_f32_16x16x16_f16_w32", "__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32")),
            "mfma": AMDMatrix(64, 4, 4, 4, 1, ("__builtin_amdgcn_mfma_f32_16x16x16f16", "__builtin_amdgcn_mfma_f32_16x16x16bf16_1k"), ", 0, 0, 0")}

  def kernel_head(self, name: str, args: list[str], threads: int) -> str:
    return f'extern "C" __attribute__((global)) void __attribute__((amdgpu_flat_work_group_size(1, {threads}))) {name}({", ".join(args)})'

  # float64 exp2, log2 and sin are calls into ROCm's device library (ocml), which hiprtc links; the GPU has no instructions for them
  ocml = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin"}
  def code(self, op: Ops, args: Sequence[str], dtype: DType) -> str:
    if op is Ops.MUL and dtype == dtypes.float16: return f"tt_hmul({args[0]}, {args[1]})"
    return f"__ocml_{self.ocml[op]}_f64({args[0]})" if op in self.ocml and dtype == dtypes.float64 else super().code(op, args, dtype)
  def prelude(self, k: Kernel) -> str:
    used = _dtypes(k)
    decl = "".join(f'extern "C" __attribute__((device, const)) double __ocml_{f}_f64(double);\n' for f in self.ocml.values())
    # float16 arithmetic is native, and clang fuses a product and an add into v_fma_f16 (one rounding; NumPy rounds each op): as on
    # the CPU (see HALF_PRODUCT), each float16 product passes through an empty asm that holds it in a register
    hmul = f'{self.func_prefix} _Float16 tt_hmul(_Float16 a, _Float16 b) {{ _Float16 p = a * b; __asm__("" : "+v"(p)); return p; }}\n'
    tc = ""
    if k.tc is not None:  # the builtins' A and B (bfloat16 as its bits in shorts) and C as vectors
      m, ab = self.MATRIX[tc_kind(k)], "short" if k.tc.a.dtype == dtypes.bfloat16 else "_Float16"
      tc = (f"typedef {ab} tt_ab{m.elements} __attribute__((vector_size({2 * m.elements})));\n"
            f"typedef float tt_c{m.floats} __attribute__((vector_size({4 * m.floats})));\n")
    return (decl if dtypes.float64 in used else "") + (hmul if dtypes.float16 in used else "") + tc + super().prelude(k)

  def wmma(self, u: UOp, at: _At) -> str:
    """The TC statements as AMD's matrix builtins (see MATRIX): each lane loads its elements of A's row and B's column (one load where K
    is contiguous) and stores its floats of C to the warp's 256 floats of shared memory, in the row-major places the epilogue reads."""
    kind, what, *arg = u.arg
    m = self.MATRIX[kind]
    if what == "ids":
      return f"{self.index_type} lid = {self.local_id}, warp = lid / {m.wave}, lane = lid % {m.wave}, tile_row = lane / 16, tile_col = lane % 16;"
    if what == "acc": return f"tt_c{m.floats} acc{arg[0]} = {{}};"
    if what == "fragment": return f"tt_ab{m.elements} {arg[0]};"
    if what == "load":
      name, buf, ld, which, layout = arg
      k = f"({_term(m.k_row, 'tile_row')}+e)" if m.k_row else "e"
      i, j = ("tile_col", k) if which == "a" else (k, "tile_col")  # the element's row and column in the 16x16 tile of A or B
      p = f"{self.ptr(buf)}+{self.index(u.src[0], at.index)}"
      if (which == "a") == (layout == "row_major"):  # K is contiguous: rows 16-byte aligned (TC's checks), a lane's first element at K k_row tile_row
        n = 2 * m.elements
        return f"__builtin_memcpy(&{name}, __builtin_assume_aligned({_sum(p, f'tile_col*{ld}', _term(m.k_row, 'tile_row'))}, {min(16, n)}), {n});"
      return f"for (int e = 0; e < {m.elements}; e++) {name}[e] = ({p})[{f'{i}*{ld}+{j}' if layout == 'row_major' else f'{j}*{ld}+{i}'}];"
    if what == "mma":
      return f"acc{arg[0]} = {m.builtins[arg[3] == dtypes.bfloat16]}({arg[1]}, {arg[2]}, acc{arg[0]}{m.modifiers});"
    if what == "store":
      row = _sum(_term(m.c_row, "tile_row"), _term(m.c_step, "v"))
      return f"for (int v = 0; v < {m.floats}; v++) tiles[warp*256+({row})*16+tile_col] = acc{arg[0]}[v];"
    # sync: the epilogue reads elements lane + wave p of the warp's tile; where another lane of the wave stored them, the wave meets first
    return "// no wave barrier: the epilogue's floats of C are the lane's own" if m.lane_own() else self.wave_barrier
  statements = {**CStyleRenderer.statements, Ops.WMMA: wmma}


class OpenCLRenderer(_GPURenderer):
  """OpenCL C. Without the cl_khr_fp16 extension, float16 is a storage type: loaded and stored with vload_half and
  vstore_half, computed in float32."""
  buffer_types = {dtypes.bool: "uchar", dtypes.bfloat16: "ushort"}  # bool has no defined size in OpenCL, so it is not allowed in buffers
  # OpenCL C 1.2 has no atomic 64-bit store without an extension: a plain one, which lands whole (aligned) on every device it runs on.
  # Each work-item stores at its own element past idx, by its first local id (flag_size): pocl runs a work-group's items as a loop,
  # whose vectorizer makes a store to one address under a condition a masked scatter, slow even where no lane stores (a 10^6 gather
  # on Zen 4: 4.2 ms against 2.1 unchecked), and a store to consecutive ones a masked vector store (2.1 against 2.0)
  def store_any(self, ptr: str, idx: str, val: str, dtype: DType) -> str: return self.store(ptr, f"{idx}+get_local_id(0)", val, dtype)
  def flag_size(self, caps: DeviceCaps) -> int: return caps.max_local

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

  # OpenCL's own vector types; vload/vstore need only float alignment, and take global and local (STAGE's tiles) memory alike
  lane_fmt = "{}.s{:x}"
  def vtype(self, width: int) -> str: return f"float{width}"
  def vector(self, vt: str, items: list[str]) -> str: return f"(({vt})({', '.join(items)}))"
  def vector_prelude(self, width: int, used: set[DType]) -> str:
    vt = self.vtype(width)
    return f"#define {vt}_load(p) vload{width}(0, (p))\n#define {vt}_store(p, v) vstore{width}((v), 0, (p))\n"

  def prelude(self, k: Kernel) -> str:
    used = _dtypes(k)
    if dtypes.float64 in used and not self.fp64: raise NotImplementedError("this OpenCL device has no float64 (no cl_khr_fp64): use float32")
    return ("#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n" if self.fp16 and dtypes.float16 in used else "") + \
      ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if dtypes.float64 in used else "") + super().prelude(k)


def _dtypes(k: Kernel) -> set[DType]: return {u.dtype for u in k.ast.toposort}


DYNAMIC_SHARED = "extern __shared__ __align__(128) unsigned char tt_shared[];  // {} bytes, given by the launch"


def dynamic_shared(src: str) -> int:
  """The bytes of dynamic shared memory a CUDA source's kernel takes (CUDARenderer.body_start): 0 where its arrays are static."""
  return int(m[1]) if (m := re.search(r"unsigned char tt_shared\[\];  // (\d+) bytes, given by the launch", src)) else 0


class _At:
  """Where one program's spelling is: the depth of loops and branches, the index math spelled so far (each node once), and the offsets
  of the shared arrays in dynamic shared memory (CUDA's, past STATIC_SHARED)."""
  __slots__ = ("index", "depth", "shared")
  def __init__(self) -> None: self.index, self.depth, self.shared = dict[UOp, str](), 1, dict[UOp, int]()
