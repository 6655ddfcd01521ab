"""Checks of values PyTorch raises on: an index out of range, an integer division by zero. A kernel can't raise, so values already
in memory are checked where the op is called, on the host (one pass over them, after a copy out of a GPU's memory), and lazy ones
at the next realize of any tensor (they are computed into memory and read back once: one kernel and one copy more, where the op
that reads them would have fused them). Nothing is checked inside a TinyJit replay, which runs no Python."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tinytune.uop import Ops

if TYPE_CHECKING:
  from tinytune.tensor import Tensor

Check = tuple["Tensor", Callable[[Any], Any], Callable[[Any], Exception]]
pending: list[Check] = []  # lazy values to check at the next realize


def require(values: Tensor, bad: Callable[[Any], Any], error: Callable[[Any], Exception]) -> None:
  """Raise error(v) for the first of values' elements v where bad (an expression of operators, for NumPy and Tensors alike) holds:
  now where values are in memory, else at the next realize."""
  u = values.uop.src[0] if values.uop.op is Ops.VIEW else values.uop
  if u.op in (Ops.BUFFER, Ops.CONST): _run((values, bad, error))
  else: pending.append((values, bad, error))


def run_pending() -> None:
  """The pending checks, each once (a check that fails drops the others)."""
  todo = list(pending)
  pending.clear()
  for check in todo: _run(check)


def _run(check: Check) -> None:
  values, bad, error = check
  arr = values.numpy()
  hit = np.broadcast_to(np.asarray(bad(arr)), arr.shape)
  if hit.any(): raise error(arr[hit].flat[0].item())
