"""Attention in one kernel, by online softmax in each thread's registers."""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from tinytune.codegen.kernel import AxisKind
from tinytune.codegen.lower.program import TRUE, AccArg, FoldArg, Kind, LinearProgram, Val, stmt, when
from tinytune.dtype import dtypes
from tinytune.shape import strides_for
from tinytune.uop import Ops, UOp

if TYPE_CHECKING:
  from tinytune.codegen.lower.lowerer import Lowerer


def _const(x: float) -> Val: return Val(Kind.SCALAR, (UOp.const(dtypes.float32, x),))
def _read(lw: Lowerer, view: UOp, idx: tuple[UOp, ...]) -> Val:  # a view's element at idx, as float32
  val = lw.node(view, idx)
  return val if view.dtype == dtypes.float32 else lw.alu(Ops.CAST, dtypes.float32, [val], [view.dtype])
def _total(lw: Lowerer, vals: list[Val], o: Ops = Ops.ADD) -> Val:  # a tree: neighbours first, so the adds do not wait on each other
  while len(vals) > 1:
    vals = [lw.alu(o, dtypes.float32, vals[i:i + 2]) if i + 1 < len(vals) else vals[i] for i in range(0, len(vals), 2)]
  return vals[0]
def _keep(lw: Lowerer, cond: Val, t: Val) -> Val:  # t where cond, else -inf
  return lw.alu(Ops.WHERE, dtypes.float32, [cond, t, _const(-math.inf)], [dtypes.bool, dtypes.float32, dtypes.float32])
def _shift(lw: Lowerer, new_m: Val, masked: bool) -> Val:
  """What the exps subtract: with a mask every score so far may be -inf, and then 0, not -inf - -inf."""
  if not masked: return new_m
  f32 = dtypes.float32
  return lw.alu(Ops.WHERE, f32, [lw.alu(Ops.CMPNE, dtypes.bool, [new_m, _const(-math.inf)], [f32, f32]), new_m, _const(0.0)], [dtypes.bool, f32, f32])


def attention(lw: Lowerer) -> LinearProgram:
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
  return _OneKernel(lw).program()


Row = tuple[list[UOp], list[Val], Val, Val, list[Val]]  # a thread's row: its dims, its query's values, m, l and its output accumulators


class Inputs:
  """An attention kernel's node (Ops.ATTENTION) and its parts: the queries, keys, values and masks, the scale and whether causal."""
  def __init__(self, lw: Lowerer):
    node = lw.k.attention
    assert node is not None
    self.lw, self.k, self.node = lw, lw.k, node
    self.q, self.keys, self.values, *self.masks = node.src
    self.scale, self.causal = node.arg


class _OneKernel(Inputs):
  """Attention in one kernel (see attention): the inputs, the lanes of the head dims, and the thread's rows."""
  def __init__(self, lw: Lowerer):
    super().__init__(lw)
    k, node = self.k, self.node
    n, f32, (e_size, ev_size) = k.n_global, dtypes.float32, (self.q.shape[-1], node.shape[-1])
    simd = k.caps.simd_width if {Ops.ADD, Ops.MUL} <= lw.target.vector_ops else 1
    lw.width = self.w = w = next((w for w in (simd, 8, 4) if w <= simd and e_size % w == 0 and ev_size % w == 0), 1)
    lw.lane = UOp.var("lane", 0, w - 1)
    def acc(name: str, start: float, width: int = 1) -> Val:
      lw.decls.append(u := stmt(Ops.DEFINE_ACC, UOp.const(f32, start), arg=AccArg(name, width, Ops.ADD), dtype=f32))
      return Val(Kind.SCALAR if width == 1 else Kind.VECTOR, (u,))
    self.rows: list[Row] = []
    lw.lines = lw.decls
    for r, inst in enumerate(lw.instances((AxisKind.UPCAST,))):
      dims = lw.dims(inst)
      query = [_read(lw, self.q, (*dims[:n], self.at(e))) for e in range(0, e_size, w)]
      outs = [acc(f"out{r}_{d}", 0.0, w) for d in range(0, ev_size, w)]
      self.rows.append((dims, query, acc(f"row_max{r}", -math.inf), acc(f"row_sum{r}", 0.0), outs))

  def at(self, e: int) -> UOp: return UOp.const(dtypes.int64, e) + (self.lw.lane if self.w > 1 else 0)
  def op(self, o: Ops, *srcs: Val) -> Val: return self.lw.alu(o, dtypes.float32, list(srcs))

  def fmas(self, start: Val | None, pairs: list[tuple[Val, Val]]) -> Val:
    """start + a0 b0 + a1 b1 + ...: a multiply-add each (see attention)."""
    for a, b in pairs: start = self.op(Ops.MUL, a, b) if start is None else self.op(Ops.ADD, start, self.op(Ops.MUL, a, b))
    assert start is not None
    return start

  def masked(self, keys_at: list[tuple[UOp, ...]], dims: list[UOp], t: Val) -> Val:
    """The scores `t` of keys_at (one a lane, or one) masked: -inf past the row (causal), and each mask read at the row and key."""
    lw, n = self.lw, self.k.n_global
    def per_key(vals: list[Val]) -> Val: return Val(Kind.LANES, tuple(v.items[0] for v in vals)) if len(vals) > 1 else vals[0]
    if self.causal: t = _keep(lw, per_key([lw.index_val(lw.simplify(kidx[-1].lt(dims[n - 1] + 1))) for kidx in keys_at]), t)
    for mask in self.masks:
      at_key = [(*dims[:n], kidx[-1]) for kidx in keys_at]
      if mask.dtype == dtypes.bool: t = _keep(lw, per_key([lw.node(mask, i) for i in at_key]), t)
      else: t = self.op(Ops.ADD, t, self.op(Ops.MUL, per_key([_read(lw, mask, i) for i in at_key]), _const(1 / math.log(2))))
    return t

  def dot(self, query: list[Val], kidx: tuple[UOp, ...]) -> Val:
    return self.fmas(None, [(qe, _read(self.lw, self.keys, (*kidx, self.at(e * self.w)))) for e, qe in enumerate(query)])

  def probabilities(self, row: Row, keys_at: list[tuple[UOp, ...]]) -> tuple[Val, Val, list[tuple[tuple[UOp, ...], Val]]]:
    """A row's new running max, what its exps subtract, and the probabilities of the block's keys."""
    lw, op, w, (dims, query, m, _, _) = self.lw, self.op, self.w, row
    log2_scale = _const(self.scale / math.log(2))
    if lw.target.lane_folds and w > 1:  # w keys' scores in one vector, lane j folding key j's products: one vector exp for w keys
      chunks = []
      for chunk in (keys_at[i:i + w] for i in range(0, len(keys_at), w)):
        lw.count += 1
        fold = lw.emit(Ops.FOLD, *(lw.vec(self.dot(query, kidx)) for kidx in chunk), arg=FoldArg(f"s{lw.count}", w, Ops.ADD, True),
                       dtype=dtypes.float32)
        t = op(Ops.MUL, Val(Kind.VECTOR, (fold,)), log2_scale)  # lanes past the chunk's keys repeat its first (see CRenderer.lane_fold)
        chunks.append((chunk, self.masked(chunk + chunk[:1] * (w - len(chunk)), dims, t)))
      most = _total(lw, [t for _, t in chunks], Ops.MAX)
      new_m = op(Ops.MAX, m, _total(lw, [Val(Kind.SCALAR, (most.lane(i),)) for i in range(w)], Ops.MAX))
      base = _shift(lw, new_m, bool(self.masks))
      exps = [(chunk, op(Ops.EXP2, op(Ops.ADD, t, op(Ops.NEG, base)))) for chunk, t in chunks]
      return new_m, base, [(kidx, Val(Kind.SCALAR, (p.lane(j),))) for chunk, p in exps for j, kidx in enumerate(chunk)]
    scores = []
    for kidx in keys_at:
      products = self.dot(query, kidx)
      t = op(Ops.MUL, _total(lw, [Val(Kind.SCALAR, (products.lane(i),)) for i in range(w)]) if w > 1 else products, log2_scale)
      scores.append((kidx, self.masked([kidx], dims, t)))
    new_m = op(Ops.MAX, m, _total(lw, [t for _, t in scores], Ops.MAX))
    base = _shift(lw, new_m, bool(self.masks))
    return new_m, base, [(kidx, op(Ops.EXP2, op(Ops.ADD, t, op(Ops.NEG, base)))) for kidx, t in scores]

  def block(self, blocks: list[UOp]) -> None:
    """A block of keys: each row's scores, its sum and outputs rescaled by 2^(m_old - m_new) plus the block's, its new max."""
    lw, op, n = self.lw, self.op, self.k.n_global
    for row in self.rows:
      dims, _, m, l, outs = row
      keys_at = [(*dims[:n - 1], key) for key in blocks]
      new_m, base, probs = self.probabilities(row, keys_at)
      rescale = op(Ops.EXP2, op(Ops.ADD, m, op(Ops.NEG, base)))
      updates = [(l, op(Ops.ADD, op(Ops.MUL, l, rescale), _total(lw, [p for _, p in probs])))]
      for d, o in enumerate(outs):
        updates.append((o, self.fmas(op(Ops.MUL, o, rescale), [(p, _read(lw, self.values, (*kidx, self.at(d * self.w)))) for kidx, p in probs])))
      for target, val in [*updates, (m, new_m)]: lw.emit(Ops.ASSIGN, target.items[0], lw.vec(val), TRUE)

  def stores(self) -> None:
    """Each output: its accumulator / its row's sum."""
    lw, f32, n, strides = self.lw, dtypes.float32, self.k.n_global, strides_for(self.k.out_shape)
    for dims, _, _, l, outs in self.rows:
      inv = self.op(Ops.RECIP, l)
      for d, o in enumerate(outs):
        val = self.op(Ops.MUL, o, inv)
        if self.node.dtype != f32: val = lw.alu(Ops.CAST, self.node.dtype, [val], [f32])
        off = lw.simplify(sum((x * st for x, st in zip((*dims[:n], self.at(d * self.w)), strides) if st), UOp.const(dtypes.int64, 0)))
        lw.store(val, off, TRUE)

  def program(self) -> LinearProgram:
    lw, n = self.lw, self.k.n_global
    body = lw.lines = []
    lw.memo = {}
    blocks = [lw.dims(inst)[n] for inst in lw.instances((AxisKind.UNROLL,))]  # the block's keys
    self.block(blocks)
    if self.causal and blocks:  # a block of keys that starts past every row of the thread is all -inf: skipped (half the work)
      seen = [lw.simplify(blocks[0].lt(row + 1)) for row in dict.fromkeys(dims[n - 1] for dims, *_ in self.rows)]
      body = when(functools.reduce(lambda a, b: a.alu(Ops.OR, b), seen), body)
    post = lw.lines = []
    lw.memo = {}
    self.stores()
    if lw.target.has_local: uops = lw.nesting.workgroups([body], [[]], lw.decls, [], self.w, post, ())
    else: uops = lw.nesting.cpu([body], [], None, [[]], lw.decls, post)
    return LinearProgram(self.k, self.w, uops)
