"""Elementwise math: arithmetic, comparisons, select, and the unary functions built from the ALU ops."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tinytune.dtype import dtypes
from tinytune.uop import Ops

if TYPE_CHECKING:
  from tinytune.tensor import Scalar, Tensor, TensorLike


def add(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor: return self._binop(Ops.ADD, y, reverse)
def mul(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor: return self._binop(Ops.MUL, y, reverse)


def sub(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor:
  a, b = self._broadcasted(y, reverse)
  if a.dtype == dtypes.bool: raise TypeError("subtracting bool tensors is not supported; use ^ or logical_not")
  return a + (-b)


def div(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor:
  a, b = self._broadcasted(y, reverse)
  if not a.dtype.is_float: a, b = a.cast(dtypes.float32), b.cast(dtypes.float32)
  return a * b.reciprocal()


def neg(self: Tensor) -> Tensor:
  if self.dtype == dtypes.bool: return self.logical_not()
  return self._alu(Ops.NEG)


def logical_not(self: Tensor) -> Tensor: return self.cast(dtypes.bool)._alu(Ops.CMPNE, self._const_like(True, dtypes.bool))


def _bitwise(self: Tensor, op: Ops, y: TensorLike) -> Tensor:
  a, b = self._broadcasted(y)
  if a.dtype.is_float: raise TypeError(f"bitwise {op.name.lower()} needs bool or int tensors, got {a.dtype.name}")
  return a._alu(op, b)


def _le(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor:
  a, b = self._broadcasted(y, reverse)
  return (b < a).logical_not() if not a.dtype.is_float else (a < b) | (a == b)  # not (b < a) is wrong for NaN


def lt(self: Tensor, y: TensorLike) -> Tensor: return self < y
def eq(self: Tensor, y: TensorLike) -> Tensor: return self == y


def where(self: Tensor, x: TensorLike, y: TensorLike) -> Tensor:
  """self ? x : y, elementwise with broadcasting."""
  if isinstance(x, Tensor): x, y = x._broadcasted(y)
  elif isinstance(y, Tensor): y, x = y._broadcasted(x)
  else: x, y = Tensor(x, device=self.device)._broadcasted(y)
  cond, x = self.cast(dtypes.bool)._broadcasted(x)
  cond, y = cond._broadcasted(y)
  x, y = x._broadcasted(y)
  return cond.cast(dtypes.bool)._alu(Ops.WHERE, x, y)


def maximum(self: Tensor, y: TensorLike) -> Tensor: return self._binop(Ops.MAX, y)


def minimum(self: Tensor, y: TensorLike) -> Tensor:
  a, b = self._broadcasted(y)
  take_b = b < a if not a.dtype.is_float else (b < a) | (b != b)  # a NaN in either wins, like numpy
  return take_b.where(b, a)


def abs(self: Tensor) -> Tensor: return (self < 0).where(-self, self) if self.dtype not in (dtypes.bool, dtypes.uint8) else self
def exp2(self: Tensor) -> Tensor: return self._float()._alu(Ops.EXP2)
def log2(self: Tensor) -> Tensor: return self._float()._alu(Ops.LOG2)
def exp(self: Tensor) -> Tensor: return self._in_f32(lambda x: (x * (1 / math.log(2))).exp2())
def log(self: Tensor) -> Tensor: return self._in_f32(lambda x: x.log2() * math.log(2))
def sqrt(self: Tensor) -> Tensor: return self._float()._alu(Ops.SQRT)
def rsqrt(self: Tensor) -> Tensor: return self.sqrt().reciprocal()
def sin(self: Tensor) -> Tensor: return self._float()._alu(Ops.SIN)
def cos(self: Tensor) -> Tensor: return self._in_f32(lambda x: (math.pi / 2 - x).sin())
def reciprocal(self: Tensor) -> Tensor: return self._float()._alu(Ops.RECIP)
def relu(self: Tensor) -> Tensor: return self.maximum(0)
def sigmoid(self: Tensor) -> Tensor: return self._in_f32(lambda x: (1 + (-x).exp()).reciprocal())
def tanh(self: Tensor) -> Tensor: return self._in_f32(lambda x: 2.0 * (2.0 * x).sigmoid() - 1.0)
def silu(self: Tensor) -> Tensor: return self * self.sigmoid()
def square(self: Tensor) -> Tensor: return self * self
def sign(self: Tensor) -> Tensor: return self if self.dtype == dtypes.bool else (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)


def clip(self: Tensor, min_: Scalar | None = None, max_: Scalar | None = None) -> Tensor:
  if min_ is None and max_ is None: raise ValueError("clip needs min_ or max_")
  ret = self if min_ is None else self.maximum(min_)
  return ret if max_ is None else ret.minimum(max_)


def erf(self: Tensor) -> Tensor: return self._in_f32(_erf)


def gelu(self: Tensor, approximate: str = "none") -> Tensor:
  if approximate == "tanh": return self._in_f32(lambda x: 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh()))
  if approximate != "none": raise ValueError(f"gelu approximate is 'none' or 'tanh', got {approximate!r}")
  return self._in_f32(lambda x: 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf()))


def pow(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor:
  if not reverse and isinstance(y, (int, float)) and not isinstance(y, bool) and math.isfinite(y) and y == int(y):
    base = self if isinstance(y, int) else self._float()  # an int tensor to an int power stays int, like torch
    ret, sq, n = None, base, -int(y) if y < 0 else int(y)
    while n:  # square and multiply: exact for ints, one rounding per multiply for floats
      if n & 1: ret = sq if ret is None else ret * sq
      if n := n >> 1: sq = sq * sq
    ret = base.ones_like() if ret is None else ret
    return ret.reciprocal() if y < 0 else ret
  base, exp = self._broadcasted(y, reverse)
  dt, base, exp = base.dtype, base._float(), exp._float()
  mag = (exp * base.abs().log2()).exp2()
  is_int = exp == exp.cast(dtypes.int64).cast(exp.dtype)
  odd = (exp * 0.5) != (exp * 0.5).cast(dtypes.int64).cast(exp.dtype)
  neg = (base < 0).where(is_int.where(odd.where(-mag, mag), math.nan), mag)
  ret = (exp == 0).where(1.0, neg)
  # int ** int is int, like torch: the float result is within 1/4 of the answer, or under 1/2 in size where it truncates to 0
  return ret if dt.is_float else (ret + ret.sign() * 0.25).cast(dt)


def _erf(x: Tensor) -> Tensor:
  # Abramowitz & Stegun 7.1.26, absolute error under 1.5e-7
  t = 1.0 / (1.0 + 0.3275911 * x.abs())
  poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
  return x.sign() * (1.0 - poly * (-x * x).exp())
