"""Lowering: a kernel with its opts becomes a linear program of UOps that a renderer only spells.

Register parts of the kernel (UPCAST, UNROLL) are expanded into straight-line code. One UPCAST part along the contiguous output
axis becomes SIMD lanes: a value is one scalar for all lanes, one native vector, or one scalar per lane, whichever the loads and
ops allow. Every decision is made here: loop order, the split of a padded reduce loop, K block reloads and stores, LANES partials
and their combine tree, GROUP partials through shared memory, which loads and stores are vector ones, and the names of values.

The package, a module a job: program (the statements, their args and the program), lowerer (the core: values, reduces, program()),
loops (the CPU's loop nest, a GPU's workgroups and threads, GROUP's sums, STAGE's loop of tiles); a feature's state and steps
beside it: staged (STAGE, PREFETCH, PIPELINE), packed (PACK), lanes (LANES), kblock (KBLOCK), rows (the CPU's row arrays), dots
(the CPU's TC); the kernels lowered whole: tensor_cores (a GPU's TC), attention (in one kernel), flash (in tiles, and on tensor
cores)."""
from __future__ import annotations

from tinytune.codegen.kernel import AxisKind, Kernel
from tinytune.codegen.lower import attention, flash, tensor_cores
from tinytune.codegen.lower.lowerer import Lowerer
from tinytune.codegen.lower.program import (
  ARITH,
  CLOSES,
  FLOAT_LANES,
  OPENS,
  STATEMENTS,
  TRUE,
  VALUES,
  AccArg,
  FoldArg,
  Kind,
  LinearProgram,
  LoadArg,
  LocalArg,
  LoopArg,
  PlainTarget,
  SpecialArg,
  StoreArg,
  Target,
  Val,
  ValueArg,
  describe,
  stmt,
)
from tinytune.codegen.lower.tensor_cores import tc_kind

__all__ = ["ARITH", "CLOSES", "FLOAT_LANES", "OPENS", "STATEMENTS", "TRUE", "VALUES", "AccArg", "FoldArg", "Kind", "LinearProgram", "LoadArg",
           "LocalArg", "LoopArg", "PlainTarget", "SpecialArg", "StoreArg", "Target", "Val", "ValueArg", "describe", "lower", "stmt", "tc_kind"]


def lower(k: Kernel, target: Target | None = None) -> LinearProgram:
  """The program of `k` (with its opts) for `target` (a renderer; a plain C target where None)."""
  target = target or PlainTarget(k.caps.has_local)
  lowerer = Lowerer(k, target, rows=True)
  if k.attention is not None and k.flash_tc: return flash.flash_attention_tc(lowerer)
  if k.attention is not None: return flash.flash_attention(lowerer) if any(a.kind is AxisKind.STAGE for a in k.axes) else attention.attention(lowerer)
  if k.tc is not None and k.caps.has_local: return tensor_cores.tensor_cores(lowerer)
  ret = lowerer.program()
  # a row read back where no reduce loop wrote it (the output reads the statistic's source off its row): recomputed instead
  return ret if lowerer.rows is None or lowerer.rows.reads <= lowerer.rows.writes else Lowerer(k, target, rows=False).program()
