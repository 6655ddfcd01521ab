"""A lowered program's statements: their args, values, the program, and what lowering needs of its target."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, Protocol

from tinytune.codegen.kernel import Kernel
from tinytune.dtype import DType, dtypes
from tinytune.uop import ALU, TRANSCENDENTAL, Ops, UOp, pretty

# A program's statements, as (src; arg), each arg of several fields a NamedTuple below:
#   RANGE (; LoopArg) ... ENDRANGE, IF (x != c) ... ELSE ... ENDIF, EXIT (x != c): the thread stops here
#   DEFINE_ACC (identity; AccArg), ASSIGN (target, value, guard; the reduce op that adds value in, or None)
#   LOAD (index, valid; LoadArg), STORE (index, value, guard; StoreArg), VECTORIZE (lanes; ValueArg)
#   an ALU op (operands; ValueArg), FOLD (values; FoldArg): values[0] op values[1] op ..., INRANGE (x, n; ValueArg): 0 <= x < n
#   DEFINE_VAR (ok, x; ValueArg): an index variable, x where ok else 0, SPECIAL (; SpecialArg): a variable from a thread or group id
#   DEFINE_LOCAL (; LocalArg): shared memory (the CPU: an array of the thread's), BARRIER (; None: the workgroup's, "stores": the thread's
#   streaming stores done, "commit_group" and ("wait_group", n): PTX cp.async's, see StoreArg.cp_async),
#   WMMA (src; "wmma", "mma", "wgmma" or "mfma", what, ...): a GPU's tensor core statements (the API or RDNA3's WMMA, PTX mma.sync,
#   sm_90a's wgmma from shared tiles, or "wmma"'s statements across CDNA's 64-lane wavefront; ("wgmma", "accs", tiles) the accumulators
#   of the tiles that one wgmma computes side by side, ("wgmma", "mma", tiles, A's tile, its stride offset, B's tile, its stride offset,
#   dtype) with src the tiles' element offsets); the
#   CPU's: WMMA (offsets; "pair", name, width, buffer, kind):
#   bfloat16 pairs: two neighbours ("splat": one offset) or two elements ("splat2") in every lane, two vectors interleaved ("rows"), or
#   neighbours along the lanes ("neighbours": one offset),
#   WMMA (acc; "dot", width, a, b): acc += the pairs' products
# Inside them: index math, CONST, GEP (vector; lane), VECTORIZE (a splat), CELL (; array, index text), LOAD (KBLOCK's reload).
TRUE = UOp.const(dtypes.bool, True)
OPENS, CLOSES = {Ops.RANGE, Ops.IF, Ops.ELSE}, {Ops.ENDRANGE, Ops.ENDIF, Ops.ELSE}
# statements that define a named value: arg is (name, width) (width 1: a scalar, else a native vector), DEFINE_ACC adds its reduce op
VALUES = ALU | {Ops.DEFINE_ACC, Ops.LOAD, Ops.VECTORIZE, Ops.FOLD, Ops.INRANGE, Ops.DEFINE_VAR}
STATEMENTS = VALUES | OPENS | CLOSES | {Ops.EXIT, Ops.ASSIGN, Ops.STORE, Ops.SPECIAL, Ops.DEFINE_LOCAL, Ops.BARRIER, Ops.WMMA}
CMP = {Ops.CMPLT, Ops.CMPNE}
ROW_KEPT = TRANSCENDENTAL | {Ops.SQRT}  # a row statistic's source with these is computed once, kept in an array
ARITH = {Ops.ADD, Ops.MUL, Ops.NEG, Ops.RECIP}  # ops that C-style vector operators spell, taking scalars beside vectors
FLOAT_LANES = (dtypes.float32, dtypes.float16, dtypes.bfloat16)  # the CPU's C computes these in float32 SIMD lanes (CRenderer)


# a buffer (LoadArg, StoreArg) is the kernel's argument number (0: the output) or the name of an array of DEFINE_LOCAL; a width is 1
# for a scalar, else the lanes of a native vector
class ValueArg(NamedTuple):  # an ALU op, VECTORIZE, INRANGE, DEFINE_VAR
  name: str
  width: int


class AccArg(NamedTuple):  # DEFINE_ACC
  name: str
  width: int
  op: Ops  # the reduce op


class LoadArg(NamedTuple):  # LOAD
  name: str | None  # None: inline where used (KBLOCK's reload)
  width: int
  buf: int | str


class StoreArg(NamedTuple):  # STORE
  width: int
  buf: int | str
  stream: bool  # past the caches: a whole 64-byte line, or half of one beside the store of the other half (Lowerer.half_lines)
  cp_async: str = ""  # "ca" or "cg": a copy of a LOAD from global memory to shared memory by PTX cp.async, which lands at the
  # BARRIER ("wait_group", n) that covers the BARRIER "commit_group" after it
  any: bool = False  # threads may store to the one element together, any of their values landing (CHECK's flag): an atomic store


class FoldArg(NamedTuple):  # FOLD
  name: str
  width: int
  op: Ops
  across: bool = False  # lane j of the result folds the lanes of values[j]


class LoopArg(NamedTuple):  # RANGE
  var: str
  start: int
  end: int
  parallel: bool  # iterations across the cores


class SpecialArg(NamedTuple):  # SPECIAL: var = id / divisor % modulus (no modulus where 0)
  var: str
  id: str
  divisor: int
  modulus: int



class LocalArg(NamedTuple):  # DEFINE_LOCAL
  name: str
  size: int
  stored: bool = False  # elements as a buffer holds them (a 16-bit float as 16 bits: TC's fragments read it), else as computed


# the args that every lowering makes many of, made once (a NamedTuple costs several times a tuple to make; names repeat across kernels)
@functools.cache
def value_arg(prefix: str, n: int, width: int) -> ValueArg: return ValueArg(f"{prefix}{n}", width)
@functools.cache
def load_arg(n: int, width: int, buf: int | str) -> LoadArg: return LoadArg(f"v{n}", width, buf)
store_arg = functools.cache(StoreArg)


class Kind(Enum):
  SCALAR = "scalar"  # one scalar for every lane
  VECTOR = "vector"  # one native vector
  LANES = "lanes"  # one scalar per lane


class Val(NamedTuple):
  """A lowered value: its kind and its nodes (one, or one per lane)."""
  kind: Kind
  items: tuple[UOp, ...]
  padding: bool = False  # a zero that a pad put where its view's mask is false here (a cat's other pieces): adding it is a no-op

  def lane(self, i: int) -> UOp:
    if self.kind is Kind.VECTOR: return UOp.unique(Ops.GEP, self.items[0].dtype, self.items[:1], i)
    return self.items[0] if self.kind is Kind.SCALAR else self.items[i]


def identity(red: UOp) -> UOp:
  """The reduce's start value: 0 for a sum, the least value of its dtype for a max."""
  dt = red.dtype
  return UOp.const(dt, 0 if red.arg[0] is Ops.ADD else -math.inf if dt.is_float else int(dtypes.min(dt)))


@dataclass
class LinearProgram:
  """A kernel's lowered statements in order, the SIMD width of its native vectors (1: none), and whether the C compiler's loop
  vectorizer is better off: where the kernel adds floats into a scalar accumulator in order (which some compilers' vectorizers
  miscompile), or copies a tile across rows with no reduce (a transpose, whose unrolled tile it spent seconds on for nothing)."""
  kernel: Kernel
  width: int
  uops: list[UOp]
  no_loop_vectorizer: bool = False

  def __str__(self) -> str:
    depth, out = 0, []
    for u in self.uops:
      if u.op in CLOSES: depth -= 1
      out.append("  " * depth + describe(u))
      if u.op in OPENS: depth += 1
    return "\n".join(out)


def describe(u: UOp) -> str:
  """One statement as text: `name = OP<width>.dtype operands` for values, `OP operands` for the rest."""
  def show(x: UOp) -> str:
    if x.op in VALUES and x.arg is not None and x.arg.name is not None: return x.arg.name
    return f"{show(x.src[0])}[{x.arg}]" if x.op is Ops.GEP else f"{x.arg[0]}[{x.arg[1]}]" if x.op is Ops.CELL else pretty(x)
  def at(buf: int | str, idx: UOp, guard: UOp) -> str:
    return f"{buf if isinstance(buf, str) else f'data{buf}'}[{pretty(idx)}]" + ("" if guard is TRUE else f" if {pretty(guard)}")
  op, src, arg = u.op, u.src, u.arg
  if op in VALUES:
    head = f"{arg.name} = {op.name}{f'<{arg.width}>' if arg.width > 1 else ''}.{u.dtype.name}"
    if op is Ops.LOAD: return f"{head} {at(arg.buf, *src)}"
    return f"{head} {', '.join(show(s) for s in src)}" + (f" {arg.op.name}" if op in (Ops.DEFINE_ACC, Ops.FOLD) else "")
  if op is Ops.RANGE: return f"RANGE {arg.var} {arg.start}..{arg.end}" + (" parallel" if arg.parallel else "")
  if op is Ops.STORE:
    kind = f"{' stream' if arg.stream else ''}{f' cp.async.{arg.cp_async}' if arg.cp_async else ''}"
    return f"STORE{f'<{arg.width}>' if arg.width > 1 else ''}{kind} {at(arg.buf, src[0], src[2])} = {show(src[1])}"
  if op is Ops.ASSIGN:
    return f"ASSIGN {show(src[0])} {arg.name if arg else ''}= {show(src[1])}" + ("" if src[2] is TRUE else f" if {pretty(src[2])}")
  return f"{op.name} {', '.join(show(s) for s in src)} {'' if arg is None else tuple(arg) if isinstance(arg, tuple) else arg}".rstrip()


def stmt(op: Ops, *src: UOp, arg: object = None, dtype: DType = dtypes.void) -> UOp:
  """A statement: a node of its own (never shared, as two loops or loads that look alike are still two)."""
  return UOp.unique(op, dtype, src, arg)


def when(cond: UOp, body: list[UOp]) -> list[UOp]:
  """`body` run where `cond` holds."""
  return [stmt(Ops.IF, cond.alu(Ops.CMPNE, UOp.const(dtypes.bool, False))), *body, stmt(Ops.ENDIF)]


class Target(Protocol):
  """What lowering needs to know of the code it is for (a renderer says)."""
  vector_ops: set[Ops]  # the ops with native float32 vector code (comparisons give masks, WHERE takes one)
  vector_floats: tuple[DType, ...]  # the float dtypes computed in float32 vector lanes (16-bit ones: converted at loads and stores)
  aligned_vectors: bool  # vector loads and stores need addresses aligned to the vector
  has_local: bool  # workgroups: the global loops are workgroups, LOCAL and GROUP parts their threads
  lane_folds: bool  # FOLD (vectors; name, width, op, True): a vector whose lane j folds vector j's lanes


@dataclass
class PlainTarget:
  """C's vector operators and nothing more, with workgroups where the kernel's device has them."""
  has_local: bool
  vector_ops: set[Ops] = field(default_factory=lambda: set(ARITH))
  vector_floats: tuple[DType, ...] = (dtypes.float32,)
  aligned_vectors: bool = False
  lane_folds: bool = False
