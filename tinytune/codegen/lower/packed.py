"""PACK: panels of the CPU's inputs copied into arrays of the thread's, and the reduce body's reads of them."""
from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING, NamedTuple

from tinytune.codegen.kernel import AxisKind
from tinytune.codegen.lower.program import TRUE, LocalArg, LoopArg, Val, stmt
from tinytune.dtype import dtypes
from tinytune.helpers import prod
from tinytune.shape import strides_for
from tinytune.uop import Ops, UOp, linear_sum

if TYPE_CHECKING:
  from tinytune.codegen.lower.lowerer import Lowerer


class Panel(NamedTuple):  # a packed input's array
  name: str
  loops: list[tuple[int, int]]  # (axis, size) of the loops whose every iteration it holds (PACK 1's block; see Kernel.pack_tiles)
  dims: list[tuple[int, int]]  # (dim, extent) of the panel one iteration of them reads
  strides: list[int]  # the array's: the loops', then the dims'
  at: int  # the number of loops around its copy


class PackedPanels:
  """PACK's panels: each packed input's array (none without PACK). The reduce body reads a packed input from its panel (read);
  copies() makes the statements that fill them, which LoopNest.cpu places inside their loops. A block (PACK 1) is its loops' panels
  one after another, each contiguous like PACK 0's."""
  def __init__(self, lw: Lowerer):
    self.lw, k = lw, lw.k
    self.panels = {t.view: Panel(f"pack{j}", t.loops, t.dims, list(strides_for(tuple(n for _, n in t.loops) + tuple(e for _, e in t.dims))), t.at)
                   for j, t in enumerate(k.pack_tiles() if k.pack else [])}

  @functools.cached_property
  def parts(self) -> list[UOp]:
    """Each dim's index where it is the same for a whole panel: its parts outside the panel's loops (threads, K blocks, global loops)."""
    k, lw, kinds = self.lw.k, self.lw, (AxisKind.GLOBAL, AxisKind.THREAD, AxisKind.KBLOCK)
    return [linear_sum(dtypes.int64, [(lw.nesting.vars[i], a.stride) for i, a in enumerate(k.axes) if a.dim == d and a.kind in kinds], 0,
                       lw.simplified) for d in range(len(k.sizes))]

  def read(self, view: UOp) -> Val:
    """A packed input's value at the dims add() reads, from its panel: its loops' panel, then each dim's index less its part outside
    the panel."""
    lw, (name, loops, dims, strides, _) = self.lw, self.panels[view]
    outside = {v: UOp.const(dtypes.int64, 0) for part in self.parts for v in part.vars}
    at = [lw.nesting.vars[i] for i, _ in loops] + [lw.simplify(lw.at_dims[d].substitute(outside)) for d, _ in dims]
    off = linear_sum(dtypes.int64, list(zip(at, strides)), 0, lw.simplified)
    if (key := (name, off)) not in lw.memo: lw.memo[key] = lw.read(view.dtype, name, off, TRUE)
    return lw.memo[key]

  def copies(self) -> dict[int, list[UOp]]:
    """PACK's copies, by the number of loops around them: each panel's array, then loops over its block's loops (in place of theirs)
    and its reduce dims whose body copies the output dims' parts (unrolled); in vectors along the input's fastest dim in memory where
    that is contiguous and splits into them."""
    lw, ret = self.lw, dict[int, list[UOp]]()
    k = lw.k
    for j, (view, (name, block, dims, strides, at)) in enumerate(self.panels.items()):
      lw.lines = ret.setdefault(at, [])
      lw.emit(Ops.DEFINE_LOCAL, arg=LocalArg(name, prod(e for _, e in dims) * prod(n for _, n in block)), dtype=view.dtype)
      in_block = {lw.nesting.vars[i]: UOp.var(f"c{j}_a{i}", 0, n - 1) for i, n in block}
      for i, n in block: lw.emit(Ops.RANGE, arg=LoopArg(in_block[lw.nesting.vars[i]].arg[0], 0, n, False))
      st = view.arg.strides
      fast = min(dims, key=lambda de: (abs(st[de[0]]) or 1 << 62, -de[0]))[0]
      w = lw.width if lw.width > 1 and st[fast] == 1 and dict(dims)[fast] % lw.width == 0 else 1
      def steps(d: int, e: int) -> int: return e // w if d == fast else e
      loops = [(d, e) for d, e in dims if d >= k.n_global and steps(d, e) > 1]
      at_loop = {d: UOp.var(f"c{j}_{d}", 0, steps(d, e) - 1) for d, e in loops}
      for d, e in loops: lw.emit(Ops.RANGE, arg=LoopArg(at_loop[d].arg[0], 0, steps(d, e), False))
      unrolled = [(d, e) for d, e in dims if d not in at_loop]
      for vals in itertools.product(*(range(steps(d, e)) for d, e in unrolled)):
        pos = {**at_loop, **{d: UOp.const(dtypes.int64, v) for (d, _), v in zip(unrolled, vals)}}
        if w > 1: pos[fast] = lw.simplify(pos[fast] * w + lw.lane)
        idx = tuple(lw.clamp(d, lw.simplify(self.parts[d].substitute(in_block) + pos.get(d, 0))) for d in range(len(k.sizes)))
        off, valid, _ = lw.view_index(view, idx)
        val = lw.read(view.dtype, lw.bufs[view.src[0].arg], off, valid)
        place = [*zip(in_block.values(), strides), *((pos[d], s) for (d, _), s in zip(dims, strides[len(block):]))]
        lw.store(val, linear_sum(dtypes.int64, place, 0, lw.simplified), TRUE, name, view.dtype)
      lw.lines += [stmt(Ops.ENDRANGE) for _ in [*block, *loops]]
    return ret
