"""Attention in tiles through shared memory (FlashAttention-2's shape), on CUDA cores and on tensor cores."""
from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Iterator

from tinytune.codegen.kernel import FLASH_PAD, TC_PAD, AxisKind
from tinytune.codegen.lower.attention import Inputs, _const, _keep, _read, _shift, _total
from tinytune.codegen.lower.program import TRUE, AccArg, Kind, LinearProgram, LoadArg, LocalArg, LoopArg, SpecialArg, StoreArg, Val, stmt, when
from tinytune.dtype import dtypes
from tinytune.shape import strides_for
from tinytune.uop import Ops, UOp, linear_sum

if TYPE_CHECKING:
  from tinytune.codegen.lower.lowerer import Lowerer


class _Tiles(Inputs):
  """What both forms of attention in tiles share (Kernel.flash_opt): the attention's inputs, its block of query rows, its tile of
  keys and threads a row (Kernel.flash_sizes), the tiles' loop (STAGE) and the reduce's variable in it, the workgroup's threads and
  its LOCAL axes (the slowest first)."""
  def __init__(self, lw: Lowerer):
    super().__init__(lw)
    k = self.k
    self.e_size, self.ev_size = self.q.shape[-1], self.node.shape[-1]
    self.block, self.tile, self.group = k.flash_sizes()
    self.stage = next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.STAGE)
    self.svar, self.rvar = lw.nesting.vars[self.stage], lw.nesting.vars[next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE)]
    self.threads = k.launch_dims[1]
    self.local = sorted((i for i, a in enumerate(k.axes) if a.kind is AxisKind.LOCAL), key=lambda i: -k.axes[i].stride)

  def chunks(self, lid: UOp, count: int, size: int, width: int, lane: UOp) -> Iterator[tuple[UOp, UOp, UOp]]:
    """The workgroup's copy of `count` rows of `size` elements in chunks of `width`, dealt out to its threads in turn: each of the
    thread's chunks as its row, its first element plus `lane` and its guard (a thread past the last chunk is guarded off, its
    indices clamped to the last)."""
    lw, threads, i64 = self.lw, self.threads, dtypes.int64
    chunks, per = count * (size // width), size // width
    for j in range(-(-chunks // threads)):
      c = lw.simplify(lid + j * threads)
      guard = TRUE if (j + 1) * threads <= chunks else lw.simplify(c.lt(chunks))
      if guard is not TRUE: c = lw.simplify(UOp(Ops.WHERE, i64, (c.lt(chunks), c, UOp.const(i64, chunks - 1))))
      yield lw.simplify(c // per), lw.simplify(c % per * width + lane), guard

  def program(self, width: int, ids: list[UOp], decls: list[UOp], pre: list[UOp], body: list[UOp], post: list[UOp], row_base: UOp) -> LinearProgram:
    """The kernel: the tiles' loop around `body`; causal, a tile whose first key is past the block's last row skipped by the whole
    workgroup (`row_base`: the block's first row)."""
    if self.causal: body = when(self.lw.simplify((self.svar * self.tile).lt(row_base + self.block)), body)
    return LinearProgram(self.k, width, ids + decls + pre + self.lw.nesting.nest([self.stage], body) + post)


class _CudaCores(_Tiles):
  """Attention in tiles on CUDA cores (see flash_attention): the thread's rows and its keys of a tile, its vectors of each row's
  output, and a tile's steps."""
  def __init__(self, lw: Lowerer):
    super().__init__(lw)
    k, n, i64, vars, zero = lw.k, lw.k.n_global, dtypes.int64, lw.nesting.vars, UOp.const(dtypes.int64, 0)
    e_size, ev_size, tile, group = self.e_size, self.ev_size, self.tile, self.group
    self.gvar = next((vars[i] for i, a in enumerate(k.axes) if a.kind is AxisKind.GROUP), zero)
    lw.width = self.w = w = 4 if e_size % 4 == 0 and ev_size % (4 * group) == 0 and tile % 4 == 0 else 1
    lw.lane = UOp.var("lane", 0, w - 1)
    self.lane = lw.lane if w > 1 else zero
    self.lid = UOp.var("lid", 0, self.threads - 1) if self.threads > 1 else zero
    self.qs, self.ks, self.vs = e_size + FLASH_PAD, e_size + FLASH_PAD, ev_size + FLASH_PAD  # the tiles' row strides
    self.ps = tile + FLASH_PAD
    # the workgroup's rows: each UPCAST instance's row in the block and in the kernel; the batch dims are the workgroup's
    self.row_base = linear_sum(i64, [(vars[i], a.stride) for i, a in enumerate(k.axes) if a.dim == n - 1 and a.kind is AxisKind.GLOBAL], 0,
                               lw.simplified)
    self.rows = []
    for inst in lw.instances((AxisKind.UPCAST,)):
      dims = lw.dims(inst)
      self.rows.append((lw.simplify(dims[n - 1] - self.row_base), dims[n - 1]))
    self.batch = lw.dims({})[:n - 1]
    key_dim = lw.dims({})[n]  # s * tile + r * group + g: the thread's j-th key of the tile at r = j
    self.tile_keys = [lw.simplify(key_dim.substitute({v: UOp.const(i64, x) for v, x in ((self.svar, 0), (self.rvar, j)) if v.op is Ops.VAR}))
                      for j in range(tile // group)]
    self.cols = ev_size // (w * group)  # the thread's vectors of each row's output: every GROUP-th
    self.out_at = [lw.simplify(UOp.const(i64, c * w * group) + self.gvar * w + self.lane) for c in range(self.cols)]

  def op(self, o: Ops, *srcs: Val) -> Val: return self.lw.alu(o, dtypes.float32, list(srcs))
  def shared(self, name: str, off: UOp) -> Val: return self.lw.read(dtypes.float32, name, self.lw.simplify(off), TRUE)
  def put(self, name: str, val: Val, off: UOp, guard: UOp = TRUE) -> None: self.lw.store(val, self.lw.simplify(off), guard, name, dtypes.float32)
  def lanes(self, v: Val) -> list[Val]:
    return [Val(Kind.SCALAR, (v.lane(i),)) for i in range(self.w)] if v.kind is not Kind.SCALAR else [v] * self.w

  def copy(self, view: UOp, name: str, first: UOp, count: int, size: int, stride: int) -> None:
    """`count` rows of `view` from row `first` on (its last dim of `size`) to shared array `name` (rows `stride` apart), as float32."""
    for r, e, guard in self.chunks(self.lid, count, size, self.w, self.lane):
      val = _read(self.lw, view, (*self.batch, self.lw.simplify(first + r), e))
      if name == "fq": val = self.op(Ops.MUL, val, _const(self.scale / math.log(2)))
      self.put(name, val, r * stride + e, guard)

  def scores(self) -> dict[tuple[int, int], Val]:
    """The scores of the thread's rows and keys, masked."""
    lw, op, w, lane, rows, tile_keys = self.lw, self.op, self.w, self.lane, self.rows, self.tile_keys
    dots: dict[tuple[int, int], Val] = {}  # scalars, a multiply-add a lane (vectors of partial sums took 4x the registers: 198 a thread)
    for c in range(self.e_size // w):
      qv = [self.lanes(self.shared("fq", r * self.qs + c * w + lane)) for r, _ in rows]
      kv = [self.lanes(self.shared("fk", kt * self.ks + c * w + lane)) for kt in tile_keys]
      for (a, x), (b, y), i in itertools.product(enumerate(qv), enumerate(kv), range(w)):
        dots[a, b] = op(Ops.MUL, x[i], y[i]) if (a, b) not in dots else op(Ops.ADD, dots[a, b], op(Ops.MUL, x[i], y[i]))
    scores: dict[tuple[int, int], Val] = {}
    for (a, (_, row)), b in itertools.product(enumerate(rows), range(len(tile_keys))):
      t = dots[a, b]
      key = lw.simplify(self.svar * self.tile + tile_keys[b])
      if self.causal: t = _keep(lw, lw.index_val(lw.simplify(key.lt(row + 1))), t)
      for mask in self.masks:
        if mask.dtype == dtypes.bool: t = _keep(lw, lw.node(mask, (*self.batch, row, key)), t)
        else: t = op(Ops.ADD, t, op(Ops.MUL, _read(lw, mask, (*self.batch, row, key)), _const(1 / math.log(2))))
      scores[a, b] = t
    return scores

  def softmax(self, scores: dict[tuple[int, int], Val], state: list[tuple[Val, Val, list[Val]]]) -> list[Val]:
    """The rows' maxima of the tile through shared memory, then each row's new running max, its probabilities (to shared memory) and
    their sums (beside them); each row's rescale of what it had."""
    lw, op, i64, block, rows, keys = self.lw, self.op, dtypes.int64, self.block, self.rows, range(len(self.tile_keys))
    for a, (r, _) in enumerate(rows): self.put("fm", _total(lw, [scores[a, b] for b in keys], Ops.MAX), self.gvar * block + r)
    lw.lines.append(stmt(Ops.BARRIER))
    alphas = []
    for a, (r, _) in enumerate(rows):
      m = state[a][0]
      new_m = op(Ops.MAX, m, _total(lw, [self.shared("fm", UOp.const(i64, g * block) + r) for g in range(self.group)], Ops.MAX))
      base = _shift(lw, new_m, bool(self.masks))
      alphas.append(op(Ops.EXP2, op(Ops.ADD, m, op(Ops.NEG, base))))
      probs = [op(Ops.EXP2, op(Ops.ADD, scores[a, b], op(Ops.NEG, base))) for b in keys]
      for kt, p in zip(self.tile_keys, probs): self.put("fp", p, r * self.ps + kt)
      self.put("fl", _total(lw, probs), self.gvar * block + r)
      lw.emit(Ops.ASSIGN, m.items[0], lw.vec(new_m), TRUE)
    return alphas

  def outputs(self, alphas: list[Val], state: list[tuple[Val, Val, list[Val]]]) -> None:
    """The sums and outputs: rescaled, plus the tile's probabilities (times its values)."""
    lw, op, i64, w, rows = self.lw, self.op, dtypes.int64, self.w, self.rows
    news: dict[tuple[int, int], Val] = {}
    for a, (r, _) in enumerate(rows):
      l = state[a][1]
      lsum = _total(lw, [self.shared("fl", UOp.const(i64, g * self.block) + r) for g in range(self.group)])
      lw.emit(Ops.ASSIGN, l.items[0], lw.vec(op(Ops.ADD, op(Ops.MUL, l, alphas[a]), lsum)), TRUE)
      for c, o in enumerate(state[a][2]): news[a, c] = op(Ops.MUL, o, alphas[a])
    for kk in range(0, self.tile, w):
      pv = [self.lanes(self.shared("fp", r * self.ps + kk + self.lane)) for r, _ in rows]
      for j in range(w):
        for c in range(self.cols):
          vv = self.shared("fv", (kk + j) * self.vs + self.out_at[c])
          for a in range(len(rows)): news[a, c] = op(Ops.ADD, news[a, c], op(Ops.MUL, pv[a][j], vv))
    for (a, c), val in news.items(): lw.emit(Ops.ASSIGN, state[a][2][c].items[0], lw.vec(val), TRUE)

  def stores(self, state: list[tuple[Val, Val, list[Val]]]) -> None:
    """Each output: its accumulator / its row's sum."""
    lw, f32, strides = self.lw, dtypes.float32, strides_for(self.k.out_shape)
    for a, (_, row) in enumerate(self.rows):
      inv = self.op(Ops.RECIP, state[a][1])
      for c, o in enumerate(state[a][2]):
        val = self.op(Ops.MUL, o, inv)
        if self.node.dtype != f32: val = lw.alu(Ops.CAST, self.node.dtype, [val], [f32])
        off = lw.simplify(sum((x * st for x, st in zip((*self.batch, row, self.out_at[c]), strides) if st), UOp.const(dtypes.int64, 0)))
        lw.store(val, off, TRUE)


def flash_attention(lw: Lowerer) -> LinearProgram:
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
  t, f32 = _CudaCores(lw), dtypes.float32
  decls = [stmt(Ops.DEFINE_LOCAL, arg=LocalArg(name, size), dtype=f32) for name, size in lw.k.flash_arrays(t.block, t.tile, t.group)]
  def acc(name: str, start: float, width: int = 1) -> Val:
    decls.append(u := stmt(Ops.DEFINE_ACC, UOp.const(f32, start), arg=AccArg(name, width, Ops.ADD), dtype=f32))
    return Val(Kind.SCALAR if width == 1 else Kind.VECTOR, (u,))
  # each row's running max m, sum l and output accumulators
  state = [(acc(f"row_max{a}", -math.inf), acc(f"row_sum{a}", 0.0), [acc(f"out{a}_{c}", 0.0, t.w) for c in range(t.cols)])
           for a in range(len(t.rows))]
  pre = lw.lines = []
  lw.memo = {}
  t.copy(t.q, "fq", t.row_base, t.block, t.e_size, t.qs)
  body = lw.lines = []
  lw.memo = {}
  t.copy(t.keys, "fk", t.svar * t.tile, t.tile, t.e_size, t.ks)
  t.copy(t.values, "fv", t.svar * t.tile, t.tile, t.ev_size, t.vs)
  body.append(stmt(Ops.BARRIER))
  alphas = t.softmax(t.scores(), state)
  body.append(stmt(Ops.BARRIER))
  t.outputs(alphas, state)
  body.append(stmt(Ops.BARRIER))
  post = lw.lines = []
  lw.memo = {}
  t.stores(state)
  ids = lw.nesting.group_ids() + ([stmt(Ops.SPECIAL, arg=SpecialArg("lid", "local_id", 1, 0))] if t.threads > 1 else [])
  ids += lw.nesting.unflatten(t.local + [i for i, a in enumerate(lw.k.axes) if a.kind is AxisKind.GROUP], "lid")
  return t.program(t.w, ids, decls, pre, body, post, t.row_base)


def flash_attention_tc(lw: Lowerer) -> LinearProgram:
  """Attention in tiles on tensor cores (Kernel.flash_tc, 16-bit inputs, CUDA's mma.sync), FlashAttention-2's warp plan: a workgroup
  copies its rows of queries to shared memory as they are (16 bits), each warp loads its 16 rows' A fragments once by ldmatrix; for
  each tile of keys (STAGE) the workgroup copies the keys and values, each warp takes S = Q K^T into float32 accumulators (the keys'
  rows are B's columns: ldmatrix), the online softmax on them where they are ("softmax": a row's max and sum over its 4 lanes by
  shuffles; the output accumulators rescaled), P's accumulators packed to 16 bits as P V's A fragments ("pack": the C fragment's
  pairs are A's) and V by ldmatrix.trans. At the end each lane's sums meet their row's ("finish") and the outputs go out through the
  warp's 256 floats of shared memory as the matmul's do. Causal: a tile past the block's last row is skipped, a key past its row is
  -inf. The scale is applied to S in float32 (the queries stay as they are)."""
  t = _TensorCores(lw)
  decls = [stmt(Ops.DEFINE_LOCAL, arg=LocalArg(name, size, True), dtype=t.dt)
           for name, size in (("fq", t.block * t.ld), ("fk", t.tile * t.ld), ("fv", t.tile * t.lv))]
  decls += [t.wmma("acc", j) for j in t.o_accs] + [t.wmma("state")]
  lw.width, lw.lane = 1, UOp.var("lane", 0, 0)
  pre, body, post = t.queries(), t.tile_steps(), t.outputs()
  ids = lw.nesting.group_ids() + [t.wmma("ids")] + lw.nesting.unflatten(t.local, "warp")
  return t.program(1, ids, decls, pre, body, post, t.row_base)


class _TensorCores(_Tiles):
  """Attention in tiles on tensor cores (see flash_attention_tc): the warp's rows, the tiles' row strides, the accumulators of S
  (a tile of keys: 16 a fragment) and of the outputs (16 value dims a fragment)."""
  def __init__(self, lw: Lowerer):
    super().__init__(lw)
    k, n, zero = lw.k, lw.k.n_global, UOp.const(dtypes.int64, 0)
    self.dt = self.q.dtype
    self.lid = UOp.var("lid", 0, self.threads - 1)
    self.ld, self.lv = self.e_size + TC_PAD, self.ev_size + TC_PAD  # the tiles' row strides
    dims0 = lw.dims({next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.TC): zero})
    self.batch, self.row0 = dims0[:n - 1], dims0[n - 1]  # the warp's first row
    self.row_base = lw.simplify(dims0[n - 1].substitute({lw.nesting.vars[i]: zero for i in self.local}))  # the workgroup's
    self.key0 = lw.simplify(lw.dims({})[n].substitute({self.rvar: zero}))  # the tile's first key
    self.s_accs, self.o_accs = list(range(self.tile // 16)), list(range(self.tile // 16, self.tile // 16 + self.ev_size // 16))

  def wmma(self, *arg: object, src: tuple[UOp, ...] = ()) -> UOp: return stmt(Ops.WMMA, *src, arg=("mma", *arg))
  def copied(self) -> list[UOp]: return [stmt(Ops.BARRIER, arg="commit_group"), stmt(Ops.BARRIER, arg=("wait_group", 0)), stmt(Ops.BARRIER)]

  def copy(self, view: UOp, name: str, first: UOp, count: int, size: int, stride: int) -> None:
    """`count` rows of `view` from row `first` on (its last dim of `size`) to shared array `name` (rows `stride` apart), as they are:
    16 bytes a cp.async (Kernel.flash_opt: rows contiguous and 16-byte aligned), waited for at the next barrier."""
    lw, dt = self.lw, self.dt
    for r, e, guard in self.chunks(self.lid, count, size, 8, UOp.const(dtypes.int64, 0)):
      load = stmt(Ops.LOAD, lw.simplify(view.arg.index((*self.batch, lw.simplify(first + r), e))[0]), TRUE,
                  arg=LoadArg(None, 8, lw.bufs[view.src[0].arg]), dtype=dt)
      lw.lines.append(stmt(Ops.STORE, lw.simplify(r * stride + e), load, guard, arg=StoreArg(8, name, False, "cg"), dtype=dt))

  def queries(self) -> list[UOp]:
    """Before the tiles: the workgroup's queries to shared memory, the warp's A fragments of them."""
    lw, wmma, dt, ld = self.lw, self.wmma, self.dt, self.ld
    pre = lw.lines = []
    lw.memo = {}
    self.copy(self.q, "fq", self.row_base, self.block, self.e_size, ld)
    pre += self.copied()
    warp_row = lw.simplify(self.row0 - self.row_base)
    for c in range(self.e_size // 16):
      pre += [wmma("fragment", f"qa{c}", "a", dt, "row_major"),
              wmma("load", f"qa{c}", "fq", ld, "a", "row_major", True, src=(lw.simplify(warp_row * ld + 16 * c),))]
    return pre

  def tile_steps(self) -> list[UOp]:
    """A tile of keys: its keys and values to shared memory, S = Q K^T, the online softmax on S's accumulators, O += P V."""
    lw, wmma, dt, i64, tile, ld, lv = self.lw, self.wmma, self.dt, dtypes.int64, self.tile, self.ld, self.lv
    body = lw.lines = []
    lw.memo = {}
    self.copy(self.keys, "fk", self.svar * tile, tile, self.e_size, ld)
    self.copy(self.values, "fv", self.svar * tile, tile, self.ev_size, lv)
    body += self.copied()
    body += [wmma("acc", j) for j in self.s_accs]
    for j, c in itertools.product(self.s_accs, range(self.e_size // 16)):
      body += [wmma("fragment", f"kb{j}_{c}", "b", dt, "col_major"),
               wmma("load", f"kb{j}_{c}", "fk", ld, "b", "col_major", True, src=(UOp.const(i64, 16 * j * ld + 16 * c),)),
               wmma("mma", j, f"qa{c}", f"kb{j}_{c}", dt)]
    body.append(wmma("softmax", tuple(self.s_accs), tuple(self.o_accs), self.scale / math.log(2), self.causal, src=(self.row0, self.key0)))
    for j in self.s_accs:
      body.append(wmma("pack", f"pa{j}", j, dt))
      for c, o in enumerate(self.o_accs):
        body += [wmma("fragment", f"vb{j}_{c}", "b", dt, "row_major"),
                 wmma("load", f"vb{j}_{c}", "fv", lv, "b", "row_major", True, src=(UOp.const(i64, 16 * j * lv + 16 * c),)),
                 wmma("mma", o, f"pa{j}", f"vb{j}_{c}", dt)]
    body.append(stmt(Ops.BARRIER))
    return body

  def outputs(self) -> list[UOp]:
    """After the tiles: the rows' sums, then the outputs a tile at a time through the warp's 256 floats of shared memory, as
    tensor_cores' outputs."""
    lw, wmma, f32, i64 = self.lw, self.wmma, dtypes.float32, dtypes.int64
    post = lw.lines = [wmma("finish", tuple(self.o_accs)), stmt(Ops.DEFINE_LOCAL, arg=LocalArg("tiles", self.block // 16 * 256), dtype=f32)]
    tile_row, tile_col, pair = UOp.var("tile_row", 0, 1), UOp.var("tile_col", 0, 15), UOp.var("pair", 0, 7)
    strides = strides_for(self.k.out_shape)
    for c, o in enumerate(self.o_accs):
      post += [wmma("store", o), wmma("sync"), stmt(Ops.RANGE, arg=LoopArg("pair", 0, 8, False))]
      lw.memo = {}
      val = Val(Kind.SCALAR, (UOp(Ops.CELL, f32, (), ("tiles", "warp*256+lane+32*pair")),))
      if self.node.dtype != f32: val = lw.alu(Ops.CAST, self.node.dtype, [val], [f32])
      at = (*self.batch, lw.simplify(self.row0 + tile_row + 2 * pair), lw.simplify(tile_col + 16 * c))
      lw.store(val, lw.simplify(sum((x * st for x, st in zip(at, strides) if st), UOp.const(i64, 0))), TRUE)
      post += [stmt(Ops.ENDRANGE), wmma("sync")]
    return post
