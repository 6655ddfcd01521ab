"""An opt is a value: Opt(op, axis, arg). Lists of opts serialize to JSON exactly."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence


class OptOps(Enum):
  UPCAST = "UPCAST"  # split a global axis; the inner part is computed per thread in registers
  UNROLL = "UNROLL"  # split a reduce axis; the inner iterations are unrolled
  LANES = "LANES"  # split a reduce axis; the inner part is independent accumulators (SIMD lanes), combined once after the loop
  LOCAL = "LOCAL"  # split a global axis into the workgroup
  GROUP = "GROUP"  # split a reduce axis across a workgroup (inner part)
  GROUPTOP = "GROUPTOP"  # the same, outer part
  THREAD = "THREAD"  # split a global axis across CPU cores (outer part)
  KBLOCK = "KBLOCK"  # split a reduce axis into blocks of arg iterations, looped outside the output loops (CPU)
  SWAP = "SWAP"  # exchange the loop order of two global axes
  PADTO = "PADTO"  # pad an axis up to a multiple of arg, masking the extra elements
  TC = "TC"  # tensor cores
  STREAM = "STREAM"  # the CPU writes the output past the caches (non-temporal stores of whole cache lines)
  STAGE = "STAGE"  # split a reduce axis into tiles of arg; the workgroup copies each tile of its inputs to shared memory, then reads it there
  PREFETCH = "PREFETCH"  # STAGE's next tile is read from memory into registers while the current one is computed
  PACK = "PACK"  # the CPU copies an input's panel (per K block) to a contiguous array of the thread's, which the loops inside reuse
  PIPELINE = "PIPELINE"  # STAGE's tiles copied by cp.async into a ring of arg shared buffers: tile k+arg-1's copy in flight while tile k is computed
  RASTER = "RASTER"  # workgroups numbered in bands of arg along a global axis, a band down each column of the next axis in turn (L2 reuse)


class KernelOptError(Exception):
  """An opt that is not valid for this kernel on this device."""


def check(cond: bool, why: str) -> None:
  if not cond: raise KernelOptError(why)


@dataclass(frozen=True, order=True)
class Opt:
  op: OptOps
  axis: int
  arg: int

  def __repr__(self) -> str: return f"Opt({self.op.name}, {self.axis}, {self.arg})"
  def to_json(self) -> list[Any]: return [self.op.value, self.axis, self.arg]

  @staticmethod
  def from_json(x: Any) -> Opt:
    """Build an Opt from [op, axis, arg]; ValueError for anything else, so a hostile file cannot do more than fail."""
    if not (isinstance(x, list) and len(x) == 3 and isinstance(x[0], str) and all(type(v) is int for v in x[1:])):
      raise ValueError(f"an opt is [op, axis, arg] with integer axis and arg, got {x!r}")
    if x[0] not in OptOps.__members__: raise ValueError(f"unknown opt {x[0]!r}; known: {', '.join(OptOps.__members__)}")
    return Opt(OptOps[x[0]], x[1], x[2])


def opts_to_json(opts: Sequence[Opt]) -> str: return json.dumps([o.to_json() for o in opts])


MAX_OPTS_JSON = 1 << 16  # far more than any real opt list; a larger text is refused before it is parsed


def opts_from_json(text: str) -> list[Opt]:
  """Opts from their JSON; ValueError for anything else, without parsing a text that is too long or nested to be opts."""
  if not isinstance(text, str): raise ValueError(f"opts are JSON text, got {type(text).__name__}")
  if len(text) > MAX_OPTS_JSON: raise ValueError(f"opts JSON of {len(text)} characters is too long to be opts")
  if re.search(r"\[\s*\[\s*\[|\{", text): raise ValueError("opts JSON nests deeper than a list of [op, axis, arg]")
  data = json.loads(text)
  if not isinstance(data, list): raise ValueError(f"opts are a JSON list, got {type(data).__name__}")
  return [Opt.from_json(x) for x in data]
