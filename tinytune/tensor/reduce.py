"""Reductions along axes: sum, max and min, and the statistics built from them."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tinytune.dtype import dtypes
from tinytune.helpers import prod
from tinytune.uop import Ops

if TYPE_CHECKING:
  from tinytune.tensor import Tensor


def sum(self: Tensor, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
  dt = dtypes.from_any(dtype) if dtype else dtypes.int64 if self.dtype in (dtypes.bool, dtypes.uint8, dtypes.int32) else self.dtype
  if dt.is_float and dt.itemsize == 2:  # a float16 sum stalls at 2048 + 1, a bfloat16 one at 256 + 1
    return self.cast(dtypes.float32)._reduce(Ops.ADD, axis, keepdim).cast(dt)
  return self.cast(dt)._reduce(Ops.ADD, axis, keepdim)


def _flip_order(self: Tensor) -> Tensor:
  """An order-reversing map (its own inverse) used to build min from max."""
  if self.dtype.is_float: return -self
  return self ^ (True if self.dtype == dtypes.bool else -1 if self.dtype != dtypes.uint8 else 255)


def max(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor: return self._reduce(Ops.MAX, axis, keepdim)
def min(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor: return self._flip_order().max(axis, keepdim)._flip_order()


def mean(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
  n = prod(s for i, s in enumerate(self.shape) if i in self._reduce_axes(axis))
  return self._float().sum(axis, keepdim) * (1 / n if n else math.nan)


def var(self: Tensor, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Tensor:
  n = prod(s for i, s in enumerate(self.shape) if i in self._reduce_axes(axis))
  sq = (self._float() - self.mean(axis, keepdim=True)).square().sum(axis, keepdim)
  return sq * (1 / (n - correction) if n - correction > 0 else math.nan)


def std(self: Tensor, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Tensor: return self.var(axis, keepdim, correction).sqrt()


def argmax(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
  if axis is None: return self.flatten().argmax(0) if self.ndim else Tensor(0, dtypes.int64, self.device)
  if not self.ndim: return self.reshape(1).argmax(self._axis(axis))
  d = self._axis(axis)
  n = self.shape[d]
  is_max = self == self.max(d, keepdim=True)
  if self.dtype.is_float: is_max = is_max | (self != self)  # a NaN is the max wherever it is, like numpy
  rev = Tensor.arange(n, 0, -1, dtype=dtypes.int64, device=self.device).reshape((n,) + (1,) * (self.ndim - d - 1))
  return n - (is_max.where(rev, 0)).max(d, keepdim)


def argmin(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor: return self._flip_order().argmax(axis, keepdim)
