"""Making tensors: constants, ranges and random numbers."""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from tinytune import rng
from tinytune.dtype import dtypes
from tinytune.errors import OpError, OpIndexError
from tinytune.helpers import argfix, prod
from tinytune.runtime import Device

if TYPE_CHECKING:
  from tinytune.tensor import Scalar, Tensor


def _leaf(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
  """fn with torch's and tinygrad's requires_grad= keyword: the tensor it makes is a leaf that requires grad, or not, as asked."""
  @functools.wraps(fn)
  def made(*args: Any, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
    ret = fn(*args, **kwargs)
    return ret if requires_grad is None else ret.requires_grad_(requires_grad)
  return made


def _shape_arg(shape: tuple) -> tuple[int, ...]:
  shape = argfix(*shape)
  if not all(isinstance(s, int) for s in shape): raise ValueError(f"a shape is ints, got {shape}")
  if any(s < 0 for s in shape): raise OpError(f"Dimension size must be non-negative, got {shape}")
  return shape


@_leaf
def full(shape: tuple[int, ...] | int, fill_value: Scalar, dtype: Any = None, device: str | None = None) -> Tensor:
  shape = Tensor._shape_arg(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))
  return Tensor(fill_value, dtype=dtype, device=device).reshape((1,) * len(shape)).expand(shape)


@_leaf
def zeros(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
  return Tensor.full(argfix(*shape), 0.0, dtype or dtypes.default_float, device)


@_leaf
def ones(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
  return Tensor.full(argfix(*shape), 1.0, dtype or dtypes.default_float, device)


@_leaf
def arange(start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: Any = None, device: str | None = None) -> Tensor:
  if stop is None: start, stop = 0, start
  if step == 0: raise OpError("step must be nonzero")
  whole = all(isinstance(x, int) for x in (start, stop, step))
  big = whole and not all(-2**31 <= x < 2**31 for x in (start, stop))  # as torch: ints past int32's range in int64
  dt = dtypes.from_any(dtype) if dtype else (dtypes.int64 if big else dtypes.default_int) if whole else dtypes.default_float
  return Tensor(np.arange(start, stop, step, dtype=dt.np), dtype=dt, device=device)


@_leaf
def eye(n: int, m: int | None = None, dtype: Any = None, device: str | None = None) -> Tensor:
  m = n if m is None else m
  return (Tensor.arange(n, device=device).reshape(n, 1) == Tensor.arange(m, device=device).reshape(1, m)).cast(dtype or dtypes.default_float)


def manual_seed(seed: int = 0) -> None:
  """Restart the random numbers of Tensor.rand and everything built on it at this seed."""
  rng.manual_seed(seed)


@_leaf
def rand(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
  """Uniform numbers in [0, 1), drawn by a kernel (Threefry on a counter, see tinytune.rng) and realized at once."""
  shape, device = Tensor._shape_arg(shape), Device.canonicalize(device)
  bits = Tensor(rng.uniform_bits(prod(shape), device), device=device).reshape(shape)
  return bits.cast(dtype or dtypes.default_float).realize()


@_leaf
def randn(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
  """Standard normal numbers, by the Box-Muller transform of two uniform draws."""
  u = Tensor.rand(2, *Tensor._shape_arg(shape), device=device)
  return ((1 - u[0]).log() * -2).sqrt().mul((u[1] * (2 * math.pi)).cos()).cast(dtype or dtypes.default_float).realize()


@_leaf
def uniform(*shape: Any, low: float = 0.0, high: float = 1.0, dtype: Any = None, device: str | None = None) -> Tensor:
  return (Tensor.rand(*shape, device=device) * (high - low) + low).cast(dtype or dtypes.default_float).realize()


@_leaf
def randint(*shape: Any, low: int = 0, high: int = 10, dtype: Any = None, device: str | None = None) -> Tensor:
  """Integers in [low, high), uniform."""
  if not high > low: raise OpError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
  return ((Tensor.rand(*shape, device=device) * (high - low)).cast(dtypes.int64) + low).cast(dtype or dtypes.default_int).realize()


@_leaf
def full_like(self: Tensor, fill_value: Scalar, dtype: Any = None) -> Tensor:
  return Tensor.full(self.shape, fill_value, dtype or self.dtype, self.device)


@_leaf
def zeros_like(self: Tensor, dtype: Any = None) -> Tensor: return self.full_like(0, dtype)
@_leaf
def ones_like(self: Tensor, dtype: Any = None) -> Tensor: return self.full_like(1, dtype)
@_leaf
def rand_like(self: Tensor, dtype: Any = None) -> Tensor: return Tensor.rand(*self.shape, dtype=dtype or self.dtype, device=self.device)
@_leaf
def randn_like(self: Tensor, dtype: Any = None) -> Tensor: return Tensor.randn(*self.shape, dtype=dtype or self.dtype, device=self.device)


@_leaf
def empty(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
  """A tensor whose values are unspecified (zeros here, lazily: nothing is allocated before it is realized)."""
  return Tensor.zeros(*shape, dtype=dtype, device=device)


@_leaf
def linspace(start: Scalar, stop: Scalar, steps: int, dtype: Any = None, device: str | None = None) -> Tensor:
  """steps evenly spaced values from start to stop, both included: the first half counted from start, the rest from stop."""
  if not isinstance(steps, int): raise TypeError(f"linspace steps is an int, got {steps!r}")
  if steps < 0: raise OpError("number of steps must be non-negative")
  dt = dtypes.from_any(dtype) if dtype else dtypes.default_float
  if dt == dtypes.bool: raise NotImplementedError("linspace of bool is not implemented, as in torch; make it in another dtype and cast")
  ft = dtypes.float64 if dt == dtypes.float64 else dtypes.float32  # computed in float32, or float64 for a float64 result
  if steps <= 1: return Tensor([start] * steps, dtype=ft, device=device).cast(dt)
  i, step = Tensor.arange(steps, device=device).cast(ft), (stop - start) / (steps - 1)
  return (i < steps // 2).where(i * step + start, stop - (steps - 1 - i) * step).cast(dt)


def meshgrid(self: Tensor | Sequence[Tensor], *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
  """Coordinate grids of 1-d tensors: x.meshgrid(y) or Tensor.meshgrid(x, y); indexing 'ij' (matrix) or 'xy' (the first two swapped)."""
  ts: list[Tensor] = [*self, *args] if isinstance(self, (list, tuple)) else [self, *args]  # type: ignore[list-item]
  if indexing not in ("ij", "xy"): raise OpError(f"meshgrid indexing is 'ij' or 'xy', got {indexing!r}")
  if not all(isinstance(t, Tensor) and t.ndim <= 1 for t in ts): raise OpError("meshgrid: Expected 0D or 1D tensors")
  at = list(range(len(ts)))
  if indexing == "xy" and len(ts) > 1: at[0], at[1] = 1, 0
  shape = [0] * len(ts)
  for k, t in zip(at, ts): shape[k] = t.numel()
  return tuple(t.reshape(tuple(t.numel() if i == k else 1 for i in range(len(ts)))).expand(tuple(shape)) for k, t in zip(at, ts))


def _triangle(self: Tensor, keep: Callable[[Tensor], Tensor], what: str) -> Tensor:
  if self.ndim < 2: raise OpError(f"{what}: input tensor must have at least 2 dimensions")
  r, c = self.shape[-2:]
  return keep(Tensor.arange(c, device=self.device) - Tensor.arange(r, device=self.device).reshape(r, 1)).where(self, self.zeros_like())


def tril(self: Tensor, diagonal: int = 0) -> Tensor:
  """The lower triangle of the last two dims, from the diagonal'th diagonal down; zeros above."""
  return _triangle(self, lambda off: off <= diagonal, "tril")


def triu(self: Tensor, diagonal: int = 0) -> Tensor:
  """The upper triangle of the last two dims, from the diagonal'th diagonal up; zeros below."""
  return _triangle(self, lambda off: off >= diagonal, "triu")


def diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
  """The diagonal of dims dim1 and dim2 (offset above it when positive) as a last dim, like torch.diagonal: only views."""
  if self.ndim < 2: raise OpIndexError(f"Dimension out of range (expected to be in range of [-1, 0], but got {dim2})")
  d1, d2 = self._axis(dim1), self._axis(dim2)
  if d1 == d2: raise OpError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
  x = self.permute([i for i in range(self.ndim) if i not in (d1, d2)] + [d1, d2])
  (*lead, a, b), (r0, c0) = x.shape, ((0, offset) if offset >= 0 else (-offset, 0))
  m, keep = max(0, min(a - r0, b - c0)), tuple((0, s) for s in lead)
  if m == 0: return x.shrink(keep + ((0, 0), (0, 0))).reshape(*lead, 0)  # a view still, so it stays on the gradient's tape
  x = x.shrink(keep + ((r0, r0 + m), (c0, c0 + m))).reshape(*lead, m * m)
  return x.pad(((0, 0),) * len(lead) + ((0, m),)).reshape(*lead, m, m + 1).shrink(keep + ((0, m), (0, 1))).reshape(*lead, m)


def diag(self: Tensor, diagonal: int = 0) -> Tensor:
  """A 1-d tensor as the diagonal'th diagonal of a square matrix, or a 2-d tensor's diagonal'th diagonal, like torch.diag."""
  if self.ndim == 2: return self.diagonal(diagonal)
  if self.ndim != 1: raise OpError(f"diag(): Supports 1D or 2D tensors. Got {self.ndim}D")
  n, k = self.shape[0], abs(diagonal)
  square = (Tensor.arange(n, device=self.device).reshape(n, 1) == Tensor.arange(n, device=self.device)).where(self.reshape(n, 1), self.zeros_like())
  return square.pad(((0, k), (k, 0)) if diagonal >= 0 else ((k, 0), (0, k)))


# ***** initializers: random tensors scaled for a layer's fan-in and fan-out (tinygrad's) *****
@_leaf
def normal(*shape: Any, mean: float = 0.0, std: float = 1.0, dtype: Any = None, device: str | None = None) -> Tensor:
  return (Tensor.randn(*shape, device=device) * std + mean).cast(dtype or dtypes.default_float)


@_leaf
def kaiming_uniform(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
  """Uniform in +-sqrt(6 / ((1 + a^2) fan_in)), fan_in the product of all but the first dim (He et al. 2015)."""
  bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(argfix(*shape)[1:]))
  return Tensor.uniform(*shape, low=-bound, high=bound, **kwargs)


@_leaf
def kaiming_normal(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
  """Normal with std sqrt(2 / ((1 + a^2) fan_in)), fan_in the product of all but the first dim."""
  return Tensor.normal(*shape, mean=0.0, std=math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(argfix(*shape)[1:])), **kwargs)


@_leaf
def glorot_uniform(*shape: Any, **kwargs: Any) -> Tensor:
  """Xavier/Glorot: uniform in +-sqrt(6 / (fan_in + fan_out)), fan_out the first dim and fan_in the product of the rest."""
  s = argfix(*shape)
  return Tensor.uniform(*shape, low=-1.0, high=1.0, **kwargs) * math.sqrt(6 / (s[0] + prod(s[1:])))


@_leaf
def scaled_uniform(*shape: Any, **kwargs: Any) -> Tensor:
  """Uniform in +-1 / sqrt(numel)."""
  return Tensor.uniform(*shape, low=-1.0, high=1.0, **kwargs) * prod(argfix(*shape)) ** -0.5
