"""KBLOCK: K blocks outside the output loops (the CPU's), the sums so far kept in the output between them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tinytune.codegen.kernel import AxisKind
from tinytune.codegen.lower.program import TRUE, Kind, LoadArg, Val, stmt
from tinytune.dtype import dtypes
from tinytune.uop import Ops, UOp

if TYPE_CHECKING:
  from tinytune.codegen.lower.lowerer import Lowerer


def kblocked(lw: Lowerer, post: list[UOp], partials: list[tuple[Val, UOp, UOp]]) -> list[UOp]:
  """K blocks: the output buffer holds the sums so far between blocks (apply_opt checked that each output element has its own
  accumulator, of its dtype). Each block after the first starts from them; each before the last stores them, and only the
  last runs what follows the reduce."""
  assert len(partials) == len(lw.accs), "KBLOCK needs one accumulator per output element"
  kb = next(i for i, a in enumerate(lw.k.axes) if a.kind is AxisKind.KBLOCK)
  var, last, dt, zero = lw.nesting.vars[kb], lw.k.axes[kb].size - 1, lw.k.ast.dtype, UOp.const(dtypes.int64, 0)
  def load(off: UOp, width: int = 1) -> UOp: return stmt(Ops.LOAD, off, TRUE, arg=LoadArg(None, width, 0), dtype=dt)
  lw.lines = [stmt(Ops.IF, var.alu(Ops.CMPNE, zero))]
  for acc, off, guard in partials:
    base = lw.subst_lane(off, 0)
    if acc.kind is Kind.VECTOR and not lw.lane_dep(guard) and lw.contiguous(off, base):
      lw.emit(Ops.ASSIGN, acc.items[0], load(base, lw.width), guard)
      continue
    if acc.kind is Kind.SCALAR: lw.emit(Ops.ASSIGN, acc.items[0], load(off), guard)
    else:
      for i in range(lw.width): lw.emit(Ops.ASSIGN, acc.lane(i), load(lw.subst_lane(off, i)), lw.subst_lane(guard, i))
  lw.decls += [*lw.lines, stmt(Ops.ENDIF)]
  lw.lines = [stmt(Ops.IF, var.alu(Ops.CMPNE, UOp.const(dtypes.int64, last)))]
  for acc, off, guard in partials: lw.store(acc, off, guard)
  return [*lw.lines, stmt(Ops.ELSE), *post, stmt(Ops.ENDIF)]
