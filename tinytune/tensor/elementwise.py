"""Elementwise math: arithmetic, comparisons, select, and the unary functions built from the ALU ops."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tinytune.dtype import dtypes
from tinytune.errors import OpDTypeError, OpError
from tinytune.tensor import autograd
from tinytune.tensor.checks import require
from tinytune.uop import Ops, UOp

if TYPE_CHECKING:
  from tinytune.tensor import Tensor, TensorLike


def add(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor: return self._binop(Ops.ADD, y, reverse)
def mul(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor: return self._binop(Ops.MUL, y, reverse)


def sub(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor:
  a, b = self._broadcasted(y, reverse)
  if a.dtype == dtypes.bool: raise TypeError("subtracting bool tensors is not supported; use ^ or logical_not")
  return a + (-b)


def div(self: Tensor, y: TensorLike, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
  """self / y; rounding_mode "trunc" rounds the quotient toward zero and "floor" down, keeping int dtypes (an int divided by 0
  raises, as in torch: see _int_div)."""
  if rounding_mode not in (None, "trunc", "floor"): raise OpError(f"div rounding_mode is None, 'trunc' or 'floor', got {rounding_mode!r}")
  a, b = self._broadcasted(y, reverse)
  if rounding_mode is not None and not a.dtype.is_float:
    if a.dtype == dtypes.bool: raise TypeError(f"div with rounding_mode {rounding_mode!r} needs int or float tensors, got bool")
    return _int_div(a, b, rounding_mode == "floor")[0]
  if not a.dtype.is_float: a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
  if rounding_mode == "floor": return a._in_f32(lambda x: _floor_div(x, b.cast(x.dtype)))
  q = a * b.reciprocal()
  return q if rounding_mode is None else q.trunc()


def idiv(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor:
  """Integer division rounded toward zero (tinygrad's name for div(y, rounding_mode="trunc"))."""
  return self.div(y, reverse, rounding_mode="trunc")


def _int_div(a: Tensor, b: Tensor, floor: bool) -> tuple[Tensor, Tensor]:
  """(quotient, remainder) of ints rounded toward zero or down. IDIV and MOD only see operands >= 0, where every rounding agrees.
  A zero divisor raises RuntimeError as torch's does (at the call, or at the next realize where b is lazy: see tinytune.tensor.checks)."""
  require(b, lambda v: v == 0, lambda v: RuntimeError("ZeroDivisionError"))
  an, bn = a.abs(), (b == 0).where(1, b.abs())  # a zero divisor would trap on the CPU
  q, r = an._alu(Ops.IDIV, bn), an._alu(Ops.MOD, bn)
  if a.dtype.is_unsigned: return q, r
  opposite, neg_a = (a < 0) != (b < 0), a < 0
  if not floor: return opposite.where(-q, q), neg_a.where(-r, r)
  inexact = opposite & (r != 0)  # floor goes one further from zero; the remainder takes the divisor's sign
  return inexact.where(-q - 1, opposite.where(-q, q)), inexact.where(b.abs() - r, r) * (b < 0).where(-1, 1)


def neg(self: Tensor) -> Tensor:
  if self.dtype == dtypes.bool: return self.logical_not()
  return self._alu(Ops.NEG)


def logical_not(self: Tensor) -> Tensor: return self.cast(dtypes.bool)._alu(Ops.CMPNE, self._const_like(True, dtypes.bool))


def _bitwise(self: Tensor, op: Ops, y: TensorLike) -> Tensor:
  a, b = self._broadcasted(y)
  if a.dtype.is_float: raise OpDTypeError(f"bitwise {op.name.lower()} needs bool or int tensors, got {a.dtype.name}")
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


def _ruled(inputs: Sequence[Tensor], value: Callable[..., Tensor], rule: Callable[..., Sequence[Tensor | None]]) -> Tensor:
  """value(*inputs), differentiated by rule(g, out, *inputs) instead of through value's composition: PyTorch's slopes at the kinks
  (relu at 0, clip's bounds, ties) and finite ones where the composition's chain rule overflows (sigmoid and tanh far out)."""
  if not autograd.tracking(*inputs): return value(*inputs)
  out = value(*(t.detach() for t in inputs))
  return autograd.record(out, tuple(inputs), lambda g: rule(g, out, *inputs))


def maximum(self: Tensor, y: TensorLike) -> Tensor: return self._binop(Ops.MAX, y)


def minimum(self: Tensor, y: TensorLike) -> Tensor:
  def value(a: Tensor, b: Tensor) -> Tensor:
    take_b = b < a if not a.dtype.is_float else (b < a) | (b != b)  # a NaN in either wins, like numpy
    return take_b.where(b, a)
  def rule(g: Tensor, out: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:  # ties share the gradient evenly, as torch does
    share = (a < b).where(1.0, (a == b).where(0.5, 0.0)).cast(g.dtype)
    return g * share, g * (1 - share)
  return _ruled(self._broadcasted(y), value, rule)


def abs(self: Tensor) -> Tensor:
  if self.dtype.kind not in "if": return self
  return _ruled((self,), lambda x: (x < 0).where(-x, x), lambda g, out, x: (g * x.sign(),))
def exp2(self: Tensor) -> Tensor: return self._float()._alu(Ops.EXP2)
def log2(self: Tensor) -> Tensor: return self._float()._alu(Ops.LOG2)
def exp(self: Tensor) -> Tensor: return self._in_f32(lambda x: (x * (1 / math.log(2))).exp2())
def log(self: Tensor) -> Tensor: return self._in_f32(lambda x: x.log2() * math.log(2))
def sqrt(self: Tensor) -> Tensor: return self._float()._alu(Ops.SQRT)
def rsqrt(self: Tensor) -> Tensor: return self.sqrt().reciprocal()
def sin(self: Tensor) -> Tensor: return self._float()._alu(Ops.SIN)
def cos(self: Tensor) -> Tensor: return self._in_f32(lambda x: (math.pi / 2 - x).sin())
def reciprocal(self: Tensor) -> Tensor: return self._float()._alu(Ops.RECIP)
def relu(self: Tensor) -> Tensor: return _ruled((self,), lambda x: x.maximum(0), lambda g, out, x: ((x > 0).where(g, 0.0),))
def sigmoid(self: Tensor) -> Tensor:
  return _ruled((self,), lambda x: x._in_f32(lambda v: (1 + (-v).exp()).reciprocal()), lambda g, out, x: (g * out * (1 - out),))
def tanh(self: Tensor) -> Tensor:
  return _ruled((self,), lambda x: x._in_f32(lambda v: 2.0 * (2.0 * v).sigmoid() - 1.0), lambda g, out, x: (g * (1 - out * out),))
def silu(self: Tensor) -> Tensor: return self._scaled_silu(1.0)
def _scaled_silu(self: Tensor, k: float) -> Tensor:
  """x * sigmoid(k * x), its slope s + k x s (1 - s) from s = sigmoid(k x): 0 or 1 far out, where the chain rule meets inf * 0."""
  def rule(g: Tensor, out: Tensor, x: Tensor) -> tuple[Tensor]:
    s = (x * k).sigmoid()
    return (g * (s + x * k * s * (1 - s)),)
  return _ruled((self,), lambda x: x * (x * k).sigmoid(), rule)
def square(self: Tensor) -> Tensor: return self * self
def sign(self: Tensor) -> Tensor:
  if self.dtype == dtypes.bool: return self
  return _ruled((self,), lambda x: (x > 0).cast(x.dtype) - (x < 0).cast(x.dtype), lambda g, out, x: (None,))


def clip(self: Tensor, min_: TensorLike | None = None, max_: TensorLike | None = None) -> Tensor:
  """Bound self below by min_ and above by max_ (max_ wins where min_ > max_); one may be None, not both (torch and tinygrad refuse that too)."""
  if min_ is None and max_ is None: raise OpError("clip needs min_ or max_")
  return _bounded(self, min_, max_, False)


def _bounded(self: Tensor, lo: TensorLike | None, hi: TensorLike | None, open_: bool) -> Tensor:
  """self between lo and hi (None: unbounded), hi winning where lo > hi. The gradient goes to self inside the bounds, with them
  (clamp) or without them (open_: hardtanh), else to the bound that won, as torch's clamp and hardtanh do."""
  x = self if lo is None else self._broadcasted(lo)[0]
  x = x if hi is None else x._broadcasted(hi)[0]
  lo_t = None if lo is None else x._broadcasted(lo)[1]
  hi_t = None if hi is None else x._broadcasted(hi)[1]
  bounds = [t for t in (lo_t, hi_t) if t is not None]
  def value(v: Tensor, *b: Tensor) -> Tensor:
    it = iter(b)
    ret = v if lo_t is None else v.maximum(next(it))
    return ret if hi_t is None else ret.minimum(next(it))
  def rule(g: Tensor, out: Tensor, v: Tensor, *b: Tensor) -> list[Tensor | None]:
    it = iter(b)
    lo_v, hi_v = (None if lo_t is None else next(it)), (None if hi_t is None else next(it))
    inside = v._const_like(True, dtypes.bool)
    if lo_v is not None: inside = inside & ((v > lo_v) if open_ else (v >= lo_v))
    if hi_v is not None: inside = inside & ((v < hi_v) if open_ else (v <= hi_v))
    ret: list[Tensor | None] = [inside.where(g, 0.0)]
    upper_won = (v > hi_v) | (lo_v > hi_v) if hi_v is not None and lo_v is not None else None
    if lo_v is not None: ret.append(((v < lo_v) & (upper_won.logical_not() if upper_won is not None else True)).where(g, 0.0))
    if hi_v is not None: ret.append((upper_won if upper_won is not None else v > hi_v).where(g, 0.0))
    return ret
  return _ruled((x, *bounds), value, rule)


def erf(self: Tensor) -> Tensor:
  return _ruled((self,), lambda x: x._in_f32(_erf), lambda g, out, x: (g * (2 / math.sqrt(math.pi)) * (-x * x).exp(),))


def gelu(self: Tensor, approximate: str = "none") -> Tensor:
  if approximate == "tanh": return self._in_f32(lambda x: 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh()))
  if approximate != "none": raise OpError(f"gelu approximate is 'none' or 'tanh', got {approximate!r}")
  return self._in_f32(lambda x: 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf()))


def pow(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor:
  if not reverse and isinstance(y, (int, float)) and not isinstance(y, bool) and math.isfinite(y) and y == int(y):
    base = self if isinstance(y, int) else self._float()  # an int tensor to an int power stays int, like torch
    if y < 0 and not base.dtype.is_float: raise RuntimeError("Integers to negative integer powers are not allowed.")
    ret, sq, n = None, base, -int(y) if y < 0 else int(y)
    while n:  # square and multiply: exact for ints, one rounding per multiply for floats
      if n & 1: ret = sq if ret is None else ret * sq
      if n := n >> 1: sq = sq * sq
    ret = base.ones_like() if ret is None else ret
    return ret.reciprocal() if y < 0 else ret
  base, exp = self._broadcasted(y, reverse)
  dt, base, exp = base.dtype, base._float(), exp._float()
  def rule(g: Tensor, out: Tensor, b: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:  # torch's: 0 for a 0 exponent, and for 0 ** e >= 0
    return (e == 0).where(0.0, g * e * _float_pow(b, e - 1)), ((b == 0) & (e >= 0)).where(0.0, g * out * b.log())
  ret = _ruled((base, exp), _float_pow, rule)
  # int ** int is int, like torch: the float result is within 1/4 of the answer, or under 1/2 in size where it truncates to 0
  return ret if dt.is_float else (ret + ret.sign() * 0.25).cast(dt)


def _float_pow(base: Tensor, exp: Tensor) -> Tensor:
  """base ** exp of floats: a negative base to a whole power keeps its sign, to any other power is NaN; x ** 0 is 1."""
  mag = (exp * base.abs().log2()).exp2()
  is_int = exp == exp.cast(dtypes.int64).cast(exp.dtype)
  odd = (exp * 0.5) != (exp * 0.5).cast(dtypes.int64).cast(exp.dtype)
  neg = (base < 0).where(is_int.where(odd.where(-mag, mag), (base == -math.inf).where(mag, math.nan)), mag)  # -inf ** y: IEEE's, no NaN
  return (exp == 0).where(1.0, neg)


def _erf(x: Tensor) -> Tensor:
  # Abramowitz & Stegun 7.1.26, absolute error under 1.5e-7
  t = 1.0 / (1.0 + 0.3275911 * x.abs())
  poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
  return x.sign() * (1.0 - poly * (-x * x).exp())


# ***** rounding, remainders and tests of value *****
def trunc(self: Tensor) -> Tensor:
  """Round toward zero; an int tensor is already whole and comes back as it is."""
  if not self.dtype.is_float: return self
  def fn(x: Tensor) -> Tensor:  # from 2**23 (2**52 in float64) up floats are whole
    whole = x.dtype.itemsize * 8 - (12 if x.dtype == dtypes.float64 else 9)
    return (x.abs() < 2.0 ** whole).where(x.cast(dtypes.int64 if x.dtype == dtypes.float64 else dtypes.int32).cast(x.dtype), x)
  return self._in_f32(fn)


def floor(self: Tensor) -> Tensor:
  if not self.dtype.is_float: return self
  return self._in_f32(lambda x: (x < (t := x.trunc())).where(t - 1, t))


def ceil(self: Tensor) -> Tensor:
  if not self.dtype.is_float: return self
  return self._in_f32(lambda x: (x > (t := x.trunc())).where(t + 1, t))


def round(self: Tensor) -> Tensor:
  """Round to the nearest whole number, halves to the even one (like torch and numpy)."""
  if not self.dtype.is_float: return self
  def fn(x: Tensor) -> Tensor:
    f = x.floor()
    d, odd = x - f, (f * 0.5).floor() * 2 != f  # x - floor(x) is exact
    return ((d > 0.5) | ((d == 0.5) & odd)).where(f + 1, f)
  return self._in_f32(fn)


def fmod(self: Tensor, y: TensorLike) -> Tensor:
  """The remainder of self / y rounded toward zero: it has self's sign (C's fmod, torch.fmod)."""
  a, b = _numeric(self, y, "fmod")
  if not a.dtype.is_float: return _int_div(a, b, False)[1]
  return a._in_f32(lambda x: _fmod(x, b.cast(x.dtype)))


def mod(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor:
  """The remainder of self / y rounded down: it has y's sign (Python's %, torch.remainder)."""
  a, b = _numeric(self, y, "mod", reverse)
  if not a.dtype.is_float: return _int_div(a, b, True)[1]
  return a._in_f32(lambda x: _floor_mod(x, b.cast(x.dtype)))


def _fmod(x: Tensor, y: Tensor) -> Tensor:
  q = (x / y).trunc()
  return x - (q == 0).where(0.0, q * y)  # so that x fmod inf is x, not NaN


def _floor_mod(x: Tensor, y: Tensor) -> Tensor:
  """x mod y for floats, from fmod as torch does: a remainder of the other sign than y moves by y."""
  r = _fmod(x, y)
  return ((r != 0) & ((y < 0) != (r < 0))).where(r + y, r)


def _floor_div(x: Tensor, y: Tensor) -> Tensor:
  """floor(x / y) for floats as torch computes it: (x - fmod(x, y)) / y is near a whole number, which is then rounded to it."""
  r = _fmod(x, y)
  q = (x - r) / y
  q = ((r != 0) & ((y < 0) != (r < 0))).where(q - 1, q)
  f = q.floor()
  return (y == 0).where(x / y, (q - f > 0.5).where(f + 1, f))


def _numeric(self: Tensor, y: TensorLike, what: str, reverse: bool = False) -> tuple[Tensor, Tensor]:
  a, b = self._broadcasted(y, reverse)
  if a.dtype == dtypes.bool: raise TypeError(f"{what} needs int or float tensors, got bool")
  return a, b


def isnan(self: Tensor) -> Tensor: return self != self


def isinf(self: Tensor, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
  if not self.dtype.is_float: return self._const_like(False, dtypes.bool)
  return ((self == math.inf) & detect_positive) | ((self == -math.inf) & detect_negative)


def isfinite(self: Tensor) -> Tensor: return (self.isinf() | self.isnan()).logical_not()


def isclose(self: Tensor, other: TensorLike, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
  """|self - other| <= atol + rtol * |other| where both are finite; equal infinities are close; NaNs only with equal_nan."""
  a, b = self._broadcasted(other)
  if not a.dtype.is_float: a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
  err = (a - b).abs()
  ret = (a == b) | (err.isfinite() & (err <= atol + rtol * b.abs()))
  return ret | (a.isnan() & b.isnan()) if equal_nan else ret


# a float's bits as the signed integer of its size. Sign bits are read and set on these bits, never by float ops: a GPU's negation of
# a NaN and its float16 -> float32 conversion may give a NaN of either sign (an H200 lost them in float64 and float16 copysign)
_BITS = {8: dtypes.int64, 4: dtypes.int32, 2: dtypes.int16}


def signbit(self: Tensor) -> Tensor:
  """Whether the sign bit is set: true for -0.0 and a NaN with its sign bit, read through bitcast."""
  if not self.dtype.is_float: return self < 0 if self.dtype.kind == "i" else self._const_like(False, dtypes.bool)
  return self.bitcast(_BITS[self.dtype.itemsize]) < 0


def copysign(self: Tensor, other: TensorLike) -> Tensor:
  """The magnitude of self with the sign bit of other, in float: -0.0 and NaNs give their sign bits, as in torch."""
  a, b = self._broadcasted(other)
  a, b = a._float(), b._float()
  def value(x: Tensor, y: Tensor) -> Tensor:
    bits, sign = _BITS[x.dtype.itemsize], -(1 << (8 * x.dtype.itemsize - 1))
    return ((x.bitcast(bits) & ~sign) | (y.bitcast(bits) & sign)).bitcast(x.dtype)
  return _ruled((a, b), value, lambda g, out, x, y: ((x == 0).where(0.0, g * out / x), None))


def lerp(self: Tensor, end: TensorLike, weight: TensorLike) -> Tensor:
  """self + weight * (end - self), computed from the nearer end so that weight 1 gives end exactly (as torch does)."""
  a, b = self._broadcasted(end)
  w = weight if isinstance(weight, Tensor) else a._const_like(weight)
  return (w.abs() < 0.5).where(a + w * (b - a), b - (b - a) * (1 - w))


# ***** casts *****
def float_(self: Tensor) -> Tensor: return self.cast(dtypes.float32)
def half(self: Tensor) -> Tensor: return self.cast(dtypes.float16)
def bfloat16(self: Tensor) -> Tensor: return self.cast(dtypes.bfloat16)
def double(self: Tensor) -> Tensor: return self.cast(dtypes.float64)
def int_(self: Tensor) -> Tensor: return self.cast(dtypes.int32)
def long(self: Tensor) -> Tensor: return self.cast(dtypes.int64)
def short(self: Tensor) -> Tensor: return self.cast(dtypes.int16)
def char(self: Tensor) -> Tensor: return self.cast(dtypes.int8)
def byte(self: Tensor) -> Tensor: return self.cast(dtypes.uint8)
def bool_(self: Tensor) -> Tensor: return self.cast(dtypes.bool)


def bitcast(self: Tensor, dtype: Any) -> Tensor:
  """The same bits read as `dtype`, of the same size (a BITCAST in the IR); no gradient flows through it."""
  dt = dtypes.from_any(dtype)
  if dt.itemsize != self.dtype.itemsize: raise ValueError(f"bitcast from {self.dtype.name} to {dt.name} changes the item size; cast instead")
  if dtypes.bool in (dt, self.dtype): raise TypeError("bitcast of bool has no defined bits; cast to or from uint8 instead")
  if dt == self.dtype: return self
  return Tensor(UOp(Ops.BITCAST, dt, (self.uop,)), device=self.device)


# ***** bits *****
def bitwise_and(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor: return self._bitwise(Ops.AND, y)  # all three commute
def bitwise_or(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor: return self._bitwise(Ops.OR, y)
def bitwise_xor(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor: return self._bitwise(Ops.XOR, y)


def bitwise_not(self: Tensor) -> Tensor:
  if self.dtype.is_float: raise OpDTypeError(f"bitwise_not needs a bool or int tensor, got {self.dtype.name}")
  return self.logical_not() if self.dtype == dtypes.bool else self ^ -1  # -1 is all ones in every int type


def lshift(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor:
  """self * 2**y for ints, wrapping like C; a shift below 0 or from the bit width up gives 0, as torch's does."""
  a, b = _shift_args(self, y, reverse, "<<")
  return _in_width(b).where(a * _pow2(b), 0).cast(a.dtype)


def rshift(self: Tensor, y: TensorLike, reverse: bool = False) -> Tensor:
  """self // 2**y for ints (an arithmetic shift: negative numbers round down); a shift below 0 or from the bit width up gives
  0, or -1 for a negative number shifted right by the width or more, as torch's does."""
  a, b = _shift_args(self, y, reverse, ">>")
  if a.dtype.is_unsigned: return _in_width(b).where(a._alu(Ops.IDIV, _pow2(b)), 0).cast(a.dtype)  # C's division of ints >= 0 is floor division
  if a.dtype == dtypes.int64: ret = _int_div(a, _pow2(b), True)[0]
  else: ret = _int_div(a.cast(dtypes.int64), _pow2(b.cast(dtypes.int64)), True)[0].cast(a.dtype)  # 2**31 fits in int64
  return _in_width(b).where(ret, (b < 0).where(0, (a < 0).where(-1, 0))).cast(a.dtype)


def _in_width(n: Tensor) -> Tensor: return (n >= 0) & (n < n.dtype.itemsize * 8)


def _shift_args(self: Tensor, y: TensorLike, reverse: bool, op: str) -> tuple[Tensor, Tensor]:
  a, b = self._broadcasted(y, reverse)
  if not a.dtype.is_int: raise OpDTypeError(f"{op} needs int tensors, got {a.dtype.name}")
  return a, b


def _pow2(n: Tensor) -> Tensor:
  """2**n for an int tensor n >= 0, from the bits of n (exp2 in float is not exact on every device)."""
  ret = n._const_like(1)
  for k in range(max(n.dtype.itemsize * 8 - 1, 1).bit_length()):
    ret = ret * ((n & (1 << k)) != 0).where(n._const_like(1 << (1 << k)), 1)
  return ret


# ***** trigonometric and hyperbolic functions *****
# A where() picks one branch, but a gradient goes back through both (times 0): an unpicked branch is fed safe values, for 0 * inf is NaN.
def tan(self: Tensor) -> Tensor: return self._in_f32(lambda x: x.sin() / x.cos())


def atan(self: Tensor) -> Tensor:
  """Reduced to |x| <= tan(pi/8) by atan(x) = pi/4 + atan((x-1)/(x+1)) and pi/2 - atan(1/x), then a degree 9 odd polynomial (Cephes' atanf)."""
  def fn(x: Tensor) -> Tensor:
    ax = (x < 0).where(-x, x)  # not abs(): its slope at 0 is 0, this one's 1, which the reflection below turns into atan's
    big, mid = ax > 2.414213562373095, ax > 0.4142135623730950
    base = big.where(math.pi / 2, mid.where(math.pi / 4, 0.0))
    r = big.where(-big.where(ax, 1.0).reciprocal(), mid.where((ax - 1) / (ax + 1), ax))
    z = r * r
    ret = base + r + r * z * (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1)
    return (x < 0).where(-ret, ret)
  return self._in_f32(fn)


def asin(self: Tensor) -> Tensor: return self._in_f32(lambda x: (x / ((1 - x) * (1 + x)).sqrt()).atan())  # +-1 divide to +-inf: +-pi/2
def acos(self: Tensor) -> Tensor: return self._in_f32(lambda x: 2 * ((1 - x) / (1 + x)).sqrt().atan())  # no cancellation near x = 1
def sinh(self: Tensor) -> Tensor: return self._in_f32(lambda x: (x - math.log(2)).exp() - (-x - math.log(2)).exp())  # e**x / 2 overflows later
def cosh(self: Tensor) -> Tensor: return self._in_f32(lambda x: (x - math.log(2)).exp() + (-x - math.log(2)).exp())


def asinh(self: Tensor) -> Tensor:
  def fn(x: Tensor) -> Tensor:
    ax = (x < 0).where(-x, x)  # as in atan
    big = ax > 2.0 ** 28  # where x*x would overflow, log(2|x|) is the answer in float32
    small = big.where(1.0, ax)
    ret = big.where(big.where(ax, 1.0).log() + math.log(2), (small + (small * small + 1).sqrt()).log())
    return (x < 0).where(-ret, ret)
  return self._in_f32(fn)


def acosh(self: Tensor) -> Tensor:
  def fn(x: Tensor) -> Tensor:
    big = x > 2.0 ** 28
    small = big.where(2.0, x)
    return big.where(big.where(x, 1.0).log() + math.log(2), (small + (small - 1).sqrt() * (small + 1).sqrt()).log())
  # torch's slope 1/sqrt(x*x - 1) is finite below -1, where the value is NaN and the composition's chain rule meets it
  return _ruled((self,), lambda x: x._in_f32(fn), lambda g, out, x: (g * (x._float() * x._float() - 1).rsqrt(),))


def atanh(self: Tensor) -> Tensor: return self._in_f32(lambda x: 0.5 * ((1 + x) / (1 - x)).log())
def log10(self: Tensor) -> Tensor: return self._in_f32(lambda x: x.log2() * math.log10(2))


def logaddexp(self: Tensor, other: TensorLike) -> Tensor:
  """log(exp(self) + exp(other)) as m + log(exp(self - m) + exp(other - m)) with m the larger one: nothing overflows, and the gradient is
  the softmax of the two whichever m is; an infinite m is left out, since inf - inf is NaN."""
  a, b = self._broadcasted(other)
  def fn(x: Tensor) -> Tensor:
    y = b.cast(x.dtype)
    m = x.maximum(y)
    m = m.isfinite().where(m, 0.0)
    return m + ((x - m).exp() + (y - m).exp()).log()
  return a._in_f32(fn)


# ***** activations *****
def elu(self: Tensor, alpha: float = 1.0) -> Tensor: return self._in_f32(lambda x: _exp_linear(x, alpha))
def selu(self: Tensor, alpha: float = 1.6732632423543772, gamma: float = 1.0507009873554805) -> Tensor: return self.elu(alpha) * gamma


def celu(self: Tensor, alpha: float = 1.0) -> Tensor:
  if alpha == 0: raise ValueError("celu alpha must not be 0")
  return self._in_f32(lambda x: _exp_linear(x * (1 / alpha), alpha, x))


def _exp_linear(x: Tensor, alpha: float, linear: Tensor | None = None) -> Tensor:
  """linear (x itself by default) where x > 0, else alpha * (exp(x) - 1); exp sees 0 where x > 0, so large x stay finite."""
  pos = x > 0
  return pos.where(x if linear is None else linear, alpha * (pos.where(0.0, x).exp() - 1))


def softplus(self: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
  """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold (torch's cut-off)."""
  return self._in_f32(lambda x: (x * beta > threshold).where(x, (x * beta).logaddexp(0.0) * (1 / beta)))


def logsigmoid(self: Tensor) -> Tensor: return self._in_f32(lambda x: -(-x).logaddexp(0.0))
def mish(self: Tensor) -> Tensor: return self._in_f32(lambda x: x * x.softplus().tanh())
def softsign(self: Tensor) -> Tensor: return self._in_f32(lambda x: x / (1 + x.abs()))
def hardsigmoid(self: Tensor, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor: return _bounded(self._float() * alpha + beta, 0, 1, True)
def hardswish(self: Tensor) -> Tensor:
  def rule(g: Tensor, out: Tensor, x: Tensor) -> tuple[Tensor]: return ((x <= -3).where(0.0, (x < 3).where(g * (x * (1 / 3) + 0.5), g)),)
  return _ruled((self,), lambda x: x._in_f32(lambda v: v * (v + 3).clip(0, 6) * (1 / 6)), rule)
def hardtanh(self: Tensor, min_val: float = -1, max_val: float = 1) -> Tensor: return _bounded(self, min_val, max_val, True)
def relu6(self: Tensor) -> Tensor: return self.hardtanh(0, 6)
def leaky_relu(self: Tensor, neg_slope: float = 0.01) -> Tensor:
  return _ruled((self,), lambda x: (x < 0).where(x * neg_slope, x), lambda g, out, x: ((x > 0).where(g, g * neg_slope),))
def quick_gelu(self: Tensor) -> Tensor: return self._scaled_silu(1.702)
def swish(self: Tensor) -> Tensor: return self.silu()
def softmin(self: Tensor, axis: int = -1) -> Tensor: return (-self._float()).softmax(axis)


def normalize(self: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
  """self / max(norm_p(self along dim), eps), torch.nn.functional.normalize."""
  if not p > 0: raise ValueError(f"normalize p is a number > 0 or math.inf, got {p!r}")
  def fn(x: Tensor) -> Tensor:
    ax = x.abs()
    if p == math.inf: norm = ax.max(dim, keepdim=True)
    elif p == 2: norm = (x * x).sum(dim, keepdim=True).sqrt()
    elif p == 1: norm = ax.sum(dim, keepdim=True)
    else: norm = (ax ** p).sum(dim, keepdim=True) ** (1 / p)
    return x / norm.maximum(eps)
  return self._in_f32(fn)
