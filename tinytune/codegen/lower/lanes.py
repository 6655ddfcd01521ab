"""LANES: a reduce split across SIMD lanes into partial accumulators, and their combine after each reduce loop."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tinytune.codegen.kernel import AxisKind
from tinytune.codegen.lower.program import FoldArg, Kind, Val, stmt
from tinytune.dtype import DType, dtypes
from tinytune.uop import Ops, UOp

if TYPE_CHECKING:
  from tinytune.codegen.lower.lowerer import Lowerer


class LanePartials:
  """LANES's partial accumulators: a reduce's accumulator (a scalar) is a partial one per vector of lanes in the loop, which the
  statements of `combine` (FOLDs, placed after each reduce loop, by its stage in a chain) add into it. `axis` is the LANES axis
  (-1: none, and the reduces' accumulators are their own)."""
  def __init__(self, lw: Lowerer):
    self.lw = lw
    self.axis = next((i for i, a in enumerate(lw.k.axes) if a.kind is AxisKind.LANES), -1)
    self.partials: dict[UOp, list[Val]] = {}  # an accumulator -> its partial accumulators, one per vector of lanes
    self.combine: list[list[UOp]] = [[] for _ in lw.k.reduceops]  # after each reduce loop: each accumulator from its partials
    self.unfolded: list[list[tuple[UOp, UOp]]] = [[] for _ in lw.k.reduceops]  # accumulators (named) and their lanes' vector, to fold

  def acc(self, red: UOp, name: str) -> Val:
    """A reduce split by LANES: a partial accumulator per vector of lanes (a vector where the device has the op, else a scalar per
    lane), each reading its own elements; after the loop the partials combine into the one scalar accumulator: the vectors into
    one, whose lanes fold with the other accumulators' (see fold_all), or the scalars in a tree."""
    lw, op = self.lw, red.arg[0]
    stage, w = lw.stage[red], lw.width  # vectors of 16-bit floats only for a max, which rounds nothing
    vector = w > 1 and (red.dtype == dtypes.float32 or red.dtype in lw.vf and op is Ops.MAX) and op in lw.target.vector_ops
    partials = [Val(Kind.VECTOR, (lw.define_acc(red, f"{name}_{j}", w),)) if vector else
                Val(Kind.LANES, tuple(lw.define_acc(red, f"{name}_{j}_{i}") for i in range(w)))
                for j in range(lw.k.axes[self.axis].size // w)]
    if vector:  # the vectors first; the accumulator named now, defined once its lanes fold
      self.combine[stage].append(v := stmt(Ops.FOLD, *(p.items[0] for p in partials), arg=FoldArg(f"{name}_v", w, op), dtype=red.dtype))
      self.unfolded[stage].append((acc := UOp.unique(Ops.FOLD, red.dtype, (), FoldArg(name, 1, op)), v))
    else: acc = self.tree(stage, [p.lane(i) for p in partials for i in range(w)], FoldArg(name, 1, op), red.dtype)
    self.partials[acc] = partials
    return Val(Kind.SCALAR, (acc,))

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

  def fold_all(self) -> None:
    """Each stage's LANES accumulators (see acc) from their vectors: where the target folds lanes across vectors, as many
    accumulators as a vector has lanes at once, in one statement whose lane j folds vector j's lanes (a transpose as it adds: 15
    adds of shuffled halves, 30 shuffles, for 16 vectors, where each vector's tree took 15 extracts and 15 scalar adds), each then
    reading its lane; a lone one, or any on other targets, in a tree."""
    w = self.lw.width
    group = w if self.lw.target.lane_folds else 1
    for stage, pending in enumerate(self.unfolded):
      for at in range(0, len(pending), group):
        (first, _), chunk = pending[at], pending[at:at + group]
        if len(chunk) > 1:
          across = FoldArg(f"{first.arg.name}_l", w, first.arg.op, True)
          lanes = Val(Kind.VECTOR, (self.fold(stage, [v for _, v in chunk], across, first.dtype),))
          for j, (acc, _) in enumerate(chunk): self.fold(stage, [lanes.lane(j)], acc.arg, acc.dtype)
        else: self.tree(stage, [Val(Kind.VECTOR, (chunk[0][1],)).lane(i) for i in range(w)], first.arg, first.dtype)

  def partial(self, acc: Val, inst: dict[int, UOp]) -> Val:
    """The accumulator an instance adds into: with LANES, the partial of its vector of lanes."""
    if (parts := self.partials.get(acc.items[0])) is None: return acc
    return parts[int(self.lw.subst_lane(inst[self.axis], 0).arg) // self.lw.width]
