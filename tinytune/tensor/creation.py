"""Making tensors: constants, ranges and random numbers."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from tinytune import rng
from tinytune.dtype import dtypes
from tinytune.helpers import argfix, prod
from tinytune.runtime import Device

if TYPE_CHECKING:
  from tinytune.tensor import Scalar, Tensor


def _shape_arg(shape: tuple) -> tuple[int, ...]:
  shape = argfix(*shape)
  if not all(isinstance(s, int) and s >= 0 for s in shape): raise ValueError(f"a shape is non-negative ints, got {shape}")
  return shape


def full(shape: tuple[int, ...] | int, fill_value: Scalar, dtype: Any = None, device: str | None = None) -> Tensor:
  shape = Tensor._shape_arg(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))
  return Tensor(fill_value, dtype=dtype, device=device).reshape((1,) * len(shape)).expand(shape)


def zeros(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
  return Tensor.full(argfix(*shape), 0.0, dtype or dtypes.default_float, device)


def ones(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
  return Tensor.full(argfix(*shape), 1.0, dtype or dtypes.default_float, device)


def arange(start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: Any = None, device: str | None = None) -> Tensor:
  if stop is None: start, stop = 0, start
  if step == 0: raise ValueError("arange step must not be zero")
  dt = dtypes.from_any(dtype) if dtype else dtypes.default_int if all(isinstance(x, int) for x in (start, stop, step)) else dtypes.default_float
  return Tensor(np.arange(start, stop, step, dtype=dt.np), dtype=dt, device=device)


def eye(n: int, m: int | None = None, dtype: Any = None, device: str | None = None) -> Tensor:
  m = n if m is None else m
  return (Tensor.arange(n, device=device).reshape(n, 1) == Tensor.arange(m, device=device).reshape(1, m)).cast(dtype or dtypes.default_float)


def manual_seed(seed: int = 0) -> None:
  """Restart the random numbers of Tensor.rand and everything built on it at this seed."""
  rng.manual_seed(seed)


def rand(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
  """Uniform numbers in [0, 1), drawn by a kernel (Threefry on a counter, see tinytune.rng) and realized at once."""
  shape, device = Tensor._shape_arg(shape), Device.canonicalize(device)
  bits = Tensor(rng.uniform_bits(prod(shape), device), device=device).reshape(shape)
  return bits.cast(dtype or dtypes.default_float).realize()


def randn(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
  """Standard normal numbers, by the Box-Muller transform of two uniform draws."""
  u = Tensor.rand(2, *Tensor._shape_arg(shape), device=device)
  return ((1 - u[0]).log() * -2).sqrt().mul((u[1] * (2 * math.pi)).cos()).cast(dtype or dtypes.default_float).realize()


def uniform(*shape: Any, low: float = 0.0, high: float = 1.0, dtype: Any = None, device: str | None = None) -> Tensor:
  return (Tensor.rand(*shape, device=device) * (high - low) + low).cast(dtype or dtypes.default_float).realize()


def randint(*shape: Any, low: int = 0, high: int = 10, dtype: Any = None, device: str | None = None) -> Tensor:
  """Integers in [low, high), uniform."""
  if not high > low: raise ValueError(f"randint needs low < high, got low={low} high={high}")
  return ((Tensor.rand(*shape, device=device) * (high - low)).cast(dtypes.int64) + low).cast(dtype or dtypes.default_int).realize()


def full_like(self: Tensor, fill_value: Scalar, dtype: Any = None) -> Tensor:
  return Tensor.full(self.shape, fill_value, dtype or self.dtype, self.device)


def zeros_like(self: Tensor, dtype: Any = None) -> Tensor: return self.full_like(0, dtype)
def ones_like(self: Tensor, dtype: Any = None) -> Tensor: return self.full_like(1, dtype)
def rand_like(self: Tensor, dtype: Any = None) -> Tensor: return Tensor.rand(*self.shape, dtype=dtype or self.dtype, device=self.device)
def randn_like(self: Tensor, dtype: Any = None) -> Tensor: return Tensor.randn(*self.shape, dtype=dtype or self.dtype, device=self.device)
