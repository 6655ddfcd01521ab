"""Checks of values PyTorch raises on: an index out of range, an integer division by zero.

An index is checked in the kernel that reads it (`checked`): a CHECK node stores a value out of range into a flag (int32 or int64), which
the realize that ran the kernel reads after it and raises on (a GPU waits there for that realize's kernels). Every element that a
kernel reads is checked, and only those (x[idx][:1] checks idx[0] only); a constant is checked at the call. The other checks
(`require`: a target that is not the ignored one, a divisor of 0, an index into an empty dim) run on the host: values already in
memory where the op is called (one pass over them, after a copy out of a GPU's memory), lazy ones at the next realize of any tensor
(computed into memory and read back once: one kernel and one copy more). A TinyJit replay runs CHECK's kernels, not `require`'s."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tinytune.dtype import dtypes
from tinytune.uop import Ops, UOp

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


def checked(values: Tensor, lo: int, hi: int, error: Callable[[int], Exception]) -> Tensor:
  """values, raising error(v) for an element v outside [lo, hi) at the realize of a kernel that reads it (a constant's at once)."""
  u = values.uop.src[0] if values.uop.op is Ops.VIEW else values.uop
  if u.op is Ops.CONST or hi <= lo:
    require(values, lambda v: (v < lo) | (v >= hi), error)
    return values
  from tinytune.engine.realize import Flag
  # an int32 index is compared and stored as int32 where the bounds fit: an int64 store of it halves pocl's vector width
  dtype = dtypes.int32 if values.dtype == dtypes.int32 and -2**31 <= lo and hi <= 2**31 else dtypes.int64
  flag = UOp(Ops.BUFFER, dtype, (), Flag(values.device, lo, error, dtype))
  return type(values)._of(UOp(Ops.CHECK, values.dtype, (values.uop, flag), (lo, hi)), values.device)


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
