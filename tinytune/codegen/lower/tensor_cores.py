"""A GPU's TC: matmuls on tensor cores (WMMA, mma.sync, wgmma, MFMA)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tinytune.codegen.kernel import AxisKind, Kernel
from tinytune.codegen.lower.program import TRUE, LinearProgram, LocalArg, LoopArg, stmt
from tinytune.dtype import dtypes
from tinytune.uop import Ops, UOp

if TYPE_CHECKING:
  from tinytune.codegen.lower.lowerer import Lowerer


def tc_kind(k: Kernel) -> str:
  """The family of a GPU's TC statements (see WMMA in program.py): TC's arg 2 or 1 (wgmma, mma.sync), else arg 0 by the lanes it works across."""
  assert k.tc is not None
  return "wgmma" if k.tc.wgmma else "mma" if k.tc.mma else "wmma" if k.caps.warp == 32 else "mfma"


def tensor_cores(lw: Lowerer) -> LinearProgram:
  """The pass for a GPU's TC: each warp keeps one float32 accumulator fragment per UPCAST tile, loads 16x16 tiles of A and B
  straight from memory in the K loop, then goes through shared memory, where the lowerer's values (`lw.cell` for the sum) apply
  what follows the sum and store."""
  return _TensorCores(lw).program()


class _TensorCores:
  """A GPU's TC for one kernel: its statements' family (tc_kind), the warp's register tiles (UPCAST instances; with wgmma, the runs
  of them side by side along B's columns that one wgmma computes), and the fragments loaded in a K step."""
  def __init__(self, lw: Lowerer):
    k, tc = lw.k, lw.k.tc
    assert tc is not None
    self.lw, self.k, self.tc, self.kind = lw, k, tc, tc_kind(k)
    self.tiles = lw.instances((AxisKind.UPCAST,))
    # wgmma: the tiles side by side along B's columns (Kernel.wgmma_cols) are one m64nNk16, their accumulators one array of its D
    wide = k.wgmma_cols()
    self.runs: dict[tuple[tuple[int, UOp], ...], list[int]] = {}
    for j, tile in enumerate(self.tiles): self.runs.setdefault(tuple((i, v) for i, v in tile.items() if i != wide[0]), []).append(j)
    self.frags: dict[tuple[str, object, UOp], str] = {}  # a fragment's name by its operand, buffer and offset
    self.offsets: dict[tuple[UOp, tuple[UOp, ...]], UOp] = {}
    self.body: list[UOp] = []  # the K loop's
    self.wg = {v: UOp.const(dtypes.int64, 0) for part in lw.staged.workgroup_parts for v in part.vars} if lw.staged.tiles else {}

  def wmma(self, *arg: object, src: tuple[UOp, ...] = ()) -> UOp: return stmt(Ops.WMMA, *src, arg=(self.kind, *arg))

  def program(self) -> LinearProgram:
    lw, k, tc, wmma = self.lw, self.k, self.tc, self.wmma
    out = lw.nesting.group_ids()
    out.append(wmma("ids"))
    out += lw.nesting.unflatten(sorted((i for i, a in enumerate(k.axes) if a.kind is AxisKind.LOCAL), key=lambda i: k.axes[i].dim), "warp")
    out += [wmma("accs", tuple(js)) for js in self.runs.values()] if tc.wgmma else [wmma("acc", j) for j in range(len(self.tiles))]
    if tc.wgmma: self.wgmma_steps()
    else: self.mma_steps()
    red = [i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE]
    copies = lw.staged.copies()
    # wgmma reads the tiles through the async proxy: a thread's plain stores to them are fenced after (EMU counts a fence per thread, not per
    # element), and with PIPELINE its cp.asyncs where they land, after the wait, before the barrier
    landed = [wmma("proxy")] if tc.wgmma and k.stages > 1 else []
    if tc.wgmma:
      def fenced(stores: list[UOp]) -> list[UOp]:
        return [*stores, wmma("proxy")] if any(u.op is Ops.STORE and not u.arg.cp_async for u in stores) else stores
      copies = tuple((loads, fenced(stores)) for loads, stores in copies)
    if copies: out += lw.decls + lw.nesting.staged(copies, lw.nesting.nest(red, self.body), landed)  # as LoopNest.workgroups
    else: out += lw.nesting.nest(red, self.body)
    out.append(stmt(Ops.DEFINE_LOCAL, arg=LocalArg("tiles", k.sizes_of(AxisKind.LOCAL) * 256), dtype=dtypes.float32))
    return LinearProgram(k, lw.width, out + self.outputs())

  def fragment(self, which: str, view: UOp, layout: str, ld: int, dims: list[UOp]) -> str:
    """The name of operand `which` ("a" or "b") of the K step at `dims`, loaded into a fragment the first time (from memory, or from
    its staged tile)."""
    lw, k, tc, wmma = self.lw, self.k, self.tc, self.wmma
    buf: int | str = lw.bufs[view.src[0].arg]
    line = 0
    if view in lw.staged.tiles:  # STAGE: from the workgroup's tile in shared memory (Kernel.stage_tiles; mma.sync's in memory's order, swizzled)
      buf, tile, strides, _, line = lw.staged.tiles[view]
      off = lw.staged.offset(view, {d: lw.simplify(dims[d].substitute(self.wg)) for d, _ in tile})
      st = {d: s for (d, _), s in zip(tile, strides)}
      i, j = (tc.row, k.n_global) if which == "a" else (k.n_global, tc.col)  # the fragment's rows and columns
      layout, ld = ("row_major", st.get(i, 0)) if st.get(j) == 1 else ("col_major", st.get(j, 0))
    else:  # A's offset is the same for each tile along B's dim, and B's along A's: worked out once
      used = tuple(d for d, st in zip(dims, view.arg.strides) if st)
      if (view, used) not in self.offsets: self.offsets[view, used] = lw.simplify(view.arg.index(tuple(dims))[0])
      off = self.offsets[view, used]
    if (key := (which, buf, off)) not in self.frags:
      self.frags[key] = name = f"{which}{len(self.frags)}"
      self.body.append(wmma("fragment", name, which, view.dtype, layout))
      # mma.sync from shared memory takes ldmatrix, whose rows of 8 elements must start 16-byte aligned (the array is 32-byte aligned)
      r = lw.simplify(off % 8)
      ldmatrix = isinstance(buf, str) and ld % 8 == 0 and r.op is Ops.CONST and r.arg == 0
      assert ldmatrix or not line, "a swizzled tile is read by ldmatrix: its fragments' rows start at multiples of 16 bytes"
      rows = (ldmatrix, *((line,) if line else ())) if tc.mma else ()  # a swizzled tile's line last
      self.body.append(wmma("load", name, buf, ld, which, layout, *rows, src=(off,)))
    return self.frags[key]

  def mma_steps(self) -> None:
    """Each K step's products (UNROLL instances), a tile at a time, its fragments loaded first."""
    lw, tc = self.lw, self.tc
    for unroll in lw.instances((AxisKind.UNROLL,)):
      for j, tile in enumerate(self.tiles):
        dims = lw.dims({**tile, **unroll})
        a, b = self.fragment("a", tc.a, tc.a_layout, tc.a_ld, dims), self.fragment("b", tc.b, tc.b_layout, tc.b_ld, dims)
        self.body.append(self.wmma("mma", j, a, b, tc.a.dtype))

  def wgmma_steps(self) -> None:
    """The warpgroup's wgmmas, each from descriptors of its 64 rows of A and 16 columns of B at the K step (warp 0's)."""
    lw, k, tc = self.lw, self.k, self.tc
    warp0 = {**self.wg, **{lw.nesting.vars[i]: UOp.const(dtypes.int64, 0) for i, a in enumerate(k.axes) if a.kind is AxisKind.LOCAL}}
    def desc(view: UOp, dims: list[UOp]) -> tuple[str, UOp, int]:
      t = lw.staged.tiles[view]
      return t.name, lw.staged.offset(view, {d: lw.simplify(dims[d].substitute(warp0)) for d, _ in t.dims}), t.dims[0][1] * 16
    self.body.append(self.wmma("fence"))
    for unroll in lw.instances((AxisKind.UNROLL,)):
      for js in self.runs.values():
        dims = lw.dims({**self.tiles[js[0]], **unroll})
        (ta, oa, sa), (tb, ob, sb) = desc(tc.a, dims), desc(tc.b, dims)
        self.body.append(self.wmma("mma", tuple(js), ta, sa, tb, sb, tc.a.dtype, src=(oa, ob)))
    self.body.append(self.wmma("wait"))

  def outputs(self) -> list[UOp]:
    """The outputs, one tile at a time through the warp's 256 floats of shared memory: what follows the sum (`lw.cell`), and the store."""
    lw, k, tc, wmma = self.lw, self.k, self.tc, self.wmma
    row_axis, col_axis = (next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.TC and a.dim == d) for d in (tc.row, tc.col))
    w = k.caps.warp  # the warp's lanes: 32, or CDNA's 64
    tile_row, tile_col, pair = UOp.var("tile_row", 0, w // 16 - 1), UOp.var("tile_col", 0, 15), UOp.var("pair", 0, 256 // w - 1)
    lw.cell = UOp(Ops.CELL, dtypes.float32, (), ("tiles", f"warp*256+lane+{w}*pair"))
    lw.lines = []
    for j, tile in enumerate(self.tiles):
      # element lane + 32 pair of the 16x16 tile (32 lanes): row lane / 16 + 2 pair, column lane % 16; a loop, as lowering the 8 elements
      # one by one took most of a 4x4-tile TC matmul's render (30 of 38 ms); values made in one tile's loop are not seen in the next's
      lw.lines += [wmma("store", j), wmma("sync"), stmt(Ops.RANGE, arg=LoopArg("pair", 0, 256 // w, False))]
      lw.memo.clear()
      dims = lw.dims({**tile, row_axis: tile_row + w // 16 * pair, col_axis: tile_col})
      lw.store(lw.node(k.ast, tuple(dims[:k.n_global])), lw.out_offset(dims), TRUE)
      lw.lines += [stmt(Ops.ENDRANGE), wmma("sync")]
    return lw.lines
