"""The CPU's row arrays: a row statistic's source kept once."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tinytune.codegen.kernel import AxisKind
from tinytune.codegen.lower.program import ROW_KEPT, TRUE, LocalArg, Val, stmt
from tinytune.dtype import dtypes
from tinytune.helpers import prod
from tinytune.shape import strides_for
from tinytune.uop import Ops, UOp, linear_sum

if TYPE_CHECKING:
  from tinytune.codegen.lower.lowerer import Lowerer


class RowArrays:
  """The CPU keeps a row statistic's source in an array of the row's values where it computes an exp, log, sin or sqrt: the reduce
  loop writes it, the row's loops read it back (softmax's probabilities, computed once); a 16-bit float summed in float32 is kept
  as it is, before its cast. A pass of the reduce bodies and what follows them, owning the arrays and which were read and written."""
  def __init__(self, lw: Lowerer, source: UOp, red: UOp):
    self.lw, self.source, self.dims = lw, source, red.arg[1]  # the dims the reduce sums: a row's
    self.arrays: dict[tuple[UOp, ...], str] = {}  # a row -> its array's name
    self.reads, self.writes = set[str](), set[str]()

  @staticmethod
  def of(lw: Lowerer) -> RowArrays | None:
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

  def write(self, idx: tuple[UOp, ...], guard: UOp) -> None:
    """The reduce loop stores the source's value at `idx` into its row's array, where `guard` holds (not at the padding, clamped onto
    the last element: a workgroup's threads would write it together)."""
    name, off = self.at(idx)
    self.writes.add(name)
    self.lw.store(self.lw.node(self.source, idx), off, guard, name, self.source.dtype)
