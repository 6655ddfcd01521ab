"""Lowering: a kernel with its opts becomes a linear program of UOps that a renderer only spells.

Register parts of the kernel (UPCAST, UNROLL) are expanded into straight-line code. One UPCAST part along the contiguous output
axis becomes SIMD lanes: a value is one scalar for all lanes, one native vector, or one scalar per lane, whichever the loads and
ops allow. Every decision is made here: loop order, the split of a padded reduce loop, K block reloads and stores, LANES partials
and their combine tree, GROUP partials through shared memory, which loads and stores are vector ones, and the names of values."""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, Protocol, Sequence

from tinytune.codegen.kernel import FLASH_PAD, TC_PAD, AxisKind, Kernel, swizzle_line
from tinytune.dtype import DType, dtypes
from tinytune.helpers import prod
from tinytune.shape import split_offset, strides_for
from tinytune.uop import ALU, TRANSCENDENTAL, Ops, UOp, from_linear, is_linear, linear, linear_sum, pretty, simplify

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
  stream: bool  # a whole 64-byte line past the caches
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


class StagedTile(NamedTuple):  # STAGE: a staged input's tile in shared memory
  name: str
  dims: list[tuple[int, int]]  # (dim, extent), outermost first (Kernel.stage_tiles)
  strides: list[int]
  size: int  # elements of one K tile: PIPELINE's ring holds Kernel.stages of them
  line: int  # elements of a swizzled line (kernel.swizzle_line; 0: not swizzled): 16-byte chunk c of line i is at c ^ (i % 8)


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


def lower(k: Kernel, target: Target | None = None) -> LinearProgram:
  """The program of `k` (with its opts) for `target` (a renderer; a plain C target where None)."""
  target = target or PlainTarget(k.caps.has_local)
  lowerer = _Lowerer(k, target, rows=True)
  if k.attention is not None and k.flash_tc: return flash_attention_tc(lowerer)
  if k.attention is not None: return flash_attention(lowerer) if any(a.kind is AxisKind.STAGE for a in k.axes) else attention(lowerer)
  if k.tc is not None and k.caps.has_local: return tensor_cores(lowerer)
  ret = lowerer.program()
  # a row read back where no reduce loop wrote it (the output reads the statistic's source off its row): recomputed instead
  return ret if lowerer.rows is None or lowerer.rows.reads <= lowerer.rows.writes else _Lowerer(k, target, rows=False).program()


Copies = tuple[tuple[list[UOp], list[UOp]], ...]  # STAGE's copies to shared memory: (loads, stores) of a K tile, one or two (PREFETCH)


class LoopNest:
  """The loops around a program's statements: each loop axis's variable, and the statement lists placed in the CPU's loop nest or
  in a GPU's workgroups and threads."""
  def __init__(self, k: Kernel):
    self.k = k
    names = {AxisKind.GLOBAL: "g", AxisKind.REDUCE: "r", AxisKind.THREAD: "t", AxisKind.LOCAL: "l", AxisKind.GROUP: "q", AxisKind.KBLOCK: "k",
             AxisKind.STAGE: "s"}
    self.vars = {i: UOp.var(f"{names[a.kind]}{i}", 0, max(a.size - 1, 0)) if a.size != 1 else UOp.const(dtypes.int64, 0)
                 for i, a in enumerate(k.axes) if a.kind in names}
    if k.raster is not None:  # RASTER: the dim's workgroup index is its band's first plus the place in the band (see group_ids)
      i, band = k.axes.index(k.remaining(k.raster[0])), k.raster[1]
      self.band = (UOp.var(f"g{i}b", 0, k.axes[i].size // band - 1), UOp.var(f"g{i}w", 0, band - 1))
      self.vars[i] = self.band[0] * band + self.band[1]

  def nest(self, axes: list[int], body: list[UOp], start: int = 0, end: int = -1, parallel: bool = False) -> list[UOp]:
    """The loops of `axes` (outermost first; a size-1 axis has none, a size-0 one runs no times) around `body`; `start` and `end`
    bound the outermost loop."""
    opened = []
    for n, i in enumerate(axes):
      if self.k.axes[i].size == 1: continue
      first, last = (start, end if end >= 0 else self.k.axes[i].size) if n == 0 else (0, self.k.axes[i].size)
      opened.append(stmt(Ops.RANGE, arg=LoopArg(self.vars[i].arg[0], first, last, parallel and n == 0)))
    return [*opened, *body, *(stmt(Ops.ENDRANGE) for _ in opened)]

  def cpu(self, bodies: list[list[UOp]], full_bodies: list[list[UOp]], split: int | None, combine: list[list[UOp]], decls: list[UOp],
          post: list[UOp], packs: dict[int, list[UOp]] | None = None) -> list[UOp]:
    """The CPU's loop nest: THREAD parts across cores, then K blocks (inside the threads, which own their outputs), then the global
    loops, each output's accumulators, the reduce loops, the LANES combine and what follows the reduce. A row's statistic (see
    Kernel.reduce_out_dims) is reduced inside the loops of the dims it changes along only, once per row, before the row's loops; a
    chain of them (softmax's max, then its sum), one reduce loop after another. PACK's copies (`packs`, by the number of loops
    around them) go first inside their loops."""
    k = self.k
    outer, t, n = k.cpu_loops()
    red, reduce = [i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE], []
    for stage, body in enumerate(bodies):
      if split is None: reduce += self.nest(red, body)
      else:  # the loop of the padded dim twice: its whole iterations with the body that has no masks, then the rest
        j, cut = red.index(split), k.padded[k.axes[split].dim] // k.axes[split].stride
        reduce += self.nest(red[:j], self.nest(red[j:], full_bodies[stage], 0, cut) + self.nest(red[j:], body, cut))
      reduce += combine[stage]
    # the thread's streaming stores, visible before the kernel ends: a fence last in its share
    fence = [stmt(Ops.BARRIER, arg="stores")] if any(u.op is Ops.STORE and u.arg.stream for u in post) else []
    body, end = decls + reduce + self.nest(outer[n:], post), n
    for at, copies in sorted((packs or {}).items(), reverse=True): body, end = copies + self.nest(outer[at:end], body), at
    return self.nest(outer[:t], self.nest(outer[t:end], body) + fence, parallel=True)

  def staged(self, copies: Copies, body: list[UOp], landed: Sequence[UOp] = ()) -> list[UOp]:
    """STAGE's loop of K tiles around `body` (the loops in a tile): each iteration copies the tiles to shared memory (`copies`:
    loads and stores) between two barriers, the copy waiting until every thread is done reading the last tile, the reads until
    the copy is whole. With PREFETCH (two copies: the first tile's and the next's) the first tile is copied before the loop, and
    each iteration loads the next into registers before the compute and stores it after (the loads' latency behind the compute).
    With PIPELINE (S stages: S-1 copies before the loop, one in it) the copies are cp.async groups into a ring of S buffers: the first
    S-1 tiles' before the loop (a group each, empty past the last tile), and each iteration waits for its tile's group (all but the
    newest S-2), meets the others at one barrier (after which every thread is done reading the buffer of the tile before, which the
    copy of the tile S-1 ahead then fills) and issues that copy as a group before computing; `landed` follows the wait (wgmma's proxy
    fence: the tile's copies, landed, seen by its reads)."""
    tiles = next(i for i, a in enumerate(self.k.axes) if a.kind is AxisKind.STAGE)
    (loads, stores), barrier = copies[0], stmt(Ops.BARRIER)
    if (stages := self.k.stages) > 1:
      commit, (ahead_loads, ahead_stores) = stmt(Ops.BARRIER, arg="commit_group"), copies[-1]
      first = [u for ld, st in copies[:-1] for u in (*ld, *st, stmt(Ops.BARRIER, arg="commit_group"))]
      return first + self.nest([tiles], [stmt(Ops.BARRIER, arg=("wait_group", stages - 2)), *landed, barrier, *ahead_loads, *ahead_stores, commit,
                                         *body])
    if len(copies) == 1: return self.nest([tiles], [*loads, *stores, barrier, *body, stmt(Ops.BARRIER)])
    (next_loads, next_stores) = copies[1]
    return [*loads, *stores, barrier, *self.nest([tiles], [*next_loads, *body, stmt(Ops.BARRIER), *next_stores, stmt(Ops.BARRIER)])]

  def unflatten(self, axes: list[int], linear: str, mult: int = 1, outer: bool = False) -> list[UOp]:
    """Each axis's index from one linear id (over `mult`), the last axis fastest (`outer`: more come before the first)."""
    out = []
    for n, i in enumerate(reversed(axes)):
      size = self.k.axes[i].size
      if size > 1:
        out.append(stmt(Ops.SPECIAL, arg=SpecialArg(self.vars[i].arg[0], linear, mult, 0 if n == len(axes) - 1 and not outer else size)))
      mult *= size
    return out

  def group_ids(self) -> list[UOp]:
    """Each global axis's workgroup index from the workgroup id, in the global order, the last fastest. With RASTER (a dim, bands of
    b workgroups along it) that dim and the next one in the order, c, go in bands: consecutive ids walk down the b workgroups of a
    band in one column of c, then the next column, then the next band, so the workgroups at work together share their rows of one
    input and their columns of the other (in L2) where row after row would read every column of the other input."""
    k = self.k
    axes = [k.axes.index(k.remaining(d)) for d in k.global_order if d not in k.row_dims]  # a row's dims loop (see workgroups)
    if k.raster is None: return self.unflatten(axes, "group_id")
    d = axes.index(k.axes.index(k.remaining(k.raster[0])))
    (rows, cols), band, col, (first, place) = (k.axes[i].size for i in axes[d:d + 2]), k.raster[1], self.vars[axes[d + 1]], self.band
    out, mult = self.unflatten(axes[d + 2:], "group_id", outer=True), prod(k.axes[i].size for i in axes[d + 2:])
    if cols > 1: out.append(stmt(Ops.SPECIAL, arg=SpecialArg(col.arg[0], "group_id", mult * band, cols)))
    out.append(stmt(Ops.SPECIAL, arg=SpecialArg(place.arg[0], "group_id", mult, band)))
    out.append(stmt(Ops.SPECIAL, arg=SpecialArg(first.arg[0], "group_id", mult * band * cols, 0 if d == 0 else rows // band)))
    return out + self.unflatten(axes[:d], "group_id", mult * rows * cols)

  def workgroups(self, bodies: list[list[UOp]], combine: list[list[UOp]], decls: list[UOp], accs: list[tuple[UOp, tuple[UOp, ...], Val]],
                 width: int, post: list[UOp], copies: Copies) -> list[UOp]:
    """The global loops become workgroups and the LOCAL and GROUP parts their threads (in Kernel.thread_axes order), each index
    taken apart from one linear id. Each GROUP thread reduces its share into shared memory, and the group adds them (group_sum);
    its first thread stores. A row written after its statistic (Kernel.row_dims, softmax's) or a chain of statistics: every thread
    takes each total, then the row's loops run in every thread, each over its share of the row (its LOCAL parts). With STAGE, the K
    tiles' loop (see staged)."""
    k = self.k
    out = self.group_ids()
    threads = k.thread_axes
    if threads: out.append(stmt(Ops.SPECIAL, arg=SpecialArg("lid", "local_id", 1, 0)))
    out += self.unflatten(threads, "lid") + self.unflatten(k.row_thread_axes, "lid", outer=True)
    red = [i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE]
    groups = k.sizes_of(AxisKind.GROUP)
    every = groups > 1 and (len(k.reduceops) > 1 or bool(k.row_dims))  # every thread needs each total
    def partials(stage: int | None) -> list[tuple[UOp, UOp]]:
      return [(r, u) for r, _, acc in accs if stage is None or k.reduceops.index(r) == stage
              for u in (acc.lane(i) for i in range(width if acc.kind is not Kind.SCALAR else 1))]
    if groups > 1:
      most = max(len(partials(s)) for s in range(len(bodies))) if every else len(partials(None))
      dt = max((r.dtype for r in k.reduceops), key=lambda d: d.itemsize)
      decls = [*decls, stmt(Ops.DEFINE_LOCAL, arg=LocalArg("partials", most * k.launch_dims[1]), dtype=dt)]
      if every:  # the thread's group's first thread (group_sum): lid less its place in the group
        step = self.group_step()
        decls.append(stmt(Ops.SPECIAL, arg=SpecialArg("q0", "lid", groups, 0) if step == 1 else SpecialArg("q0", "lid", 1, step)))
    if copies: out += decls + self.staged(copies, self.nest(red, bodies[0])) + combine[0]  # one reduce (Kernel.stage_inputs)
    else:
      out += decls
      for stage, body in enumerate(bodies): out += self.nest(red, body) + combine[stage] + (self.group_sum(partials(stage), True) if every else [])
    if groups > 1 and not every: out += self.group_sum(partials(None), False)
    row = self.nest([k.axes.index(k.remaining(d)) for d in k.global_order if d in k.row_dims], post)
    if not every or (shared := prod(k.axes[i].size for i in k.row_thread_axes)) == groups: return out + row
    # fewer threads share the row than the group has (Kernel.apply_opt: they are its fastest): the others have nothing to write
    place = UOp.var("lid", 0, k.launch_dims[1] - 1) % groups
    return [*out, stmt(Ops.IF, place.lt(shared).alu(Ops.CMPNE, UOp.const(dtypes.bool, False))), *row, stmt(Ops.ENDIF)]

  def group_step(self) -> int:
    """lid's step between a thread's GROUP neighbours: 1 where the GROUP parts are the fastest threads (Kernel.thread_axes)."""
    k = self.k
    return 1 if k.axes[k.thread_axes[-1]].kind is AxisKind.GROUP else k.launch_dims[1] // k.sizes_of(AxisKind.GROUP)

  def group_sum(self, partials: list[tuple[UOp, UOp]], every: bool) -> list[UOp]:
    """The GROUP threads' partials (reduce, accumulator) added up: each thread's into shared memory, then a group of a power of two
    adds them in a tree (half the threads each level, a barrier between levels: log2 steps, where one thread adding 255 partials one
    by one took thousands of cycles while the workgroup's other threads waited), any other group's first thread one by one. Then
    only the first thread goes on, or (`every`) each thread reads its group's total from the first's place, behind a barrier, and
    a barrier after it frees the partials for the next reduce."""
    k = self.k
    n, groups = k.launch_dims[1], k.sizes_of(AxisKind.GROUP)
    step = self.group_step()
    dt, lid = max((r.dtype for r in k.reduceops), key=lambda d: d.itemsize), UOp.var("lid", 0, n - 1)  # as workgroups declares them
    def cell(j: int, at: str) -> UOp: return UOp(Ops.CELL, dt, (), ("partials", f"{j * n}+{at}"))
    out = [stmt(Ops.ASSIGN, cell(j, "lid"), u, TRUE) for j, (_, u) in enumerate(partials)]
    place = lid % groups if step == 1 else lid // step  # the thread's place in its group: the first adds up the partials
    first, no = place.alu(Ops.CMPNE, UOp.const(dtypes.int64, 0)), UOp.const(dtypes.bool, False)
    out.append(stmt(Ops.BARRIER))
    if groups & (groups - 1):  # the first thread adds the others' partials one by one
      out.append(stmt(Ops.IF, place.lt(1).alu(Ops.CMPNE, no)) if every else stmt(Ops.EXIT, first))
      out.append(stmt(Ops.RANGE, arg=LoopArg("q", 1, groups, False)))
      at = "lid+q" if step == 1 else f"lid+q*{step}"
      out += [stmt(Ops.ASSIGN, u, cell(j, at), TRUE, arg=red.arg[0]) for j, (red, u) in enumerate(partials)]
      out.append(stmt(Ops.ENDRANGE))
      if not every: return out
      out += [*(stmt(Ops.ASSIGN, cell(j, "lid"), u, TRUE) for j, (_, u) in enumerate(partials)), stmt(Ops.ENDIF)]
    else:
      half = groups // 2
      while half:  # a power of two: the lower half adds the upper half's partials, then a barrier, until one is left
        out.append(stmt(Ops.IF, place.lt(half).alu(Ops.CMPNE, no)))
        out += [stmt(Ops.ASSIGN, u, cell(j, f"lid+{half * step}"), TRUE, arg=red.arg[0]) for j, (red, u) in enumerate(partials)]
        if half > 1 or every: out += [stmt(Ops.ASSIGN, cell(j, "lid"), u, TRUE) for j, (_, u) in enumerate(partials)]
        out.append(stmt(Ops.ENDIF))
        if half > 1: out.append(stmt(Ops.BARRIER))
        half //= 2
      if not every: return [*out, stmt(Ops.EXIT, first)]
    # every thread: its group's first thread is at lid - place
    at = f"q0*{groups}" if step == 1 else "q0"  # see workgroups
    return [*out, stmt(Ops.BARRIER), *(stmt(Ops.ASSIGN, u, cell(j, at), TRUE) for j, (_, u) in enumerate(partials)), stmt(Ops.BARRIER)]


class _Lowerer:
  def __init__(self, k: Kernel, target: Target, rows: bool):
    self.k, self.target, self.count = k, target, 0
    self.lines: list[UOp] = []
    self.memo: dict[tuple, Val] = {}
    self.simplified: dict[UOp, UOp] = {}  # index math is simplified once per kernel, however many lanes and instances share it
    self.view_indices: dict[tuple, tuple[UOp, UOp, tuple[UOp, ...]]] = {}
    self.accs: list[tuple[UOp, tuple[UOp, ...], Val]] = []
    self.acc_at: dict[tuple[UOp, tuple[UOp, ...]], Val] = {}
    self.stage = {r: i for i, r in enumerate(k.reduceops)}  # a chain's reduces run one loop each, in this order
    self.unpadded = -1  # a padded dim lowered as if unpadded (split)
    self.partials: dict[UOp, list[Val]] = {}  # a LANES reduce's accumulator: its partial accumulators, one per vector of lanes
    self.combine: list[list[UOp]] = [[] for _ in k.reduceops]  # after each reduce loop: each LANES accumulator from its partials
    self.unfolded: list[list[tuple[UOp, UOp]]] = [[] for _ in k.reduceops]  # LANES accumulators (named) and their lanes' vector, to fold
    self.decls: list[UOp] = []
    self.cell: UOp | None = None  # TC: the reduce's value is this element of shared memory
    self.bufs = {b: i + 1 for i, b in enumerate(k.bufs)}
    self.rows = RowArrays.of(self) if rows else None
    self.in_body = False
    self.at_dims: list[UOp] = []  # the dims (unclamped) at which add() reads the reduce's source: staged tiles are read by them
    self.acc_dims: dict[tuple[UOp, tuple[UOp, ...]], list[UOp]] = {}  # an accumulator -> the dims of the output instance that made it
    # STAGE: each staged input's tile in shared memory (mma.sync's swizzled, see Kernel.stage_tiles)
    self.staged: dict[UOp, StagedTile] = {}
    if target.has_local and any(a.kind is AxisKind.STAGE for a in k.axes):
      for j, (view, dims, pad) in enumerate(k.stage_tiles()):
        strides = list(strides_for((*(n for _, n in dims[:-1]), dims[-1][1] + pad)))
        line = swizzle_line(dims[-1][1] * view.dtype.itemsize) // view.dtype.itemsize if k.tc is not None and k.tc.mma and not pad else 0
        self.staged[view] = StagedTile(f"tile{j}", dims, strides, dims[0][1] * strides[0], line)
    # PACK: each packed input's array, its panel's dims (see Kernel.pack_tiles), the array's strides and where its copy goes
    self.packed: dict[UOp, tuple[str, list[tuple[int, int]], list[int], int]] = {}
    for j, (view, at, dims) in enumerate(k.pack_tiles() if k.pack else []):
      self.packed[view] = (f"pack{j}", dims, list(strides_for(tuple(e for _, e in dims))), at)
    # the SIMD lane axis: the innermost UPCAST part of the contiguous output dim (size-1 dims after it do not count), for outputs the
    # target computes in float32 lanes, or, where a LANES part splits a float32 reduce, that part: its lanes are partial accumulators,
    # combined after the loop
    self.width, self.lane_axis, self.vf = 1, -1, target.vector_floats
    self.lanes = next((i for i, a in enumerate(k.axes) if a.kind is AxisKind.LANES), -1)
    pair_axis = next((i for i, a in enumerate(k.axes) if a.kind is AxisKind.TC and not k.caps.has_local), -1)  # the CPU's TC
    self.dot_pairs = DotPairs(self, pair_axis) if pair_axis >= 0 else None
    lane_dim = next((d for d in reversed(range(k.n_global)) if k.sizes[d] > 1), -1)  # the last output dim longer than 1
    for i, a in enumerate(k.axes if k.attention is None else ()):  # attention's rows are scalars (see attention)
      if i == self.lanes and k.reduceop is not None and k.reduceop.dtype == dtypes.float32 or \
         self.lanes < 0 and a.kind is AxisKind.UPCAST and a.dim == lane_dim and a.stride == 1 and k.ast.dtype in self.vf:
        self.width = next((w for w in (k.caps.simd_width, 8, 4) if a.size % w == 0 and w <= k.caps.simd_width), 1)
        self.lane_axis = i if self.width > 1 else -1
    # a row written after its statistic (see Kernel.reduce_out_dims): its UPCAST along the row in vectors too, beside the reduce's lanes
    self.row_axis = next((i for i, a in enumerate(k.axes) if self.lanes >= 0 and self.width > 1 and a.kind is AxisKind.UPCAST and a.dim == lane_dim
                          and a.stride == 1 and a.size % self.width == 0 and lane_dim not in k.reduce_out_dims and k.ast.dtype in self.vf), -1)
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
      elif self.in_body and u in self.staged: ret = self.tile_read(u)
      elif self.in_body and u in self.packed: ret = self.pack_read(u)
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
    the flag ends up holding one of them)."""
    val, (lo, hi), buf, dt = self.node(u.src[0], idx), u.arg, self.bufs[u.src[1].arg], u.src[1].dtype  # the flag's: int32 or int64
    for i in range(1 if val.kind is Kind.SCALAR else self.width):
      v = val.lane(i) if u.dtype == dt else self.value(Ops.CAST, dt, (val.lane(i),))
      below, above = self.value(Ops.CMPLT, dtypes.bool, (v, UOp.const(dt, lo))), self.value(Ops.CMPLT, dtypes.bool, (UOp.const(dt, hi - 1), v))
      bad = UOp.var(self.value(Ops.OR, dtypes.bool, (below, above)).arg.name, 0, 1)  # a guard is index math: the value by its name
      self.emit(Ops.STORE, UOp.const(dtypes.int64, 0), v, bad, arg=store_arg(1, buf, False, "", True), dtype=dt)
    return val

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

  # ***** STAGE: tiles of the inputs in shared memory *****
  @functools.cached_property
  def workgroup_parts(self) -> list[UOp]:
    """Each dim's index where it is the same for every thread of the workgroup in one K tile: its workgroup and tile loops' parts."""
    k, vars, kinds = self.k, self.nesting.vars, (AxisKind.GLOBAL, AxisKind.STAGE)
    return [linear_sum(dtypes.int64, [(vars[i], a.stride) for i, a in enumerate(k.axes) if a.dim == d and a.kind in kinds], 0, self.simplified)
            for d in range(len(k.sizes))]

  @functools.cached_property
  def stage_axis(self) -> int: return next(i for i, a in enumerate(self.k.axes) if a.kind is AxisKind.STAGE)

  def tile_offset(self, view: UOp, at: dict[int, UOp], tile: UOp | None = None) -> UOp:
    """Where the element at tile coordinates `at` (dim -> index in the tile) of K tile `tile` (the loop's where None) is in the view's
    shared array, before the swizzle: with PIPELINE, in the ring's buffer tile % stages."""
    t, stages = self.staged[view], self.k.stages
    slot = [] if stages == 1 else [((self.nesting.vars[self.stage_axis] if tile is None else tile) % stages, t.size)]
    if (tc := self.k.tc) is None or not tc.wgmma:
      return linear_sum(dtypes.int64, [(at[d], st) for (d, _), st in zip(t.dims, t.strides)] + slot, 0, self.simplified)
    # wgmma's unswizzled K-major layout: core matrices of 8 rows (A's M or B's N, the tile's last dim) by 8 of K (its first), 128
    # contiguous bytes each, K's next (the leading offset, 128 bytes), then the next 8 rows (the stride offset: 16 bytes a K of the
    # tile); a batch dim between them outside the whole K x rows block
    (kd, kt), rd = t.dims[0], t.dims[-1][0]
    r, kk = at[rd], at[kd]
    core = r // 8 * (kt * 8) + kk // 8 * 64 + r % 8 * 8 + kk % 8
    batch = [(at[d], st * kt) for (d, _), st in zip(t.dims[1:-1], t.strides[1:-1])]
    return self.simplify(linear_sum(dtypes.int64, batch + slot, 0, self.simplified) + core)

  def swizzle(self, view: UOp, off: UOp) -> UOp:
    """A tile's element offset where it is stored: the 16-byte chunk XORed with its line's index (see StagedTile.line)."""
    t = self.staged[view]
    if not t.line: return off
    return self.simplify(off.alu(Ops.XOR, off // t.line % 8 * (16 // view.dtype.itemsize)))

  def tile_read(self, view: UOp) -> Val:
    """A staged input's value at the dims add() reads, from its tile (by the dims unclamped: the copy clamped them). A float32 read along the
    tile's rows but not the lanes (A's rows of a register tile, A transposed in shared memory) takes the aligned 16-byte vector
    around it, once per reduce body, where the thread's register part along the row is whole vectors."""
    name, dims = self.staged[view][:2]
    wg = {v: UOp.const(dtypes.int64, 0) for part in self.workgroup_parts for v in part.vars}
    off = self.swizzle(view, self.tile_offset(view, {d: self.simplify(self.at_dims[d].substitute(wg)) for d, _ in dims}))
    row, w = dims[-1][0], self.width
    if w == 4 and view.dtype == dtypes.float32 and not self.lane_dep(off) and \
       any(a.kind is AxisKind.UPCAST and a.dim == row and a.stride == 1 and a.size % w == 0 for a in self.k.axes):
      if (r := self.simplify(off % w)).op is Ops.CONST:
        base = self.simplify(off - r)
        if (key := (name, base)) not in self.memo: self.memo[key] = self.read(view.dtype, name, base + self.lane, TRUE)
        return Val(Kind.SCALAR, (self.memo[key].lane(int(r.arg)),))
    if (key := (name, off)) not in self.memo: self.memo[key] = self.read(view.dtype, name, off, TRUE)
    return self.memo[key]

  def stage_copies_all(self) -> Copies:
    """STAGE's copies (see LoopNest.staged): the loop's tile; with PREFETCH the first tile and the loop's next; with PIPELINE the
    first stages-1 tiles (none past the last) and the loop's tile stages-1 ahead. None without STAGE."""
    if not self.staged: return ()
    k, var = self.k, self.nesting.vars[self.stage_axis]
    n, zero = k.axes[self.stage_axis].size, UOp.const(dtypes.int64, 0)
    self.decls += [stmt(Ops.DEFINE_LOCAL, arg=LocalArg(t.name, t.size * k.stages, k.tc is not None), dtype=view.dtype)
                   for view, t in self.staged.items()]
    if k.stages > 1:
      ahead = self.simplify(var + (k.stages - 1))
      first = [self.stage_copies(UOp.const(dtypes.int64, j), TRUE) if j < n else ([], []) for j in range(k.stages - 1)]
      return (*first, self.stage_copies(ahead, self.simplify(ahead.lt(n))))
    if k.prefetch: return (self.stage_copies(zero, TRUE), self.stage_copies(self.simplify(var + 1), self.simplify(var.lt(n - 1))))
    return (self.stage_copies(var, TRUE),)

  def stage_copies(self, tile: UOp, exists: UOp) -> tuple[list[UOp], list[UOp]]:
    """The loads and the stores by which a workgroup's threads copy each staged input's K tile `tile` (where `exists`) to shared memory:
    the tile's elements in the input's memory order (the fastest dim in memory first) dealt out to the threads in turn, so a warp reads
    contiguous memory; in vectors of the lane width where that dim is contiguous and splits into them. With PIPELINE the stores are
    cp.async's (StoreArg.cp_async, of an inline load; no loads apart): 16 bytes where a chunk is contiguous and 16-byte aligned in
    memory and in the tile, else an element each (16-bit elements, which cp.async cannot copy alone: a load and a store)."""
    k, n = self.k, self.k.launch_dims[1]
    loads, stores = list[UOp](), list[UOp]()
    lid = UOp.var("lid", 0, n - 1) if n > 1 else UOp.const(dtypes.int64, 0)
    var = self.nesting.vars[self.stage_axis]
    at_tile = {var: tile} if var.op is Ops.VAR else {}
    chunk_lane = UOp.var("chunk_lane", 0, 15)
    for view, t in self.staged.items():
      st, size, buf = view.arg.strides, view.dtype.itemsize, self.bufs[view.src[0].arg]
      order = sorted(t.dims, key=lambda dn: (abs(st[dn[0]]) or 1 << 62, -dn[0]))  # memory's fastest first
      fast, run = order[0][0], 16 // size
      chunk = t.dims[0][0] if k.tc is not None and k.tc.wgmma else t.dims[-1][0]  # the tile's contiguous dim (wgmma's: K, 8 a core row)
      if k.stages > 1: w = run if st[fast] == 1 and chunk == fast and order[0][1] % run == 0 else 1
      else: w = self.width if self.width > 1 and st[fast] == 1 and order[0][1] % self.width == 0 and view.dtype == dtypes.float32 else 1
      lane = chunk_lane if k.stages > 1 else self.lane
      counts = [size // w if d == fast else size for d, size in order]
      for j in range(-(-prod(counts) // n)):
        rest = e = self.simplify(lid + j * n)
        guard = exists if (j + 1) * n <= prod(counts) else self.simplify(e.lt(prod(counts)).logical_and(exists))
        at: dict[int, UOp] = {}
        for i, ((d, _), c) in enumerate(zip(order, counts)):
          at[d] = self.simplify(rest if i == len(order) - 1 else rest % c)
          rest = self.simplify(rest // c)
        if w > 1: at[fast] = self.simplify(at[fast] * w + lane)
        idx = tuple(self.clamp(d, self.simplify(self.workgroup_parts[d].substitute(at_tile) + at.get(d, 0))) for d in range(len(k.sizes)))
        off, valid, _ = self.view_index(view, idx)
        dst = self.tile_offset(view, at, tile)
        if k.stages == 1:
          self.lines = loads
          val = self.read(view.dtype, buf, off, self.simplify(valid.logical_and(guard)) if guard is not TRUE else valid)
          self.lines = stores
          self.store(val, self.swizzle(view, dst), guard, t.name, view.dtype)
          continue
        first = {chunk_lane: UOp.const(dtypes.int64, 0)}
        off0, dst0 = self.simplify(off.substitute(first)), self.simplify(dst.substitute(first))
        if w > 1 and self.simplify(off - off0) is chunk_lane and chunk_lane not in valid.vars and self.simplify(off0 % w).arg == 0 \
           and self.simplify(dst0 % w).arg == 0:
          stores.append(self.cp_async(view, self.swizzle(view, dst0), off0, valid, guard, w))
          continue
        for c in range(w):  # element by element
          at_c = {chunk_lane: UOp.const(dtypes.int64, c)}
          off_c, valid_c, dst_c = (self.simplify(x.substitute(at_c)) for x in (off, valid, dst))
          if size >= 4:
            stores.append(self.cp_async(view, self.swizzle(view, dst_c), off_c, valid_c, guard, 1))
          else:
            self.lines = stores
            val = self.read(view.dtype, buf, off_c, self.simplify(valid_c.logical_and(guard)) if guard is not TRUE else valid_c)
            self.store(val, self.swizzle(view, dst_c), guard, t.name, view.dtype)
    return loads, stores

  # ***** PACK: panels of the inputs in arrays of the thread's (the CPU's) *****
  @functools.cached_property
  def panel_parts(self) -> list[UOp]:
    """Each dim's index where it is the same for a whole panel: its parts outside the panel's loops (threads, K blocks, global loops)."""
    k, kinds = self.k, (AxisKind.GLOBAL, AxisKind.THREAD, AxisKind.KBLOCK)
    return [linear_sum(dtypes.int64, [(self.nesting.vars[i], a.stride) for i, a in enumerate(k.axes) if a.dim == d and a.kind in kinds], 0,
                       self.simplified) for d in range(len(k.sizes))]

  def pack_read(self, view: UOp) -> Val:
    """A packed input's value at the dims add() reads, from its panel: each dim's index less its part outside the panel."""
    name, dims, strides, _ = self.packed[view]
    outside = {v: UOp.const(dtypes.int64, 0) for part in self.panel_parts for v in part.vars}
    off = linear_sum(dtypes.int64, [(self.simplify(self.at_dims[d].substitute(outside)), st) for (d, _), st in zip(dims, strides)], 0,
                     self.simplified)
    if (key := (name, off)) not in self.memo: self.memo[key] = self.read(view.dtype, name, off, TRUE)
    return self.memo[key]

  def pack_copies(self) -> dict[int, list[UOp]]:
    """PACK's copies, by the number of loops around them: each panel's array, then loops over its reduce dims whose body copies the
    output dims' parts (unrolled); in vectors along the input's fastest dim in memory where that is contiguous and splits into them."""
    k, ret = self.k, dict[int, list[UOp]]()
    for j, (view, (name, dims, strides, at)) in enumerate(self.packed.items()):
      self.lines = ret.setdefault(at, [])
      self.emit(Ops.DEFINE_LOCAL, arg=LocalArg(name, prod(e for _, e in dims)), dtype=view.dtype)
      st = view.arg.strides
      fast = min(dims, key=lambda de: (abs(st[de[0]]) or 1 << 62, -de[0]))[0]
      w = self.width if self.width > 1 and st[fast] == 1 and dict(dims)[fast] % self.width == 0 else 1
      def steps(d: int, e: int) -> int: return e // w if d == fast else e
      loops = [(d, e) for d, e in dims if d >= k.n_global and steps(d, e) > 1]
      at_loop = {d: UOp.var(f"c{j}_{d}", 0, steps(d, e) - 1) for d, e in loops}
      for d, e in loops: self.emit(Ops.RANGE, arg=LoopArg(at_loop[d].arg[0], 0, steps(d, e), False))
      unrolled = [(d, e) for d, e in dims if d not in at_loop]
      for vals in itertools.product(*(range(steps(d, e)) for d, e in unrolled)):
        pos = {**at_loop, **{d: UOp.const(dtypes.int64, v) for (d, _), v in zip(unrolled, vals)}}
        if w > 1: pos[fast] = self.simplify(pos[fast] * w + self.lane)
        idx = tuple(self.clamp(d, self.simplify(self.panel_parts[d] + pos.get(d, 0))) for d in range(len(k.sizes)))
        off, valid, _ = self.view_index(view, idx)
        val = self.read(view.dtype, self.bufs[view.src[0].arg], off, valid)
        self.store(val, linear_sum(dtypes.int64, [(pos[d], s) for (d, _), s in zip(dims, strides)], 0, self.simplified), TRUE, name, view.dtype)
      self.lines += [stmt(Ops.ENDRANGE) for _ in loops]
    return ret

  def cp_async(self, view: UOp, dst: UOp, src: UOp, valid: UOp, guard: UOp, width: int) -> UOp:
    """A store of `width` elements of `view`'s buffer at `src` (zeros where not `valid`) to its tile at `dst` by cp.async (where `guard`):
    .cg (past L1) for 16 bytes, else .ca."""
    t, dt = self.staged[view], view.dtype
    load = stmt(Ops.LOAD, src, valid, arg=LoadArg(None, width, self.bufs[view.src[0].arg]), dtype=dt)
    return stmt(Ops.STORE, dst, load, guard, arg=StoreArg(width, t.name, False, "cg" if width * dt.itemsize == 16 else "ca"), dtype=dt)

  def define_acc(self, red: UOp, name: str, width: int = 1) -> UOp:
    self.decls.append(u := stmt(Ops.DEFINE_ACC, identity(red), arg=AccArg(name, width, red.arg[0]), dtype=red.dtype))
    return u

  def acc(self, red: UOp, idx: tuple[UOp, ...]) -> Val:
    if self.cell is not None: return Val(Kind.SCALAR, (self.cell,))
    if (ret := self.acc_at.get((red, idx))) is not None: return ret  # a chain's earlier statistic, read by a later reduce's loop
    self.count += 1
    name = f"acc{self.count}"
    if self.lanes >= 0: return self.lanes_acc(red, idx, name)
    if not self.lane_dep(*idx): ret = Val(Kind.SCALAR, (self.define_acc(red, name),))
    elif red.dtype == dtypes.float32 and red.arg[0] is Ops.ADD: ret = Val(Kind.VECTOR, (self.define_acc(red, name, self.width),))
    else: ret = Val(Kind.LANES, tuple(self.define_acc(red, f"{name}_{i}") for i in range(self.width)))
    self.accs.append((red, idx, ret))
    self.acc_at[(red, idx)] = ret
    return ret

  def lanes_acc(self, red: UOp, idx: tuple[UOp, ...], name: str) -> Val:
    """A reduce split by LANES: a partial accumulator per vector of lanes (a vector where the device has the op, else a scalar per
    lane), each reading its own elements; after the loop the partials combine into the one scalar accumulator: the vectors into
    one, whose lanes fold with the other accumulators' (see fold_lanes), or the scalars in a tree."""
    op, stage = red.arg[0], self.stage[red]  # vectors of 16-bit floats only for a max, which rounds nothing
    vector = self.width > 1 and (red.dtype == dtypes.float32 or red.dtype in self.vf and op is Ops.MAX) and op in self.target.vector_ops
    partials = [Val(Kind.VECTOR, (self.define_acc(red, f"{name}_{j}", self.width),)) if vector else
                Val(Kind.LANES, tuple(self.define_acc(red, f"{name}_{j}_{i}") for i in range(self.width)))
                for j in range(self.k.axes[self.lanes].size // self.width)]
    if vector:  # the vectors first; the accumulator named now, defined once its lanes fold
      self.combine[stage].append(v := stmt(Ops.FOLD, *(p.items[0] for p in partials), arg=FoldArg(f"{name}_v", self.width, op), dtype=red.dtype))
      self.unfolded[stage].append((acc := UOp.unique(Ops.FOLD, red.dtype, (), FoldArg(name, 1, op)), v))
    else: acc = self.tree(stage, [p.lane(i) for p in partials for i in range(self.width)], FoldArg(name, 1, op), red.dtype)
    ret = Val(Kind.SCALAR, (acc,))
    self.partials[acc] = partials
    self.accs.append((red, idx, ret))
    self.acc_at[(red, idx)] = ret
    return ret

  def tree(self, stage: int, lanes: list[UOp], arg: FoldArg, dtype: DType) -> UOp:
    """A fold of `lanes` (a statement named by `arg`) after a stage's loop, in a tree of named values, neighbouring lanes first (an
    operand may be spelled more than once in an op's code)."""
    while len(lanes) > 2:
      lanes = [self.fold(stage, lanes[i:i + 2], FoldArg(f"{arg.name}_c{len(self.combine[stage])}", 1, arg.op), dtype)
               if i + 1 < len(lanes) else lanes[i] for i in range(0, len(lanes), 2)]
    return self.fold(stage, lanes, arg, dtype)

  def fold(self, stage: int, items: list[UOp], arg: FoldArg, dtype: DType) -> UOp:
    self.combine[stage].append(u := stmt(Ops.FOLD, *items, arg=arg, dtype=dtype))
    return u

  def fold_lanes(self) -> None:
    """Each stage's LANES accumulators (see lanes_acc) from their vectors: where the target folds lanes across vectors, as many
    accumulators as a vector has lanes at once, in one statement whose lane j folds vector j's lanes (a transpose as it adds: 15
    adds of shuffled halves, 30 shuffles, for 16 vectors, where each vector's tree took 15 extracts and 15 scalar adds), each then
    reading its lane; a lone one, or any on other targets, in a tree."""
    group = self.width if self.target.lane_folds else 1
    for stage, pending in enumerate(self.unfolded):
      for at in range(0, len(pending), group):
        (first, _), chunk = pending[at], pending[at:at + group]
        if len(chunk) > 1:
          across = FoldArg(f"{first.arg.name}_l", self.width, first.arg.op, True)
          lanes = Val(Kind.VECTOR, (self.fold(stage, [v for _, v in chunk], across, first.dtype),))
          for j, (acc, _) in enumerate(chunk): self.fold(stage, [lanes.lane(j)], acc.arg, acc.dtype)
        else: self.tree(stage, [Val(Kind.VECTOR, (chunk[0][1],)).lane(i) for i in range(self.width)], first.arg, first.dtype)

  def reduce_index(self, idx: tuple[UOp, ...], dims: list[UOp]) -> tuple[UOp, ...]:
    """The reduce's source index: the output's `idx` with the reduce dims at `dims`."""
    in_idx = list(idx)
    for j, a in enumerate(self.k.reduce_axes): in_idx[a] = self.clamp(self.k.n_global + j, dims[self.k.n_global + j])
    return tuple(in_idx)

  def accumulate(self, red: UOp, idx: tuple[UOp, ...], acc: Val, dims: list[UOp], inst: dict[int, UOp]) -> None:
    if self.dot_pairs is not None: self.dot_pairs.accumulate(red, idx, acc, dims, inst)
    else: self.add(red, idx, acc, dims, inst)

  def partial(self, acc: Val, inst: dict[int, UOp]) -> Val:
    """The accumulator an instance adds into: with LANES, the partial of its vector of lanes."""
    if (parts := self.partials.get(acc.items[0])) is None: return acc
    return parts[int(self.subst_lane(inst[self.lanes], 0).arg) // self.width]

  def add(self, red: UOp, idx: tuple[UOp, ...], acc: Val, dims: list[UOp], inst: dict[int, UOp]) -> None:
    """acc op= the reduce's source at the reduce dims' `dims` (`inst`: the register parts' values)."""
    k, op = self.k, red.arg[0]
    in_idx = self.reduce_index(idx, dims)
    self.at_dims = self.acc_dims.get((red, idx), dims)[:k.n_global] + dims[k.n_global:]
    val = self.node(red.src[0], in_idx)
    if red is k.reduceop and self.rows is not None and self.rows.row_of(in_idx) in self.rows.arrays: self.rows.write(in_idx)
    if (g := self.guard(dims, range(k.n_global, len(k.sizes)))) is not TRUE:
      val = self.alu(Ops.WHERE, red.dtype, [self.index_val(g), val, Val(Kind.SCALAR, (identity(red),))])
    acc = self.partial(acc, inst)
    if acc.kind is Kind.VECTOR: self.emit(Ops.ASSIGN, acc.items[0], self.vec(val) if op is Ops.ADD else self.splat(val), TRUE, arg=op)
    else:
      for i, u in enumerate(acc.items): self.emit(Ops.ASSIGN, u, val.lane(i), TRUE, arg=op)

  def store(self, val: Val, off: UOp, guard: UOp, buf: int | str = 0, dtype: DType | None = None, stream: bool = False) -> None:
    """Store `val` at `off` where `guard` holds; `stream`: a vector store of a whole 64-byte line goes past the caches (the CPU's)."""
    dt = dtype or self.k.ast.dtype
    if self.lane_dep(off) and val.kind is not Kind.SCALAR or self.lane_dep(off, guard):
      base = self.subst_lane(off, 0)
      if val.kind is Kind.VECTOR and not self.lane_dep(guard) and self.contiguous(off, base):
        stream = stream and self.width * dt.itemsize == 64 and not self.target.has_local
        self.emit(Ops.STORE, base, val.items[0], guard, arg=store_arg(self.width, buf, stream), dtype=dt)
        return
      for i in range(self.width):
        self.emit(Ops.STORE, self.subst_lane(off, i), val.lane(i), self.subst_lane(guard, i), arg=store_arg(1, buf, False), dtype=dt)
      return
    self.emit(Ops.STORE, off, val.lane(0), guard, arg=store_arg(1, buf, False), dtype=dt)

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
    if any(a.kind is AxisKind.KBLOCK for a in k.axes): post = self.kblocked(post, partials)
    self.fold_lanes()  # every accumulator made: the output's, and the earlier statistics of a chain (made by the later loops)
    in_order = any(u.op is Ops.DEFINE_ACC and u.arg.width == 1 and u.dtype.is_float and u.arg.op is Ops.ADD for u in self.decls)
    tile = k.reduceop is None and len({a.dim for a in k.axes if a.kind is AxisKind.UPCAST}) > 1
    # STAGE: the first tile's copy, and each tile's (PREFETCH: the next tile's loads before the compute, its stores after)
    copies = self.stage_copies_all()
    if self.target.has_local: uops = self.nesting.workgroups(bodies, self.combine, self.decls, self.accs, self.width, post, copies)
    else: uops = self.nesting.cpu(bodies, full_bodies, split, self.combine, self.decls, post, self.pack_copies())
    return LinearProgram(k, self.width, uops, in_order or tile)

  def kblocked(self, post: list[UOp], partials: list[tuple[Val, UOp, UOp]]) -> list[UOp]:
    """K blocks: the output buffer holds the sums so far between blocks (apply_opt checked that each output element has its own
    accumulator, of its dtype). Each block after the first starts from them; each before the last stores them, and only the
    last runs what follows the reduce."""
    assert len(partials) == len(self.accs), "KBLOCK needs one accumulator per output element"
    kb = next(i for i, a in enumerate(self.k.axes) if a.kind is AxisKind.KBLOCK)
    var, last, dt, zero = self.nesting.vars[kb], self.k.axes[kb].size - 1, self.k.ast.dtype, UOp.const(dtypes.int64, 0)
    def load(off: UOp, width: int = 1) -> UOp: return stmt(Ops.LOAD, off, TRUE, arg=LoadArg(None, width, 0), dtype=dt)
    self.lines = [stmt(Ops.IF, var.alu(Ops.CMPNE, zero))]
    for acc, off, guard in partials:
      base = self.subst_lane(off, 0)
      if acc.kind is Kind.VECTOR and not self.lane_dep(guard) and self.contiguous(off, base):
        self.emit(Ops.ASSIGN, acc.items[0], load(base, self.width), guard)
        continue
      if acc.kind is Kind.SCALAR: self.emit(Ops.ASSIGN, acc.items[0], load(off), guard)
      else:
        for i in range(self.width): self.emit(Ops.ASSIGN, acc.lane(i), load(self.subst_lane(off, i)), self.subst_lane(guard, i))
    self.decls += [*self.lines, stmt(Ops.ENDIF)]
    self.lines = [stmt(Ops.IF, var.alu(Ops.CMPNE, UOp.const(dtypes.int64, last)))]
    for acc, off, guard in partials: self.store(acc, off, guard)
    return [*self.lines, stmt(Ops.ELSE), *post, stmt(Ops.ENDIF)]

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


class RowArrays:
  """The CPU keeps a row statistic's source in an array of the row's values where it computes an exp, log, sin or sqrt: the reduce
  loop writes it, the row's loops read it back (softmax's probabilities, computed once); a 16-bit float summed in float32 is kept
  as it is, before its cast. A pass of the reduce bodies and what follows them, owning the arrays and which were read and written."""
  def __init__(self, lw: _Lowerer, source: UOp, red: UOp):
    self.lw, self.source, self.dims = lw, source, red.arg[1]  # the dims the reduce sums: a row's
    self.arrays: dict[tuple[UOp, ...], str] = {}  # a row -> its array's name
    self.reads, self.writes = set[str](), set[str]()

  @staticmethod
  def of(lw: _Lowerer) -> RowArrays | None:
    k = lw.k
    if (red := k.reduceop) is None: return None
    src = red.src[0]
    if src.op is Ops.CAST and src.src[0].dtype.is_float and src.dtype.itemsize > src.src[0].dtype.itemsize: src = src.src[0]
    keep = k.reduce_out_dims != set(range(k.n_global)) and not any(a.kind is AxisKind.KBLOCK for a in k.axes) and \
      any(u.op in ROW_KEPT for u in src.toposort)
    if keep and k.caps.has_local:  # a GPU's arrays are in shared memory: a workgroup's rows are its threads' own, and fit it
      rows, threads = k.row_dims, k.launch_dims[1]
      per = prod(a.size for a in k.axes if a.kind is AxisKind.UPCAST and a.dim not in rows)  # rows a thread computes
      need = per * (prod(src.shape[d] for d in red.arg[1]) * src.dtype.itemsize + (threads * 8 * len(k.reduceops) if threads > 1 else 0))
      keep = not any(a.kind is AxisKind.LOCAL and a.dim not in rows for a in k.axes) and need <= k.caps.shared_bytes
    return RowArrays(lw, src, red) if keep else None

  def row_of(self, idx: tuple[UOp, ...]) -> tuple[UOp, ...]:  # the row `idx` is in: its index along the dims the reduce keeps
    return tuple(e for d, e in enumerate(idx) if d not in self.dims)

  def at(self, idx: tuple[UOp, ...]) -> tuple[str, UOp]:
    """The array of the row that `idx` is in, and idx's offset in it."""
    src = self.source
    if (row := self.row_of(idx)) not in self.arrays:
      self.arrays[row] = name = f"row{len(self.arrays)}"
      self.lw.decls.append(stmt(Ops.DEFINE_LOCAL, arg=LocalArg(name, prod(src.shape[d] for d in self.dims)), dtype=src.dtype))
    strides = strides_for(tuple(src.shape[d] for d in self.dims))
    return self.arrays[row], linear_sum(dtypes.int64, [(idx[d], st) for d, st in zip(self.dims, strides)], 0, self.lw.simplified)

  def holds(self, idx: tuple[UOp, ...]) -> bool:
    return all(0 <= idx[d].vmin and idx[d].vmax < self.source.shape[d] for d in self.dims)

  def load(self, idx: tuple[UOp, ...]) -> Val:
    name, off = self.at(idx)
    self.reads.add(name)
    return self.lw.read(self.source.dtype, name, off, TRUE)

  def write(self, idx: tuple[UOp, ...]) -> None:
    """The reduce loop stores the source's value at `idx` into its row's array."""
    name, off = self.at(idx)
    self.writes.add(name)
    self.lw.store(self.lw.node(self.source, idx), off, TRUE, name, self.source.dtype)


class DotPairs:
  """The CPU's TC (bfloat16 pairs along K in one dot product instruction, see TensorCore), a pass of the reduce bodies: it owns
  the names of the vectors of pairs made in the body."""
  def __init__(self, lw: _Lowerer, axis: int):
    self.lw, self.axis = lw, axis  # the TC axis: the pair's two instances along K
    self.names: dict[tuple[UOp, ...], str] = {}

  def accumulate(self, red: UOp, idx: tuple[UOp, ...], acc: Val, dims: list[UOp], inst: dict[int, UOp]) -> None:
    """The two instances of a pair along K at once, in a dot product where it can be one, else each added as without TC."""
    lw = self.lw
    if lw.simplify(inst[self.axis]).arg: return
    second = {**inst, self.axis: UOp.const(dtypes.int64, 1)}
    pair = [(inst, dims), (second, lw.dims(second))]
    if not self.dot(idx, lw.partial(acc, inst), [d for _, d in pair]):
      for i, d in pair: lw.add(red, idx, acc, d, i)

  def dot(self, idx: tuple[UOp, ...], acc: Val, pair: list[list[UOp]]) -> bool:
    """acc += A's pair times B's pair in each lane, in one bfloat16 dot product (see TensorCore), where acc is a vector, each input's
    pair in a lane is the same in every lane, its two rows' contiguous lanes, or a pair of neighbours (LANES along K), and no padding
    is masked; False where not."""
    lw = self.lw
    k, tc = lw.k, lw.k.tc
    assert tc is not None
    if acc.kind is not Kind.VECTOR or any(lw.guard(dims, range(k.n_global, len(k.sizes))) is not TRUE for dims in pair): return False
    names, one = [], UOp.const(dtypes.int64, 1)
    for view in (tc.a, tc.b):
      offs = [lw.view_index(view, lw.reduce_index(idx, dims))[0] for dims in pair]
      base = [lw.subst_lane(off, 0) for off in offs]
      if not lw.lane_dep(*offs): kind, base = ("splat", base[:1]) if lw.simplify(offs[1] - offs[0]) is one else ("splat2", base)
      elif all(lw.contiguous(off, b) for off, b in zip(offs, base)): kind = "rows"
      elif lw.simplify(offs[1] - offs[0]) is one and lw.simplify(offs[0] - lw.lane * 2) is base[0] and \
           lw.vectorizable(base[0]): kind, base = "neighbours", base[:1]
      else: return False
      names.append(self.pair(view, base, kind))
    lw.emit(Ops.WMMA, acc.items[0], arg=("dot", lw.width, *names))
    return True

  def pair(self, view: UOp, offs: list[UOp], kind: str) -> str:
    """The name of a vector of pairs of `view`'s elements (see dot), made once per reduce body."""
    lw = self.lw
    if (key := (view.src[0], *offs)) not in self.names:
      lw.count += 1
      self.names[key] = name = f"p{lw.count}"
      lw.emit(Ops.WMMA, *offs, arg=("pair", name, lw.width, lw.bufs[view.src[0].arg], kind))
    return self.names[key]


def tc_kind(k: Kernel) -> str:
  """The family of a GPU's TC statements (see WMMA above): TC's arg 2 or 1 (wgmma, mma.sync), else arg 0 by the lanes it works across."""
  assert k.tc is not None
  return "wgmma" if k.tc.wgmma else "mma" if k.tc.mma else "wmma" if k.caps.warp == 32 else "mfma"


def tensor_cores(lw: _Lowerer) -> LinearProgram:
  """The pass for a GPU's TC: each warp keeps one float32 accumulator fragment per UPCAST tile, loads 16x16 tiles of A and B
  straight from memory in the K loop, then goes through shared memory, where the lowerer's values (`lw.cell` for the sum) apply
  what follows the sum and store."""
  k, tc = lw.k, lw.k.tc
  assert tc is not None
  kind = tc_kind(k)
  def wmma(*arg: object, src: tuple[UOp, ...] = ()) -> UOp: return stmt(Ops.WMMA, *src, arg=(kind, *arg))
  out = lw.nesting.group_ids()
  out.append(wmma("ids"))
  out += lw.nesting.unflatten(sorted((i for i, a in enumerate(k.axes) if a.kind is AxisKind.LOCAL), key=lambda i: k.axes[i].dim), "warp")
  tiles = lw.instances((AxisKind.UPCAST,))
  # wgmma: the tiles side by side along B's columns (Kernel.wgmma_cols) are one m64nNk16, their accumulators one array of its D
  wide = k.wgmma_cols()
  runs: dict[tuple[tuple[int, UOp], ...], list[int]] = {}
  for j, tile in enumerate(tiles): runs.setdefault(tuple((i, v) for i, v in tile.items() if i != wide[0]), []).append(j)
  out += [wmma("accs", tuple(js)) for js in runs.values()] if tc.wgmma else [wmma("acc", j) for j in range(len(tiles))]
  frags: dict[tuple[str, object, UOp], str] = {}
  offsets: dict[tuple[UOp, tuple[UOp, ...]], UOp] = {}
  body: list[UOp] = []
  wg = {v: UOp.const(dtypes.int64, 0) for part in lw.workgroup_parts for v in part.vars} if lw.staged else {}
  def fragment(which: str, view: UOp, layout: str, ld: int, dims: list[UOp]) -> str:
    buf: int | str = lw.bufs[view.src[0].arg]
    line = 0
    if view in lw.staged:  # STAGE: from the workgroup's tile in shared memory (Kernel.stage_tiles; mma.sync's in memory's order, swizzled)
      buf, tile, strides, _, line = lw.staged[view]
      off = lw.tile_offset(view, {d: lw.simplify(dims[d].substitute(wg)) for d, _ in tile})
      st = {d: s for (d, _), s in zip(tile, strides)}
      i, j = (tc.row, k.n_global) if which == "a" else (k.n_global, tc.col)  # the fragment's rows and columns
      layout, ld = ("row_major", st.get(i, 0)) if st.get(j) == 1 else ("col_major", st.get(j, 0))
    else:  # A's offset is the same for each tile along B's dim, and B's along A's: worked out once
      used = tuple(d for d, st in zip(dims, view.arg.strides) if st)
      if (view, used) not in offsets: offsets[view, used] = lw.simplify(view.arg.index(tuple(dims))[0])
      off = offsets[view, used]
    if (key := (which, buf, off)) not in frags:
      frags[key] = name = f"{which}{len(frags)}"
      body.append(wmma("fragment", name, which, view.dtype, layout))
      # mma.sync from shared memory takes ldmatrix, whose rows of 8 elements must start 16-byte aligned (the array is 32-byte aligned)
      r = lw.simplify(off % 8)
      ldmatrix = isinstance(buf, str) and ld % 8 == 0 and r.op is Ops.CONST and r.arg == 0
      assert ldmatrix or not line, "a swizzled tile is read by ldmatrix: its fragments' rows start at multiples of 16 bytes"
      rows = (ldmatrix, *((line,) if line else ())) if tc.mma else ()  # a swizzled tile's line last
      body.append(wmma("load", name, buf, ld, which, layout, *rows, src=(off,)))
    return frags[key]
  if tc.wgmma:  # the warpgroup's wgmmas, each from descriptors of its 64 rows of A and 16 columns of B at the K step (warp 0's)
    warp0 = {**wg, **{lw.nesting.vars[i]: UOp.const(dtypes.int64, 0) for i, a in enumerate(k.axes) if a.kind is AxisKind.LOCAL}}
    def desc(view: UOp, dims: list[UOp]) -> tuple[str, UOp, int]:
      t = lw.staged[view]
      return t.name, lw.tile_offset(view, {d: lw.simplify(dims[d].substitute(warp0)) for d, _ in t.dims}), t.dims[0][1] * 16
    body.append(wmma("fence"))
    for unroll in lw.instances((AxisKind.UNROLL,)):
      for js in runs.values():
        dims = lw.dims({**tiles[js[0]], **unroll})
        (ta, oa, sa), (tb, ob, sb) = desc(tc.a, dims), desc(tc.b, dims)
        body.append(wmma("mma", tuple(js), ta, sa, tb, sb, tc.a.dtype, src=(oa, ob)))
    body.append(wmma("wait"))
  for unroll in lw.instances((AxisKind.UNROLL,)) if not tc.wgmma else ():
    for j, tile in enumerate(tiles):
      dims = lw.dims({**tile, **unroll})
      a, b = fragment("a", tc.a, tc.a_layout, tc.a_ld, dims), fragment("b", tc.b, tc.b_layout, tc.b_ld, dims)
      body.append(wmma("mma", j, a, b, tc.a.dtype))
  red = [i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE]
  copies = lw.stage_copies_all()
  # wgmma reads the tiles through the async proxy: a thread's plain stores to them are fenced after (EMU counts a fence per thread, not per
  # element), and with PIPELINE its cp.asyncs where they land, after the wait, before the barrier
  landed = [wmma("proxy")] if tc.wgmma and k.stages > 1 else []
  if tc.wgmma:
    def fenced(stores: list[UOp]) -> list[UOp]:
      return [*stores, wmma("proxy")] if any(u.op is Ops.STORE and not u.arg.cp_async for u in stores) else stores
    copies = tuple((loads, fenced(stores)) for loads, stores in copies)
  if copies: out += lw.decls + lw.nesting.staged(copies, lw.nesting.nest(red, body), landed)  # as LoopNest.workgroups
  else: out += lw.nesting.nest(red, body)
  out.append(stmt(Ops.DEFINE_LOCAL, arg=LocalArg("tiles", k.sizes_of(AxisKind.LOCAL) * 256), dtype=dtypes.float32))
  row_axis, col_axis = (next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.TC and a.dim == d) for d in (tc.row, tc.col))
  w = k.caps.warp  # the warp's lanes: 32, or CDNA's 64
  tile_row, tile_col, pair = UOp.var("tile_row", 0, w // 16 - 1), UOp.var("tile_col", 0, 15), UOp.var("pair", 0, 256 // w - 1)
  lw.cell = UOp(Ops.CELL, dtypes.float32, (), ("tiles", f"warp*256+lane+{w}*pair"))
  lw.lines = []
  for j, tile in enumerate(tiles):  # one tile at a time through the warp's 256 floats of shared memory
    # element lane + 32 pair of the 16x16 tile (32 lanes): row lane / 16 + 2 pair, column lane % 16; a loop, as lowering the 8 elements
    # one by one took most of a 4x4-tile TC matmul's render (30 of 38 ms); values made in one tile's loop are not seen in the next's
    lw.lines += [wmma("store", j), wmma("sync"), stmt(Ops.RANGE, arg=LoopArg("pair", 0, 256 // w, False))]
    lw.memo.clear()
    dims = lw.dims({**tile, row_axis: tile_row + w // 16 * pair, col_axis: tile_col})
    lw.store(lw.node(k.ast, tuple(dims[:k.n_global])), lw.out_offset(dims), TRUE)
    lw.lines += [stmt(Ops.ENDRANGE), wmma("sync")]
  return LinearProgram(k, lw.width, out + lw.lines)


def _const(x: float) -> Val: return Val(Kind.SCALAR, (UOp.const(dtypes.float32, x),))
def _read(lw: _Lowerer, view: UOp, idx: tuple[UOp, ...]) -> Val:  # a view's element at idx, as float32
  val = lw.node(view, idx)
  return val if view.dtype == dtypes.float32 else lw.alu(Ops.CAST, dtypes.float32, [val], [view.dtype])
def _total(lw: _Lowerer, vals: list[Val], o: Ops = Ops.ADD) -> Val:  # a tree: neighbours first, so the adds do not wait on each other
  while len(vals) > 1:
    vals = [lw.alu(o, dtypes.float32, vals[i:i + 2]) if i + 1 < len(vals) else vals[i] for i in range(0, len(vals), 2)]
  return vals[0]
def _keep(lw: _Lowerer, cond: Val, t: Val) -> Val:  # t where cond, else -inf
  return lw.alu(Ops.WHERE, dtypes.float32, [cond, t, _const(-math.inf)], [dtypes.bool, dtypes.float32, dtypes.float32])
def _shift(lw: _Lowerer, new_m: Val, masked: bool) -> Val:
  """What the exps subtract: with a mask every score so far may be -inf, and then 0, not -inf - -inf."""
  if not masked: return new_m
  f32 = dtypes.float32
  return lw.alu(Ops.WHERE, f32, [lw.alu(Ops.CMPNE, dtypes.bool, [new_m, _const(-math.inf)], [f32, f32]), new_m, _const(0.0)], [dtypes.bool, f32, f32])


def attention(lw: _Lowerer) -> LinearProgram:
  """The pass for attention in one kernel (Kernel.attention): each thread computes its rows (the UPCAST parts) of
  softmax(q k^T scale) v by online softmax, the scores never leaving registers. Before the keys' loop it loads each row's query and
  starts its running max m (of the scores in base 2: scale / ln 2), its sum of exponentials l and its output accumulators; each
  iteration takes a block of keys (the UNROLL parts), their scores, and rescales l and the accumulators by 2^(m_old - m_new) once
  for the block; after the loop each output is its accumulator / l. All in float32, loads and the store converting 16-bit floats.
  A mask (the fourth source) is read at the row and key: a bool one puts -inf where false, another is added.
  The head dims go in vectors of the target's lanes where both divide into them: a score is a vector of products whose lanes are
  added at the end, an output accumulator a vector. The products are added in a chain, one multiply-add each (the compiler's
  contraction; a block's keys and the output's vectors are the independent work), where a tree of adds took twice the
  instructions. Causal: the scores of keys past the query's row are -inf (key 0 is in the first block, so m is finite after it),
  and a thread skips the blocks past all its rows."""
  k, node = lw.k, lw.k.attention
  assert node is not None
  q, keys, values, *masks = node.src
  scale, causal = node.arg
  n, f32, (e_size, ev_size) = k.n_global, dtypes.float32, (q.shape[-1], node.shape[-1])
  simd = k.caps.simd_width if {Ops.ADD, Ops.MUL} <= lw.target.vector_ops else 1
  lw.width = w = next((w for w in (simd, 8, 4) if w <= simd and e_size % w == 0 and ev_size % w == 0), 1)
  lw.lane = UOp.var("lane", 0, w - 1)
  def at(e: int) -> UOp: return UOp.const(dtypes.int64, e) + (lw.lane if w > 1 else 0)
  def op(o: Ops, *srcs: Val) -> Val: return lw.alu(o, f32, list(srcs))
  def fmas(start: Val | None, pairs: list[tuple[Val, Val]]) -> Val:  # start + a0 b0 + a1 b1 + ...: a multiply-add each (see body)
    for a, b in pairs: start = op(Ops.MUL, a, b) if start is None else op(Ops.ADD, start, op(Ops.MUL, a, b))
    assert start is not None
    return start
  def acc(name: str, start: float, width: int = 1) -> Val:
    lw.decls.append(u := stmt(Ops.DEFINE_ACC, UOp.const(f32, start), arg=AccArg(name, width, Ops.ADD), dtype=f32))
    return Val(Kind.SCALAR if width == 1 else Kind.VECTOR, (u,))
  rows = []  # per row: its dims, its query's values, and its accumulators m, l and one per vector of output values
  lw.lines = lw.decls
  for r, inst in enumerate(lw.instances((AxisKind.UPCAST,))):
    dims = lw.dims(inst)
    query = [_read(lw, q, (*dims[:n], at(e))) for e in range(0, e_size, w)]
    outs = [acc(f"out{r}_{d}", 0.0, w) for d in range(0, ev_size, w)]
    rows.append((dims, query, acc(f"row_max{r}", -math.inf), acc(f"row_sum{r}", 0.0), outs))
  body = lw.lines = []
  lw.memo = {}
  log2_scale = _const(scale / math.log(2))
  blocks = [lw.dims(inst)[n] for inst in lw.instances((AxisKind.UNROLL,))]  # the block's keys
  def masked(keys_at: list[tuple[UOp, ...]], dims: list[UOp], t: Val) -> Val:  # the scores of keys_at (one a lane, or one), masked
    def per_key(vals: list[Val]) -> Val: return Val(Kind.LANES, tuple(v.items[0] for v in vals)) if len(vals) > 1 else vals[0]
    if causal: t = _keep(lw, per_key([lw.index_val(lw.simplify(kidx[-1].lt(dims[n - 1] + 1))) for kidx in keys_at]), t)  # -inf past the row
    for mask in masks:  # read at the row's index and the key's
      at_key = [(*dims[:n], kidx[-1]) for kidx in keys_at]
      if mask.dtype == dtypes.bool: t = _keep(lw, per_key([lw.node(mask, i) for i in at_key]), t)
      else: t = op(Ops.ADD, t, op(Ops.MUL, per_key([_read(lw, mask, i) for i in at_key]), _const(1 / math.log(2))))
    return t
  for dims, query, m, l, outs in rows:
    keys_at = [(*dims[:n - 1], key) for key in blocks]
    def dot(kidx: tuple[UOp, ...]) -> Val: return fmas(None, [(qe, _read(lw, keys, (*kidx, at(e * w)))) for e, qe in enumerate(query)])
    if lw.target.lane_folds and w > 1:  # w keys' scores in one vector, lane j folding key j's products: one vector exp for w keys
      chunks = []
      for chunk in (keys_at[i:i + w] for i in range(0, len(keys_at), w)):
        lw.count += 1
        fold = lw.emit(Ops.FOLD, *(lw.vec(dot(kidx)) for kidx in chunk), arg=FoldArg(f"s{lw.count}", w, Ops.ADD, True), dtype=f32)
        t = op(Ops.MUL, Val(Kind.VECTOR, (fold,)), log2_scale)  # lanes past the chunk's keys repeat its first (see CRenderer.lane_fold)
        chunks.append((chunk, masked(chunk + chunk[:1] * (w - len(chunk)), dims, t)))
      most = _total(lw, [t for _, t in chunks], Ops.MAX)
      new_m = op(Ops.MAX, m, _total(lw, [Val(Kind.SCALAR, (most.lane(i),)) for i in range(w)], Ops.MAX))
      base = _shift(lw, new_m, bool(masks))
      exps = [(chunk, op(Ops.EXP2, op(Ops.ADD, t, op(Ops.NEG, base)))) for chunk, t in chunks]
      probs = [(kidx, Val(Kind.SCALAR, (p.lane(j),))) for chunk, p in exps for j, kidx in enumerate(chunk)]
    else:
      scores = []
      for kidx in keys_at:
        products = dot(kidx)
        t = op(Ops.MUL, _total(lw, [Val(Kind.SCALAR, (products.lane(i),)) for i in range(w)]) if w > 1 else products, log2_scale)
        scores.append((kidx, masked([kidx], dims, t)))
      new_m = op(Ops.MAX, m, _total(lw, [t for _, t in scores], Ops.MAX))
      base = _shift(lw, new_m, bool(masks))
      probs = [(kidx, op(Ops.EXP2, op(Ops.ADD, t, op(Ops.NEG, base)))) for kidx, t in scores]
    rescale = op(Ops.EXP2, op(Ops.ADD, m, op(Ops.NEG, base)))
    updates = [(l, op(Ops.ADD, op(Ops.MUL, l, rescale), _total(lw, [p for _, p in probs])))]
    for d, o in enumerate(outs):
      updates.append((o, fmas(op(Ops.MUL, o, rescale), [(p, _read(lw, values, (*kidx, at(d * w)))) for kidx, p in probs])))
    for target, val in [*updates, (m, new_m)]: lw.emit(Ops.ASSIGN, target.items[0], lw.vec(val), TRUE)
  if causal and blocks:  # a block of keys that starts past every row of the thread is all -inf: skipped (half the work)
    seen = [lw.simplify(blocks[0].lt(row + 1)) for row in dict.fromkeys(dims[n - 1] for dims, *_ in rows)]
    cond = functools.reduce(lambda a, b: a.alu(Ops.OR, b), seen)
    body[:] = [stmt(Ops.IF, cond.alu(Ops.CMPNE, UOp.const(dtypes.bool, False))), *body, stmt(Ops.ENDIF)]
  post = lw.lines = []
  lw.memo = {}
  strides = strides_for(k.out_shape)
  for dims, _, _, l, outs in rows:
    inv = op(Ops.RECIP, l)
    for d, o in enumerate(outs):
      val = op(Ops.MUL, o, inv)
      if node.dtype != f32: val = lw.alu(Ops.CAST, node.dtype, [val], [f32])
      off = lw.simplify(sum((x * st for x, st in zip((*dims[:n], at(d * w)), strides) if st), UOp.const(dtypes.int64, 0)))
      lw.store(val, off, TRUE)
  if lw.target.has_local: uops = lw.nesting.workgroups([body], [[]], lw.decls, [], w, post, ())
  else: uops = lw.nesting.cpu([body], [], None, [[]], lw.decls, post)
  return LinearProgram(k, w, uops)


def flash_attention(lw: _Lowerer) -> LinearProgram:
  """Attention in tiles (Kernel.flash_opt, the FlashAttention-2 shape on CUDA cores): a workgroup takes a block of query rows, copies
  them to shared memory once (scaled by scale / ln 2: the scores in base 2), then for each tile of keys (STAGE) copies the keys and
  values to shared memory, every thread a share of them in vectors, so each is read from memory once a workgroup, not once a row.
  The threads are a grid of row groups (LOCAL) by threads per row (GROUP, the fastest): a thread computes its rows' (UPCAST) scores
  for every GROUP-th key of the tile, a register tile of dot products read as vectors along the head dim; the rows' maxima of the
  tile meet in shared memory, each thread takes the new running max m of its rows, writes its probabilities 2^(s - m) to shared
  memory and their sums beside them; then each thread rescales its rows' output accumulators (every GROUP-th vector of the value
  dims) and sum l by 2^(m_old - m) and adds the tile's probabilities times values. Four barriers a tile: after the copies, the
  maxima, the probabilities, and the products (the next copy overwrites what they read). Causal: a tile of keys past the block's
  last row is skipped by the whole workgroup, a key past its row is -inf. A mask is read at the row and key as attention's."""
  k, node = lw.k, lw.k.attention
  assert node is not None
  q, keys, values, *masks = node.src
  scale, causal = node.arg
  n, f32, i64, (e_size, ev_size) = k.n_global, dtypes.float32, dtypes.int64, (q.shape[-1], node.shape[-1])
  block, tile, group = k.flash_sizes()
  vars, zero = lw.nesting.vars, UOp.const(dtypes.int64, 0)
  stage = next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.STAGE)
  svar, rvar = vars[stage], vars[next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE)]
  gvar = next((vars[i] for i, a in enumerate(k.axes) if a.kind is AxisKind.GROUP), zero)
  lw.width = w = 4 if e_size % 4 == 0 and ev_size % (4 * group) == 0 and tile % 4 == 0 else 1
  lw.lane = UOp.var("lane", 0, w - 1)
  lane = lw.lane if w > 1 else zero
  threads = k.launch_dims[1]
  lid = UOp.var("lid", 0, threads - 1) if threads > 1 else zero
  qs, ks, vs = e_size + FLASH_PAD, e_size + FLASH_PAD, ev_size + FLASH_PAD  # the tiles' row strides
  ps = tile + FLASH_PAD
  def op(o: Ops, *srcs: Val) -> Val: return lw.alu(o, f32, list(srcs))
  def shared(name: str, off: UOp) -> Val: return lw.read(f32, name, lw.simplify(off), TRUE)
  def put(name: str, val: Val, off: UOp, guard: UOp = TRUE) -> None: lw.store(val, lw.simplify(off), guard, name, f32)
  def lanes(v: Val) -> list[Val]: return [Val(Kind.SCALAR, (v.lane(i),)) for i in range(w)] if v.kind is not Kind.SCALAR else [v] * w
  # the workgroup's rows: each UPCAST instance's row in the block and in the kernel; the batch dims are the workgroup's
  row_base = linear_sum(i64, [(vars[i], a.stride) for i, a in enumerate(k.axes) if a.dim == n - 1 and a.kind is AxisKind.GLOBAL], 0, lw.simplified)
  rows = []
  for inst in lw.instances((AxisKind.UPCAST,)):
    dims = lw.dims(inst)
    rows.append((lw.simplify(dims[n - 1] - row_base), dims[n - 1]))
  batch = lw.dims({})[:n - 1]
  key_dim = lw.dims({})[n]  # s * tile + r * group + g: the thread's j-th key of the tile at r = j
  tile_keys = [lw.simplify(key_dim.substitute({v: UOp.const(i64, x) for v, x in ((svar, 0), (rvar, j)) if v.op is Ops.VAR}))
               for j in range(tile // group)]
  def copy(view: UOp, name: str, first: UOp, count: int, size: int, stride: int) -> None:
    """`count` rows of `view` from row `first` on (its last dim of `size`) to shared array `name` (rows `stride` apart), as float32."""
    chunks, per = count * (size // w), size // w
    for j in range(-(-chunks // threads)):
      c = lw.simplify(lid + j * threads)
      guard = TRUE if (j + 1) * threads <= chunks else lw.simplify(c.lt(chunks))
      if guard is not TRUE: c = lw.simplify(UOp(Ops.WHERE, i64, (c.lt(chunks), c, UOp.const(i64, chunks - 1))))
      r, e = lw.simplify(c // per), lw.simplify(c % per * w + lane)
      val = _read(lw, view, (*batch, lw.simplify(first + r), e))
      if name == "fq": val = op(Ops.MUL, val, _const(scale / math.log(2)))
      put(name, val, r * stride + e, guard)
  decls = [stmt(Ops.DEFINE_LOCAL, arg=LocalArg(name, size), dtype=f32) for name, size in k.flash_arrays(block, tile, group)]
  def acc(name: str, start: float, width: int = 1) -> Val:
    decls.append(u := stmt(Ops.DEFINE_ACC, UOp.const(f32, start), arg=AccArg(name, width, Ops.ADD), dtype=f32))
    return Val(Kind.SCALAR if width == 1 else Kind.VECTOR, (u,))
  cols = ev_size // (w * group)  # the thread's vectors of each row's output: every GROUP-th
  out_at = [lw.simplify(UOp.const(i64, c * w * group) + gvar * w + lane) for c in range(cols)]
  state = [(acc(f"row_max{a}", -math.inf), acc(f"row_sum{a}", 0.0), [acc(f"out{a}_{c}", 0.0, w) for c in range(cols)]) for a in range(len(rows))]
  pre = lw.lines = []
  lw.memo = {}
  copy(q, "fq", row_base, block, e_size, qs)
  body = lw.lines = []
  lw.memo = {}
  copy(keys, "fk", svar * tile, tile, e_size, ks)
  copy(values, "fv", svar * tile, tile, ev_size, vs)
  body.append(stmt(Ops.BARRIER))
  # the scores of the thread's rows and keys
  dots: dict[tuple[int, int], Val] = {}  # scalars, a multiply-add a lane (vectors of partial sums took 4x the registers: 198 a thread)
  for c in range(e_size // w):
    qv = [lanes(shared("fq", r * qs + c * w + lane)) for r, _ in rows]
    kv = [lanes(shared("fk", kt * ks + c * w + lane)) for kt in tile_keys]
    for (a, x), (b, y), i in itertools.product(enumerate(qv), enumerate(kv), range(w)):
      dots[a, b] = op(Ops.MUL, x[i], y[i]) if (a, b) not in dots else op(Ops.ADD, dots[a, b], op(Ops.MUL, x[i], y[i]))
  scores: dict[tuple[int, int], Val] = {}
  for (a, (_, row)), b in itertools.product(enumerate(rows), range(len(tile_keys))):
    t = dots[a, b]
    key = lw.simplify(svar * tile + tile_keys[b])
    if causal: t = _keep(lw, lw.index_val(lw.simplify(key.lt(row + 1))), t)
    for mask in masks:
      if mask.dtype == dtypes.bool: t = _keep(lw, lw.node(mask, (*batch, row, key)), t)
      else: t = op(Ops.ADD, t, op(Ops.MUL, _read(lw, mask, (*batch, row, key)), _const(1 / math.log(2))))
    scores[a, b] = t
  for a, (r, _) in enumerate(rows): put("fm", _total(lw, [scores[a, b] for b in range(len(tile_keys))], Ops.MAX), gvar * block + r)
  body.append(stmt(Ops.BARRIER))
  # the new running max, the probabilities and their sums
  alphas = []
  for a, (r, _) in enumerate(rows):
    m = state[a][0]
    new_m = op(Ops.MAX, m, _total(lw, [shared("fm", UOp.const(i64, g * block) + r) for g in range(group)], Ops.MAX))
    base = _shift(lw, new_m, bool(masks))
    alphas.append(op(Ops.EXP2, op(Ops.ADD, m, op(Ops.NEG, base))))
    probs = [op(Ops.EXP2, op(Ops.ADD, scores[a, b], op(Ops.NEG, base))) for b in range(len(tile_keys))]
    for kt, p in zip(tile_keys, probs): put("fp", p, r * ps + kt)
    put("fl", _total(lw, probs), gvar * block + r)
    lw.emit(Ops.ASSIGN, m.items[0], lw.vec(new_m), TRUE)
  body.append(stmt(Ops.BARRIER))
  # the outputs: rescaled, plus the tile's probabilities times its values
  news: dict[tuple[int, int], Val] = {}
  for a, (r, _) in enumerate(rows):
    l = state[a][1]
    lsum = _total(lw, [shared("fl", UOp.const(i64, g * block) + r) for g in range(group)])
    lw.emit(Ops.ASSIGN, l.items[0], lw.vec(op(Ops.ADD, op(Ops.MUL, l, alphas[a]), lsum)), TRUE)
    for c, o in enumerate(state[a][2]): news[a, c] = op(Ops.MUL, o, alphas[a])
  for kk in range(0, tile, w):
    pv = [lanes(shared("fp", r * ps + kk + lane)) for r, _ in rows]
    for j in range(w):
      for c in range(cols):
        vv = shared("fv", (kk + j) * vs + out_at[c])
        for a in range(len(rows)): news[a, c] = op(Ops.ADD, news[a, c], op(Ops.MUL, pv[a][j], vv))
  for (a, c), val in news.items(): lw.emit(Ops.ASSIGN, state[a][2][c].items[0], lw.vec(val), TRUE)
  body.append(stmt(Ops.BARRIER))
  if causal:  # the tiles past the block's last row: the whole workgroup skips them
    body[:] = [stmt(Ops.IF, lw.simplify((svar * tile).lt(row_base + block)).alu(Ops.CMPNE, UOp.const(dtypes.bool, False))), *body, stmt(Ops.ENDIF)]
  post = lw.lines = []
  lw.memo = {}
  strides = strides_for(k.out_shape)
  for a, (_, row) in enumerate(rows):
    inv = op(Ops.RECIP, state[a][1])
    for c, o in enumerate(state[a][2]):
      val = op(Ops.MUL, o, inv)
      if node.dtype != f32: val = lw.alu(Ops.CAST, node.dtype, [val], [f32])
      off = lw.simplify(sum((x * st for x, st in zip((*batch, row, out_at[c]), strides) if st), UOp.const(i64, 0)))
      lw.store(val, off, TRUE)
  local = sorted((i for i, a in enumerate(k.axes) if a.kind is AxisKind.LOCAL), key=lambda i: -k.axes[i].stride)
  ids = lw.nesting.group_ids() + ([stmt(Ops.SPECIAL, arg=SpecialArg("lid", "local_id", 1, 0))] if threads > 1 else [])
  ids += lw.nesting.unflatten(local + [i for i, a in enumerate(k.axes) if a.kind is AxisKind.GROUP], "lid")
  return LinearProgram(k, w, ids + decls + pre + lw.nesting.nest([stage], body) + post)


def flash_attention_tc(lw: _Lowerer) -> LinearProgram:
  """Attention in tiles on tensor cores (Kernel.flash_tc, 16-bit inputs, CUDA's mma.sync), FlashAttention-2's warp plan: a workgroup
  copies its rows of queries to shared memory as they are (16 bits), each warp loads its 16 rows' A fragments once by ldmatrix; for
  each tile of keys (STAGE) the workgroup copies the keys and values, each warp takes S = Q K^T into float32 accumulators (the keys'
  rows are B's columns: ldmatrix), the online softmax on them where they are ("softmax": a row's max and sum over its 4 lanes by
  shuffles; the output accumulators rescaled), P's accumulators packed to 16 bits as P V's A fragments ("pack": the C fragment's
  pairs are A's) and V by ldmatrix.trans. At the end each lane's sums meet their row's ("finish") and the outputs go out through the
  warp's 256 floats of shared memory as the matmul's do. Causal: a tile past the block's last row is skipped, a key past its row is
  -inf. The scale is applied to S in float32 (the queries stay as they are)."""
  k, node = lw.k, lw.k.attention
  assert node is not None
  q, keys, values = node.src
  scale, causal = node.arg
  n, f32, i64, dt, (e_size, ev_size) = k.n_global, dtypes.float32, dtypes.int64, q.dtype, (q.shape[-1], node.shape[-1])
  block, tile, _ = k.flash_sizes()
  vars, zero = lw.nesting.vars, UOp.const(dtypes.int64, 0)
  stage = next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.STAGE)
  svar, rvar = vars[stage], vars[next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE)]
  tc_axis = next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.TC)
  local = sorted((i for i, a in enumerate(k.axes) if a.kind is AxisKind.LOCAL), key=lambda i: -k.axes[i].stride)
  def wmma(*arg: object, src: tuple[UOp, ...] = ()) -> UOp: return stmt(Ops.WMMA, *src, arg=("mma", *arg))
  threads = k.launch_dims[1]
  lid = UOp.var("lid", 0, threads - 1)
  ld, lv = e_size + TC_PAD, ev_size + TC_PAD  # the tiles' row strides
  dims0 = lw.dims({tc_axis: zero})
  batch, row0 = dims0[:n - 1], dims0[n - 1]  # the warp's first row
  row_base = lw.simplify(dims0[n - 1].substitute({vars[i]: zero for i in local}))  # the workgroup's
  warp_row = lw.simplify(row0 - row_base)
  key0 = lw.simplify(lw.dims({})[n].substitute({rvar: zero}))  # the tile's first key
  def copy(view: UOp, name: str, first: UOp, count: int, size: int, stride: int) -> None:
    """`count` rows of `view` from row `first` on (its last dim of `size`) to shared array `name` (rows `stride` apart), as they are:
    16 bytes a cp.async (Kernel.flash_opt: rows contiguous and 16-byte aligned), waited for at the next barrier."""
    chunks, per = count * size // 8, size // 8
    for j in range(-(-chunks // threads)):
      c = lw.simplify(lid + j * threads)
      guard = TRUE if (j + 1) * threads <= chunks else lw.simplify(c.lt(chunks))
      if guard is not TRUE: c = lw.simplify(UOp(Ops.WHERE, i64, (c.lt(chunks), c, UOp.const(i64, chunks - 1))))
      r, e = lw.simplify(c // per), lw.simplify(c % per * 8)
      load = stmt(Ops.LOAD, lw.simplify(view.arg.index((*batch, lw.simplify(first + r), e))[0]), TRUE,
                  arg=LoadArg(None, 8, lw.bufs[view.src[0].arg]), dtype=dt)
      lw.lines.append(stmt(Ops.STORE, lw.simplify(r * stride + e), load, guard, arg=StoreArg(8, name, False, "cg"), dtype=dt))
  copied = [stmt(Ops.BARRIER, arg="commit_group"), stmt(Ops.BARRIER, arg=("wait_group", 0)), stmt(Ops.BARRIER)]
  decls = [stmt(Ops.DEFINE_LOCAL, arg=LocalArg(name, size, True), dtype=dt)
           for name, size in (("fq", block * ld), ("fk", tile * ld), ("fv", tile * lv))]
  s_accs, o_accs = list(range(tile // 16)), list(range(tile // 16, tile // 16 + ev_size // 16))
  decls += [wmma("acc", j) for j in o_accs] + [wmma("state")]
  lw.width, lw.lane = 1, UOp.var("lane", 0, 0)
  pre = lw.lines = []
  lw.memo = {}
  copy(q, "fq", row_base, block, e_size, ld)
  pre += copied
  for c in range(e_size // 16):
    pre += [wmma("fragment", f"qa{c}", "a", dt, "row_major"),
            wmma("load", f"qa{c}", "fq", ld, "a", "row_major", True, src=(lw.simplify(warp_row * ld + 16 * c),))]
  body = lw.lines = []
  lw.memo = {}
  copy(keys, "fk", svar * tile, tile, e_size, ld)
  copy(values, "fv", svar * tile, tile, ev_size, lv)
  body += copied
  body += [wmma("acc", j) for j in s_accs]
  for j, c in itertools.product(s_accs, range(e_size // 16)):
    body += [wmma("fragment", f"kb{j}_{c}", "b", dt, "col_major"),
             wmma("load", f"kb{j}_{c}", "fk", ld, "b", "col_major", True, src=(UOp.const(i64, 16 * j * ld + 16 * c),)),
             wmma("mma", j, f"qa{c}", f"kb{j}_{c}", dt)]
  body.append(wmma("softmax", tuple(s_accs), tuple(o_accs), scale / math.log(2), causal, src=(row0, key0)))
  for j in s_accs:
    body.append(wmma("pack", f"pa{j}", j, dt))
    for c, o in enumerate(o_accs):
      body += [wmma("fragment", f"vb{j}_{c}", "b", dt, "row_major"),
               wmma("load", f"vb{j}_{c}", "fv", lv, "b", "row_major", True, src=(UOp.const(i64, 16 * j * lv + 16 * c),)),
               wmma("mma", o, f"pa{j}", f"vb{j}_{c}", dt)]
  body.append(stmt(Ops.BARRIER))
  if causal:  # the tiles past the block's last row: the whole workgroup skips them
    body[:] = [stmt(Ops.IF, lw.simplify((svar * tile).lt(row_base + block)).alu(Ops.CMPNE, UOp.const(dtypes.bool, False))), *body, stmt(Ops.ENDIF)]
  post = lw.lines = [wmma("finish", tuple(o_accs)), stmt(Ops.DEFINE_LOCAL, arg=LocalArg("tiles", block // 16 * 256), dtype=f32)]
  tile_row, tile_col, pair = UOp.var("tile_row", 0, 1), UOp.var("tile_col", 0, 15), UOp.var("pair", 0, 7)
  strides = strides_for(k.out_shape)
  for c, o in enumerate(o_accs):  # one tile at a time through the warp's 256 floats of shared memory, as tensor_cores' outputs
    post += [wmma("store", o), wmma("sync"), stmt(Ops.RANGE, arg=LoopArg("pair", 0, 8, False))]
    lw.memo = {}
    val = Val(Kind.SCALAR, (UOp(Ops.CELL, f32, (), ("tiles", "warp*256+lane+32*pair")),))
    if node.dtype != f32: val = lw.alu(Ops.CAST, node.dtype, [val], [f32])
    at = (*batch, lw.simplify(row0 + tile_row + 2 * pair), lw.simplify(tile_col + 16 * c))
    lw.store(val, lw.simplify(sum((x * st for x, st in zip(at, strides) if st), UOp.const(i64, 0))), TRUE)
    post += [stmt(Ops.ENDRANGE), wmma("sync")]
  ids = lw.nesting.group_ids() + [wmma("ids")] + lw.nesting.unflatten(local, "warp")
  return LinearProgram(k, 1, ids + decls + pre + lw.nesting.nest([stage], body) + post)
