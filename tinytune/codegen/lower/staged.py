"""STAGE: tiles of a workgroup's inputs in shared memory, the copies that fill them (with PREFETCH, or PIPELINE's cp.async ring) and
the reduce body's reads of them."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

from tinytune.codegen.kernel import AxisKind, swizzle_line
from tinytune.codegen.lower.loops import Copies
from tinytune.codegen.lower.program import TRUE, Kind, LoadArg, LocalArg, StoreArg, Val, stmt
from tinytune.dtype import dtypes
from tinytune.helpers import prod
from tinytune.shape import strides_for
from tinytune.uop import Ops, UOp, linear_sum

if TYPE_CHECKING:
  from tinytune.codegen.lower.lowerer import Lowerer

CHUNK_LANE = UOp.var("chunk_lane", 0, 15)  # PIPELINE: an element's place in its chunk of a copy (StagedTiles.async_copy)


class StagedTile(NamedTuple):  # a staged input's tile in shared memory
  name: str
  dims: list[tuple[int, int]]  # (dim, extent), outermost first (Kernel.stage_tiles)
  strides: list[int]
  size: int  # elements of one K tile: PIPELINE's ring holds Kernel.stages of them
  line: int  # elements of a swizzled line (kernel.swizzle_line; 0: not swizzled): 16-byte chunk c of line i is at c ^ (i % 8)


class StagedTiles:
  """STAGE's tiles: each staged input's K tile in shared memory (mma.sync's swizzled, see Kernel.stage_tiles), none without STAGE.
  The reduce body reads a staged input from its tile (read); copies() makes the statements that fill the tiles, which
  LoopNest.staged places around the K tiles' loop."""
  def __init__(self, lw: Lowerer):
    self.lw, self.k = lw, lw.k
    self.tiles: dict[UOp, StagedTile] = {}
    k = lw.k
    if lw.target.has_local and any(a.kind is AxisKind.STAGE for a in k.axes):
      for j, (view, dims, pad) in enumerate(k.stage_tiles()):
        strides = list(strides_for((*(n for _, n in dims[:-1]), dims[-1][1] + pad)))
        line = swizzle_line(dims[-1][1] * view.dtype.itemsize) // view.dtype.itemsize if k.tc is not None and k.tc.mma and not pad else 0
        self.tiles[view] = StagedTile(f"tile{j}", dims, strides, dims[0][1] * strides[0], line)

  @functools.cached_property
  def workgroup_parts(self) -> list[UOp]:
    """Each dim's index where it is the same for every thread of the workgroup in one K tile: its workgroup and tile loops' parts."""
    lw = self.lw
    k, vars, kinds = self.k, lw.nesting.vars, (AxisKind.GLOBAL, AxisKind.STAGE)
    return [linear_sum(dtypes.int64, [(vars[i], a.stride) for i, a in enumerate(k.axes) if a.dim == d and a.kind in kinds], 0, lw.simplified)
            for d in range(len(k.sizes))]

  @functools.cached_property
  def axis(self) -> int: return next(i for i, a in enumerate(self.k.axes) if a.kind is AxisKind.STAGE)

  def offset(self, view: UOp, at: dict[int, UOp], tile: UOp | None = None) -> UOp:
    """Where the element at tile coordinates `at` (dim -> index in the tile) of K tile `tile` (the loop's where None) is in the view's
    shared array, before the swizzle: with PIPELINE, in the ring's buffer tile % stages."""
    lw = self.lw
    t, stages = self.tiles[view], self.k.stages
    slot = [] if stages == 1 else [((lw.nesting.vars[self.axis] if tile is None else tile) % stages, t.size)]
    if (tc := self.k.tc) is None or not tc.wgmma:
      return linear_sum(dtypes.int64, [(at[d], st) for (d, _), st in zip(t.dims, t.strides)] + slot, 0, lw.simplified)
    # wgmma's unswizzled K-major layout: core matrices of 8 rows (A's M or B's N, the tile's last dim) by 8 of K (its first), 128
    # contiguous bytes each, K's next (the leading offset, 128 bytes), then the next 8 rows (the stride offset: 16 bytes a K of the
    # tile); a batch dim between them outside the whole K x rows block
    (kd, kt), rd = t.dims[0], t.dims[-1][0]
    r, kk = at[rd], at[kd]
    core = r // 8 * (kt * 8) + kk // 8 * 64 + r % 8 * 8 + kk % 8
    batch = [(at[d], st * kt) for (d, _), st in zip(t.dims[1:-1], t.strides[1:-1])]
    return lw.simplify(linear_sum(dtypes.int64, batch + slot, 0, lw.simplified) + core)

  def swizzle(self, view: UOp, off: UOp) -> UOp:
    """A tile's element offset where it is stored: the 16-byte chunk XORed with its line's index (see StagedTile.line)."""
    t = self.tiles[view]
    if not t.line: return off
    return self.lw.simplify(off.alu(Ops.XOR, off // t.line % 8 * (16 // view.dtype.itemsize)))

  def read(self, view: UOp) -> Val:
    """A staged input's value at the dims add() reads, from its tile (by the dims unclamped: the copy clamped them). A float32 read along the
    tile's rows but not the lanes (A's rows of a register tile, A transposed in shared memory) takes the aligned 16-byte vector
    around it, once per reduce body, where the thread's register part along the row is whole vectors."""
    lw = self.lw
    name, dims = self.tiles[view][:2]
    wg = {v: UOp.const(dtypes.int64, 0) for part in self.workgroup_parts for v in part.vars}
    off = self.swizzle(view, self.offset(view, {d: lw.simplify(lw.at_dims[d].substitute(wg)) for d, _ in dims}))
    row, w = dims[-1][0], lw.width
    if w == 4 and view.dtype == dtypes.float32 and not lw.lane_dep(off) and \
       any(a.kind is AxisKind.UPCAST and a.dim == row and a.stride == 1 and a.size % w == 0 for a in self.k.axes):
      if (r := lw.simplify(off % w)).op is Ops.CONST:
        base = lw.simplify(off - r)
        if (key := (name, base)) not in lw.memo: lw.memo[key] = lw.read(view.dtype, name, base + lw.lane, TRUE)
        return Val(Kind.SCALAR, (lw.memo[key].lane(int(r.arg)),))
    if (key := (name, off)) not in lw.memo: lw.memo[key] = lw.read(view.dtype, name, off, TRUE)
    return lw.memo[key]

  def copies(self) -> Copies:
    """STAGE's copies (see LoopNest.staged): the loop's tile; with PREFETCH the first tile and the loop's next; with PIPELINE the
    first stages-1 tiles (none past the last) and the loop's tile stages-1 ahead. None without STAGE."""
    lw = self.lw
    if not self.tiles: return ()
    k, var = self.k, lw.nesting.vars[self.axis]
    n, zero = k.axes[self.axis].size, UOp.const(dtypes.int64, 0)
    lw.decls += [stmt(Ops.DEFINE_LOCAL, arg=LocalArg(t.name, t.size * k.stages, k.tc is not None), dtype=view.dtype)
                   for view, t in self.tiles.items()]
    if k.stages > 1:
      ahead = lw.simplify(var + (k.stages - 1))
      first = [self.copy(UOp.const(dtypes.int64, j), TRUE) if j < n else ([], []) for j in range(k.stages - 1)]
      return (*first, self.copy(ahead, lw.simplify(ahead.lt(n))))
    if k.prefetch: return (self.copy(zero, TRUE), self.copy(lw.simplify(var + 1), lw.simplify(var.lt(n - 1))))
    return (self.copy(var, TRUE),)

  def copy(self, tile: UOp, exists: UOp) -> tuple[list[UOp], list[UOp]]:
    """The loads and the stores by which a workgroup's threads copy each staged input's K tile `tile` (where `exists`) to shared memory:
    the tile's elements in the input's memory order (the fastest dim in memory first) dealt out to the threads in turn, so a warp reads
    contiguous memory; in vectors of the lane width where that dim is contiguous and splits into them. With PIPELINE the stores are
    cp.async's (StoreArg.cp_async, of an inline load; no loads apart): 16 bytes where a chunk is contiguous and 16-byte aligned in
    memory and in the tile, else an element each (16-bit elements, which cp.async cannot copy alone: a load and a store)."""
    lw = self.lw
    k, n = self.k, self.k.launch_dims[1]
    loads, stores = list[UOp](), list[UOp]()
    lid = UOp.var("lid", 0, n - 1) if n > 1 else UOp.const(dtypes.int64, 0)
    var = lw.nesting.vars[self.axis]
    at_tile = {var: tile} if var.op is Ops.VAR else {}
    for view, t in self.tiles.items():
      st, size, buf = view.arg.strides, view.dtype.itemsize, lw.bufs[view.src[0].arg]
      order = sorted(t.dims, key=lambda dn: (abs(st[dn[0]]) or 1 << 62, -dn[0]))  # memory's fastest first
      fast, run = order[0][0], 16 // size
      chunk = t.dims[0][0] if k.tc is not None and k.tc.wgmma else t.dims[-1][0]  # the tile's contiguous dim (wgmma's: K, 8 a core row)
      if k.stages > 1: w = run if st[fast] == 1 and chunk == fast and order[0][1] % run == 0 else 1
      else: w = lw.width if lw.width > 1 and st[fast] == 1 and order[0][1] % lw.width == 0 and view.dtype == dtypes.float32 else 1
      lane = CHUNK_LANE if k.stages > 1 else lw.lane
      counts = [size // w if d == fast else size for d, size in order]
      for j in range(-(-prod(counts) // n)):
        rest = e = lw.simplify(lid + j * n)
        guard = exists if (j + 1) * n <= prod(counts) else lw.simplify(e.lt(prod(counts)).logical_and(exists))
        at: dict[int, UOp] = {}
        for i, ((d, _), c) in enumerate(zip(order, counts)):
          at[d] = lw.simplify(rest if i == len(order) - 1 else rest % c)
          rest = lw.simplify(rest // c)
        if w > 1: at[fast] = lw.simplify(at[fast] * w + lane)
        idx = tuple(lw.clamp(d, lw.simplify(self.workgroup_parts[d].substitute(at_tile) + at.get(d, 0))) for d in range(len(k.sizes)))
        off, valid, _ = lw.view_index(view, idx)
        dst = self.offset(view, at, tile)
        if k.stages == 1:
          lw.lines = loads
          val = lw.read(view.dtype, buf, off, lw.simplify(valid.logical_and(guard)) if guard is not TRUE else valid)
          lw.lines = stores
          lw.store(val, self.swizzle(view, dst), guard, t.name, view.dtype)
          continue
        self.async_copy(view, off, valid, dst, guard, w, stores)
    return loads, stores

  def async_copy(self, view: UOp, off: UOp, valid: UOp, dst: UOp, guard: UOp, w: int, stores: list[UOp]) -> None:
    """PIPELINE's copy of a chunk of `w` elements of `view` (CHUNK_LANE: the element in it) at `off` to its tile at `dst`, into
    `stores`: one cp.async where the chunk is contiguous and 16-byte aligned in memory and in the tile, else element by element."""
    lw = self.lw
    first = {CHUNK_LANE: UOp.const(dtypes.int64, 0)}
    off0, dst0 = lw.simplify(off.substitute(first)), lw.simplify(dst.substitute(first))
    if w > 1 and lw.simplify(off - off0) is CHUNK_LANE and CHUNK_LANE not in valid.vars and lw.simplify(off0 % w).arg == 0 \
       and lw.simplify(dst0 % w).arg == 0:
      stores.append(self.cp_async(view, self.swizzle(view, dst0), off0, valid, guard, w))
      return
    for c in range(w):
      at_c = {CHUNK_LANE: UOp.const(dtypes.int64, c)}
      off_c, valid_c, dst_c = (lw.simplify(x.substitute(at_c)) for x in (off, valid, dst))
      if view.dtype.itemsize >= 4:
        stores.append(self.cp_async(view, self.swizzle(view, dst_c), off_c, valid_c, guard, 1))
      else:  # 16-bit elements, which cp.async cannot copy alone: a load and a store
        lw.lines = stores
        val = lw.read(view.dtype, lw.bufs[view.src[0].arg], off_c, lw.simplify(valid_c.logical_and(guard)) if guard is not TRUE else valid_c)
        lw.store(val, self.swizzle(view, dst_c), guard, self.tiles[view].name, view.dtype)

  def cp_async(self, view: UOp, dst: UOp, src: UOp, valid: UOp, guard: UOp, width: int) -> UOp:
    """A store of `width` elements of `view`'s buffer at `src` (zeros where not `valid`) to its tile at `dst` by cp.async (where `guard`):
    .cg (past L1) for 16 bytes, else .ca."""
    t, dt = self.tiles[view], view.dtype
    load = stmt(Ops.LOAD, src, valid, arg=LoadArg(None, width, self.lw.bufs[view.src[0].arg]), dtype=dt)
    return stmt(Ops.STORE, dst, load, guard, arg=StoreArg(width, t.name, False, "cg" if width * dt.itemsize == 16 else "ca"), dtype=dt)
