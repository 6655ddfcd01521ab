"""Indexing: tensor[...] with ints, slices, None and Ellipsis."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
  from tinytune.tensor import Tensor


def getitem(self: Tensor, index: Any) -> Tensor:
  index = index if isinstance(index, tuple) else (index,)
  ellipsis = [at for at, i in enumerate(index) if i is Ellipsis]  # `is`, never ==: Tensor == builds a Tensor
  if len(ellipsis) > 1: raise ValueError("an index has at most one Ellipsis")
  real = [i for i in index if i is not None and i is not Ellipsis]
  if len(real) > self.ndim: raise ValueError(f"too many indices ({len(real)}) for a tensor of {self.ndim} dims")
  at = ellipsis[0] if ellipsis else len(index)
  index = index[:at] + (slice(None),) * (self.ndim - len(real)) + index[at + 1:]
  x, dim, out_shape = self, 0, []
  for i in index:
    if i is None: out_shape.append(1); continue
    n = x.shape[dim]
    if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
      if not -n <= i < n: raise IndexError(f"index {i} is out of range for dim {dim} of size {n}")
      x = x.shrink(tuple((int(i) % n, int(i) % n + 1) if j == dim else None for j in range(x.ndim)))
    elif isinstance(i, slice):
      start, stop, step = i.indices(n)
      if step < 0: x, start, stop, step = x.flip(dim), n - 1 - start, n - 1 - stop, -step
      length = max(0, -(-(stop - start) // step))
      x = x.shrink(tuple((start, start + (length - 1) * step + 1 if length else start) if j == dim else None for j in range(x.ndim)))
      if step > 1 and length:
        shp = x.shape
        x = x.pad(tuple((0, length * step - shp[dim]) if j == dim else None for j in range(x.ndim)))
        x = x.reshape(shp[:dim] + (length, step) + shp[dim + 1:]).shrink(
          tuple((0, 1) if j == dim + 1 else None for j in range(x.ndim + 1))).reshape(shp[:dim] + (length,) + shp[dim + 1:])
      out_shape.append(length)
    else: raise TypeError(f"unsupported index {i!r}: use ints, slices, None or ...")
    dim += 1
  return x.reshape(tuple(out_shape))
