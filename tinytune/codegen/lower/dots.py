"""The CPU's TC: bfloat16 pairs in dot product instructions."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tinytune.codegen.lower.program import TRUE, Kind, Val
from tinytune.dtype import dtypes
from tinytune.uop import Ops, UOp

if TYPE_CHECKING:
  from tinytune.codegen.lower.lowerer import Lowerer


class DotPairs:
  """The CPU's TC (bfloat16 pairs along K in one dot product instruction, see TensorCore), a pass of the reduce bodies: it owns
  the names of the vectors of pairs made in the body."""
  def __init__(self, lw: Lowerer, axis: int):
    self.lw, self.axis = lw, axis  # the TC axis: the pair's two instances along K
    self.names: dict[tuple[UOp, ...], str] = {}

  def accumulate(self, red: UOp, idx: tuple[UOp, ...], acc: Val, dims: list[UOp], inst: dict[int, UOp]) -> None:
    """The two instances of a pair along K at once, in a dot product where it can be one, else each added as without TC."""
    lw = self.lw
    if lw.simplify(inst[self.axis]).arg: return
    second = {**inst, self.axis: UOp.const(dtypes.int64, 1)}
    pair = [(inst, dims), (second, lw.dims(second))]
    if not self.dot(idx, lw.lanes.partial(acc, inst), [d for _, d in pair]):
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
