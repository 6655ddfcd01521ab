"""Reductions along axes: sum, max and min, the statistics built from them, running (cumulative) reductions and sorting."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

from tinytune.dtype import dtypes
from tinytune.helpers import prod as prod_
from tinytune.tensor.autograd import deferred, lazily, tracking
from tinytune.uop import Ops

if TYPE_CHECKING:
  from tinytune.tensor import Tensor


def sum(self: Tensor, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
  dt = dtypes.from_any(dtype) if dtype is not None else self.dtype if self.dtype.is_float else dtypes.int64  # ints and bools add in int64, as torch
  if dt.is_half:  # a float16 sum stalls at 2048 + 1, a bfloat16 one at 256 + 1
    return self.cast(dtypes.float32)._reduce(Ops.ADD, axis, keepdim).cast(dt)
  return self.cast(dt)._reduce(Ops.ADD, axis, keepdim)


def _flip_order(self: Tensor) -> Tensor:
  """An order-reversing map (its own inverse) used to build min from max."""
  if self.dtype.is_float: return -self
  return self ^ (True if self.dtype == dtypes.bool else -1)  # -1 is all ones in every int type


def max(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
  _require_values(self, axis, "max")
  return self._reduce(Ops.MAX, axis, keepdim)


def _require_values(self: Tensor, axis: Any, what: str) -> None:
  """The max (or argmax) of all of an empty tensor has no answer: raise as torch does. (Over an empty dim, torch raises too; here it
  gives the reduction's identity, which softmax and the other compositions over empty dims rely on.)"""
  if axis is None and not self.numel():
    raise (IndexError if what.startswith("arg") else RuntimeError)(
      f"{what}(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.")
def min(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
  _require_values(self, axis, "min")
  return self._flip_order().max(axis, keepdim)._flip_order()


def mean(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
  n = prod_(s for i, s in enumerate(self.shape) if i in self._reduce_axes(axis))
  return self._float().sum(axis, keepdim) * (1 / n if n else math.nan)


def var(self: Tensor, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Tensor:
  n = prod_(s for i, s in enumerate(self.shape) if i in self._reduce_axes(axis))
  sq = (self._float() - self.mean(axis, keepdim=True)).square().sum(axis, keepdim)
  # no degrees of freedom left: divided by 0 as torch does (inf, or NaN where the squares sum to 0)
  return sq * (1 / (n - correction)) if n - correction > 0 else sq / 0.0


def std(self: Tensor, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Tensor: return self.var(axis, keepdim, correction).sqrt()


def argmax(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
  """The index of the first max along axis (of the flattened tensor where None), int32 like tinygrad."""
  _require_values(self, axis, "argmax")
  if axis is None: return self.flatten().argmax(0) if self.ndim else Tensor(0, dtypes.int32, self.device)
  if not self.ndim: return self.reshape(1).argmax(self._axis(axis))
  d = self._axis(axis)
  n = self.shape[d]
  is_max = self == self.max(d, keepdim=True)
  if self.dtype.is_float: is_max = is_max | (self != self)  # a NaN is the max wherever it is, like numpy
  rev = Tensor.arange(n, 0, -1, dtype=dtypes.int32, device=self.device).reshape((n,) + (1,) * (self.ndim - d - 1))
  return n - (is_max.where(rev, 0)).max(d, keepdim)


def argmin(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor: return self._flip_order().argmax(axis, keepdim)


def prod(self: Tensor, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
  """The product along axes, by halving: log2(n) multiplies of the two halves (there is no product reduction)."""
  axes = self._reduce_axes(axis)
  dt = dtypes.from_any(dtype) if dtype is not None else self.dtype if self.dtype.is_float else dtypes.int64  # ints and bools add in int64, as torch
  x = self.cast(dtypes.float32 if dt.is_half else dt)
  if not self.ndim: return x.cast(dt)
  rest = [i for i in range(self.ndim) if i not in axes]
  x = x.permute(rest + list(axes)).reshape(tuple(self.shape[i] for i in rest) + (prod_(self.shape[i] for i in axes),))
  if x.shape[-1] == 0: x = x.pad(((0, 0),) * (x.ndim - 1) + ((0, 1),), value=1)
  while (n := x.shape[-1]) > 1:
    if n % 2: x, n = x.pad(((0, 0),) * (x.ndim - 1) + ((0, 1),), value=1), n + 1
    x = x.shrink(tuple((0, s) for s in x.shape[:-1]) + ((0, n // 2),)) * x.shrink(tuple((0, s) for s in x.shape[:-1]) + ((n // 2, n),))
  out = x.reshape(tuple(1 if i in axes else s for i, s in enumerate(self.shape)) if keepdim else tuple(self.shape[i] for i in rest))
  return out.cast(dt)


def all(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor: return (self == 0).any(axis, keepdim).logical_not()
def any(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
  return (self != 0).cast(dtypes.uint8)._reduce(Ops.MAX, axis, keepdim).cast(dtypes.bool)


def logsumexp(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
  """log(sum(exp(x))) along axes, shifted by the max so that it neither overflows nor underflows."""
  x = self._float()
  m = x.max(axis, keepdim=True)
  m = (m.abs() == math.inf).where(0, m)  # all -inf (or an inf) would make x - m NaN
  ret = (x - m).exp().sum(axis, keepdim=True).log() + m
  return ret if keepdim else ret.reshape(x.max(axis).shape)


def std_mean(self: Tensor, axis: Any = None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
  return self.std(axis, keepdim, correction), self.mean(axis, keepdim)


BLOCK = 256  # longer runs go in two stages


def _running(self: Tensor, axis: int, fill: Any, fn: Callable[[Tensor], Tensor], combine: Callable[[Tensor, Tensor], Tensor] | None = None) -> Tensor:
  """fn over the last dim of the (..., n, n) tensor whose row i is x[:i+1] along axis (fill after it): every prefix at once,
  O(n^2) work per row, as a pair of views and one reduction that fuse. Given combine (the op fn reduces by), a run longer
  than BLOCK goes in blocks of about sqrt(n): within each block, then over the blocks' totals, O(n sqrt(n)) work."""
  if self.ndim == 0: return _running(self.reshape(1), self._axis(axis), fill, fn, combine).reshape(())
  d = self._axis(axis)
  x = self.transpose(d, -1)
  n = x.shape[-1]
  if combine is not None and n > BLOCK:
    b = math.isqrt(n - 1) + 1
    nb, lead = -(-n // b), ((0, 0),) * (x.ndim - 1)
    inner = _running(x.pad(lead + ((0, nb * b - n),), value=fill).reshape(*x.shape[:-1], nb, b), -1, fill, fn).contiguous()
    totals = _running(inner[..., b - 1], -1, fill, fn, combine)
    before = totals.pad(lead + ((1, 0),), value=fill)[..., :nb]  # the total of all the blocks before each one
    return combine(inner, before.unsqueeze(-1)).reshape(*x.shape[:-1], nb * b)[..., :n].transpose(d, -1)
  upto = Tensor.arange(n, device=self.device).reshape(n, 1) >= Tensor.arange(n, device=self.device)
  return fn(upto.where(x.unsqueeze(-2), fill)).transpose(d, -1)


def cumsum(self: Tensor, axis: int = 0) -> Tensor:
  """The running sum along axis (int32, uint8 and bool sum in int64, like torch). O(n min(n, sqrt(n) + BLOCK)) work along axis."""
  return _running(self, axis, 0, lambda t: t.sum(-1), lambda a, b: a + b)


def cumprod(self: Tensor, axis: int = 0) -> Tensor:
  """The running product along axis, O(n log n min(n, sqrt(n) + BLOCK)) work along axis.

  A product tree's backward grows as n^2 terms per element (minutes to compile at n = 300), so where a gradient is wanted the
  value is the exact product and the gradient comes from running sums: out + (s - s.detach()), which adds 0, with s whose
  derivatives are the product's: out * cumsum(log|x|) before any zero (d/dx_j = out / x_j), and from the first zero to the
  second one, that zero times the product of the others (d/dzero = the product of the others; 0 for the rest)."""
  def products(x: Tensor) -> Tensor: return _running(x, axis, 1, lambda t: t.prod(-1), lambda a, b: a * b)
  if not (self.dtype.is_float and tracking(self)): return products(self)
  if deferred(self): return lazily(lambda x: x.cumprod(axis), self)
  zero = self.detach() == 0
  others = products(zero.where(1, self.detach())).contiguous()  # the product of the nonzero elements so far, in memory of its own
  zeros = zero.cumsum(axis)
  out = (zeros == 0).where(others, others * 0)  # 0 past a zero, NaN where that zero meets an inf or a NaN, as a product would be
  s = (zeros == 0).where(out * zero.where(1, self).abs().log().cumsum(axis), (zeros == 1).where(others * zero.where(self, 0).cumsum(axis), 0))
  return out + s.detach().isfinite().where(s - s.detach(), 0)


def cummax(self: Tensor, axis: int = 0) -> tuple[Tensor, Tensor]:
  """(values, indices) of the running max along axis, like torch (and tinygrad): a NaN carries on, and the index (int32 as tinygrad's
  and argmax's, int64 past int32's range) is that of the last occurrence of each running max (of the last NaN, once one came).
  O(n min(n, sqrt(n) + BLOCK)) work along axis for each; the gradient goes to that index: the value is self gathered there, whose
  gradient adds each output's back at that place."""
  def running_max(x: Tensor) -> Tensor: return _running(x, axis, dtypes.min(x.dtype), lambda t: t.max(-1), lambda a, b: a.maximum(b))
  x = self.detach()
  v = running_max(x)
  d = self._axis(axis) if self.ndim else 0
  n = self.shape[d] if self.ndim else 1
  at = Tensor.arange(n, dtype=dtypes.int32 if n < 2**31 else dtypes.int64, device=self.device)
  record = (x == v) | (x.isnan() & v.isnan()) if x.dtype.is_float else x == v  # where a running max is reached (again)
  index = running_max(record.where(at.reshape(tuple(-1 if i == d else 1 for i in range(self.ndim))), 0))
  if not (self.dtype.is_float and tracking(self)): return v, index
  if deferred(self): return lazily(lambda x: x.cummax(axis)[0], self), index
  return self.gather(axis, index), index


def cummin(self: Tensor, axis: int = 0) -> tuple[Tensor, Tensor]:
  """(values, indices) of the running min along axis, like torch: cummax of the order reversed."""
  v, index = self._flip_order().cummax(axis)
  return v._flip_order(), index


def logcumsumexp(self: Tensor, axis: int = 0) -> Tensor:
  """The running logsumexp along axis, each prefix shifted by its own max. O(n^2) work along axis."""
  return _running(self._float(), axis, -math.inf, lambda t: t.logsumexp(-1))


def sort(self: Tensor, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
  """(values, indices) sorted along dim, NaN as the largest value like torch; ties keep their order. By counting comparisons:
  each element's rank is the number of elements before it in the order, O(n^2) work and two reductions along dim."""
  if self.ndim == 0: return self, Tensor(0, dtypes.int32, self.device)
  d = self._axis(dim)
  x = self.transpose(d, -1)
  n = x.shape[-1]
  a, b = x.unsqueeze(-1), x.unsqueeze(-2)  # element i, element j
  pos = Tensor.arange(n, device=self.device)
  if self.dtype.is_float:
    nan_a, nan_b = a != a, b != b
    before = ((b > a) | (nan_b & nan_a.logical_not())) if descending else ((b < a) | (nan_a & nan_b.logical_not()))
    same = (a == b) | (nan_a & nan_b)
  else: before, same = (b > a) if descending else (b < a), a == b
  rank = (before | (same & (pos < pos.reshape(n, 1)))).sum(-1, dtype=dtypes.int32)  # (..., n): where element i goes
  to = rank.unsqueeze(-2) == pos.reshape(n, 1)  # (..., k, i): element i goes to place k
  values = Tensor._pick(to, x.unsqueeze(-2))
  indices = Tensor._pick(to, pos.expand(x.shape).unsqueeze(-2))
  return values.transpose(d, -1), indices.transpose(d, -1)


def argsort(self: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
  """The indices that sort self along dim (int32), see sort."""
  return self.sort(dim, descending)[1]


def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
  """(values, indices) of the k largest (or smallest) along dim, in order; built on sort, O(n^2) along dim."""
  d = self._axis(dim)
  n = self.shape[d] if self.ndim else 1
  if not isinstance(k, int) or not 0 <= k <= n: raise ValueError(f"topk k={k!r} is out of range for dim {d} of size {n}")
  values, indices = self.sort(d, descending=largest)
  if not self.ndim: return values, indices
  keep = tuple((0, k) if i == d else None for i in range(self.ndim))
  return values.shrink(keep), indices.shrink(keep)
