"""Tensor ops one by one against NumPy (and torch where NumPy has no such op): unary, binary, comparisons, casts, reductions,
movement, and the regression tests of bugs outside tensor.py. Every buffer gets canary bytes on both sides (ops_support.oob_guard),
so a kernel that writes out of bounds fails its test, and one that reads out of bounds reads 3.4e38."""
from __future__ import annotations

import math
import operator
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from ops_support import (
  FUZZ,
  GETITEM_CASES,
  _axes,
  _axis_arg,
  _idx_code,
  _index_for,
  check,
  examples,
  oob_guard,  # noqa: F401  (autouse: canary bytes around every buffer)
  rand,
)

from tinytune import Tensor, dtypes
from tinytune.dtype import DType, least_upper

# ***** deterministic tests, op by op *****


F16 = dict(rtol=2e-3, atol=2e-3)
BF16 = dict(rtol=2e-2, atol=2e-2)  # 8 significant bits to float16's 11
TOL16 = {dtypes.float16: F16, dtypes.bfloat16: BF16}

# name -> (tinytune, numpy, (lo, hi) of the inputs)
UNARY_OPS: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray], tuple[float, float]]] = {
  "neg": (lambda t: -t, np.negative, (-3, 3)),
  "abs": (lambda t: t.abs(), np.abs, (-3, 3)),
  "exp": (lambda t: t.exp(), np.exp, (-5, 5)),
  "exp2": (lambda t: t.exp2(), np.exp2, (-5, 5)),
  "log": (lambda t: t.log(), np.log, (0.01, 10)),
  "log2": (lambda t: t.log2(), np.log2, (0.01, 10)),
  "sqrt": (lambda t: t.sqrt(), np.sqrt, (0, 10)),
  "rsqrt": (lambda t: t.rsqrt(), lambda a: 1 / np.sqrt(a), (0.1, 10)),
  "sin": (lambda t: t.sin(), np.sin, (-10, 10)),
  "cos": (lambda t: t.cos(), np.cos, (-10, 10)),
  "reciprocal": (lambda t: t.reciprocal(), np.reciprocal, (0.2, 5)),
  "relu": (lambda t: t.relu(), lambda a: np.maximum(a, 0), (-3, 3)),
  "sigmoid": (lambda t: t.sigmoid(), lambda a: 1 / (1 + np.exp(-a)), (-10, 10)),
  "tanh": (lambda t: t.tanh(), np.tanh, (-5, 5)),
  "silu": (lambda t: t.silu(), lambda a: a / (1 + np.exp(-a)), (-6, 6)),
  "gelu": (lambda t: t.gelu(), lambda a: 0.5 * a * (1 + np.vectorize(math.erf)(a / math.sqrt(2))), (-5, 5)),
  "gelu_tanh": (lambda t: t.gelu("tanh"), lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))), (-5, 5)),
  "erf": (lambda t: t.erf(), np.vectorize(math.erf), (-3, 3)),
  "square": (lambda t: t.square(), np.square, (-3, 3)),
  "sign": (lambda t: t.sign(), np.sign, (-3, 3)),
  "clip": (lambda t: t.clip(-1, 0.5), lambda a: np.clip(a, -1, 0.5), (-3, 3)),
  "clip_min": (lambda t: t.clip(0.25), lambda a: np.maximum(a, 0.25), (-3, 3)),
  "clip_max": (lambda t: t.clip(max_=0.25), lambda a: np.minimum(a, 0.25), (-3, 3)),
}


@pytest.mark.usefixtures("each_device")  # also on the devices with workgroups
@pytest.mark.parametrize("name", sorted(UNARY_OPS))
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16])
def test_unary(name: str, dtype: DType) -> None:
  fn, ref, (lo, hi) = UNARY_OPS[name]
  a = rand(3, 17, lo=lo, hi=hi).astype(dtype.np)
  a[0, :3] = [lo, hi, (lo + hi) / 2]
  tol = TOL16.get(dtype, dict(rtol=2e-5, atol=2e-6))
  check(fn(Tensor(a)), ref(a.astype(np.float64)), dtype, **tol)


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "sin", "sigmoid", "reciprocal", "rsqrt"])
def test_unary_int_input_gives_float32(name: str) -> None:
  fn, ref, _ = UNARY_OPS[name]
  a = np.array([1, 2, 3, 4], np.int32)
  check(fn(Tensor(a)), ref(a.astype(np.float64)), dtypes.float32, rtol=2e-6)


@pytest.mark.parametrize("name,dtype", [("neg", dtypes.int32), ("abs", dtypes.int32), ("relu", dtypes.int64), ("square", dtypes.int32),
                                        ("sign", dtypes.int64), ("abs", dtypes.uint8), ("clip", dtypes.int32)])
def test_unary_keeps_int_dtype(name: str, dtype: DType) -> None:
  a = np.array([-7, -1, 0, 1, 5] if dtype != dtypes.uint8 else [0, 1, 5, 200, 255], dtype.np)
  fn = {"clip": lambda t: t.clip(-2, 3)}.get(name, UNARY_OPS[name][0])
  ref = {"clip": lambda x: np.clip(x, -2, 3)}.get(name, UNARY_OPS[name][1])
  check(fn(Tensor(a)), ref(a).astype(dtype.np), dtype)


def test_unary_special_values() -> None:
  check(Tensor([0.0, -1.0, 1.0, np.inf]).log(), [-np.inf, np.nan, 0.0, np.inf])
  check(Tensor([0.0, -1.0, 4.0, np.inf]).sqrt(), [0.0, np.nan, 2.0, np.inf])
  check(Tensor([0.0, -0.0, 4.0]).reciprocal(), [np.inf, -np.inf, 0.25])
  check(Tensor([-200.0, 200.0, 0.0]).exp(), [0.0, np.inf, 1.0])
  check(Tensor([-200.0, 200.0]).sigmoid(), [0.0, 1.0])
  check(Tensor([-200.0, 200.0]).tanh(), [-1.0, 1.0])
  check(Tensor([1e4, -1e4, 1e5]).sin(), np.sin(np.array([1e4, -1e4, 1e5], np.float32)), atol=1e-5)



# ***** binary ops, broadcasting, python scalars, promotion *****

BINARY_OPS: dict[str, Callable[[Any, Any], Any]] = {
  "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
  "maximum": lambda a, b: a.maximum(b) if isinstance(a, Tensor) else np.maximum(a, b),
  "minimum": lambda a, b: a.minimum(b) if isinstance(a, Tensor) else np.minimum(a, b),
}


@pytest.mark.usefixtures("each_device")  # also on the devices with workgroups
@pytest.mark.parametrize("name", sorted(BINARY_OPS))
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 1, 4), (5, 4)), ((1,), (2, 3)), ((), (4, 1)), ((2, 1, 3), (1, 4, 1))])
def test_binary_broadcasting(name: str, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
  fn = BINARY_OPS[name]
  a, b = rand(*shapes[0]), rand(*shapes[1], lo=0.5, hi=3)
  check(fn(Tensor(a), Tensor(b)), fn(a, b), dtypes.float32)
  check(fn(Tensor(b), Tensor(a)), fn(b, a), dtypes.float32)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("scalar", [2, -1.5, True])
def test_binary_python_scalars_both_sides(name: str, scalar: Any) -> None:
  fn, a = BINARY_OPS[name], rand(2, 5, lo=0.5, hi=3)
  check(fn(Tensor(a), scalar), fn(a, np.float32(scalar)), dtypes.float32)
  check(fn(scalar, Tensor(a)), fn(np.float32(scalar), a), dtypes.float32)


def test_numpy_scalars_combine_like_python_scalars() -> None:
  a = rand(4)
  check(Tensor(a) * np.float32(2.5), a * 2.5, dtypes.float32)
  check(np.float64(1.5) + Tensor(a), a + 1.5, dtypes.float32)
  check(Tensor([1, 2, 3]) * np.int64(3), [3, 6, 9], dtypes.int64)
  check(Tensor([1, 2, 3]) > np.int32(1), [False, True, True], dtypes.bool)


def test_int_ops_stay_int_and_wrap_like_numpy() -> None:
  a, b = np.array([-7, 3, 100, 0], np.int32), np.array([2, -3, 7, 5], np.int32)
  for fn in (operator.add, operator.sub, operator.mul, operator.and_, operator.or_, operator.xor):
    check(fn(Tensor(a), Tensor(b)), fn(a, b), dtypes.int32)
  check(Tensor(a) * 3 - 1, a * 3 - 1, dtypes.int32)
  check(~Tensor(a), ~a, dtypes.int32)
  u, v = np.array([250, 3, 0], np.uint8), np.array([10, 5, 1], np.uint8)
  check(Tensor(u) + Tensor(v), u + v, dtypes.uint8)
  check(Tensor(u) - Tensor(v), u - v, dtypes.uint8)
  check(Tensor(u) * 2, u * np.uint8(2), dtypes.uint8)
  check(~Tensor(u), ~u, dtypes.uint8)
  check(Tensor([2 ** 40, -3]) * 5 + 2 ** 33, np.array([2 ** 40, -3]) * 5 + 2 ** 33, dtypes.int64)


def test_int_division_is_true_division() -> None:
  check(Tensor([1, 7, -7]) / Tensor([2, 2, 2]), [0.5, 3.5, -3.5], dtypes.float32)
  check(Tensor([1, 7, -7]) / 4, [0.25, 1.75, -1.75], dtypes.float32)
  check(3 / Tensor([2, 4], dtype=dtypes.uint8), [1.5, 0.75], dtypes.float32)


# every pair of the first seven dtypes, then two pairs for each later one (int64 with uint64 is refused: see test_dtypes)
FIRST_DTYPES = [dtypes.bool, dtypes.uint8, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.bfloat16, dtypes.float32]
LATER_PAIRS = [(dtypes.int8, dtypes.uint8), (dtypes.float64, dtypes.int8), (dtypes.int16, dtypes.uint16), (dtypes.int16, dtypes.float16),
               (dtypes.uint16, dtypes.int32), (dtypes.uint32, dtypes.int32), (dtypes.uint32, dtypes.bool), (dtypes.uint64, dtypes.uint8),
               (dtypes.uint64, dtypes.float32), (dtypes.float64, dtypes.bfloat16)]


@pytest.mark.parametrize("x,y", [(d1, d2) for d1 in FIRST_DTYPES for d2 in FIRST_DTYPES] + LATER_PAIRS)
def test_mixed_dtype_promotion(x: DType, y: DType) -> None:
  a, b = np.array([1, 0, 1, 1], x.np), np.array([1, 1, 0, 1], y.np)
  out = Tensor(a) * Tensor(b)
  dt = least_upper(x, y)
  check(out, (a.astype(np.float64) * b.astype(np.float64)).astype(dt.np), dt)
  check(Tensor(a) < Tensor(b), a.astype(np.float64) < b.astype(np.float64), dtypes.bool)


def test_scalar_promotion() -> None:
  assert (Tensor([1, 2], dtype=dtypes.int32) + 1).dtype == dtypes.int32
  assert (Tensor([1, 2], dtype=dtypes.uint8) + 1).dtype == dtypes.uint8
  assert (Tensor([1, 2], dtype=dtypes.int32) + 1.5).dtype == dtypes.float32
  assert (Tensor([1, 2], dtype=dtypes.float16) + 1.5).dtype == dtypes.float16
  assert (Tensor([True]) + 1).dtype == dtypes.int32
  assert (Tensor([True]) + 1.5).dtype == dtypes.float32
  assert (Tensor([True]) & True).dtype == dtypes.bool
  check(Tensor([True, False]) + 1, [2, 1], dtypes.int32)
  check(Tensor([1, 2], dtype=dtypes.float16) * 1.5, np.array([1.5, 3.0], np.float16), dtypes.float16)
  assert (Tensor([1, 2], dtype=dtypes.bfloat16) + 1.5).dtype == dtypes.bfloat16
  assert (Tensor([1, 2], dtype=dtypes.bfloat16) + Tensor([1], dtype=dtypes.float32)).dtype == dtypes.float32
  assert (Tensor([1, 2], dtype=dtypes.bfloat16) + Tensor([1], dtype=dtypes.int64)).dtype == dtypes.bfloat16
  bf16 = dtypes.bfloat16.np
  check(Tensor([1, 2], dtype=dtypes.bfloat16) * bf16(1.5), np.array([1.5, 3.0], bf16), dtypes.bfloat16)
  check(Tensor([1, 2], dtype=dtypes.bfloat16) + 0.1, np.array([1.1015625, 2.09375], bf16), dtypes.bfloat16, rtol=0, atol=0)  # 0.1 rounds first
  # neither 16-bit float holds the other's values (float16 has 5 exponent bits, bfloat16 8 significant bits): both become float32
  mixed = Tensor([1 / 3, 70000.0], dtype=dtypes.bfloat16) + Tensor([2 ** -10, 0.0], dtype=dtypes.float16)
  check(mixed, np.array([1 / 3, 70000.0], bf16).astype(np.float32) + np.array([2 ** -10, 0], np.float32), dtypes.float32, rtol=0, atol=0)


def test_bool_arithmetic() -> None:
  a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
  check(Tensor(a) + Tensor(b), a + b, dtypes.bool)
  check(Tensor(a) * Tensor(b), a * b, dtypes.bool)
  check(Tensor(a) & Tensor(b), a & b, dtypes.bool)
  check(Tensor(a) | Tensor(b), a | b, dtypes.bool)
  check(Tensor(a) ^ Tensor(b), a ^ b, dtypes.bool)
  check(~Tensor(a), ~a, dtypes.bool)
  check(-Tensor(a), ~a, dtypes.bool)
  check(Tensor(a).logical_not(), ~a, dtypes.bool)
  check(Tensor(a).maximum(Tensor(b)), a | b, dtypes.bool)
  check(Tensor(a).sign(), a, dtypes.bool)
  check(Tensor(a).abs(), a, dtypes.bool)
  check(Tensor(a).minimum(Tensor(b)), a & b, dtypes.bool)
  with pytest.raises(TypeError, match="bool"): Tensor(a) - Tensor(b)


@pytest.mark.parametrize("exp", [0, 1, 2, 3, 4, 5, 7, -1, -2, -3, 0.5, 2.5, -0.5])
def test_pow_scalar_exponent(exp: float) -> None:
  a = np.array([-2.0, -0.5, 0.5, 1.0, 3.0, 1.5], np.float32)
  if exp != int(exp): a = np.abs(a)
  check(Tensor(a) ** exp, a.astype(np.float64) ** exp, dtypes.float32, rtol=3e-6)


def test_pow_tensor_exponent_and_special_cases() -> None:
  base, ex = np.array([-2.0, 3.0, 0.0, -8.0, 0.0, 2.0, -1.0], np.float32), np.array([2.0, 0.5, 0.0, 1 / 3, -1.0, -2.0, 3.0], np.float32)
  with np.errstate(all="ignore"): exp = base.astype(np.float64) ** ex.astype(np.float64)
  check(Tensor(base) ** Tensor(ex), exp, dtypes.float32, rtol=3e-6)
  check(2 ** Tensor([0.0, 3.0, -1.0, 0.5]), [1.0, 8.0, 0.5, math.sqrt(2)], dtypes.float32, rtol=3e-6)
  check(Tensor([2.0, 3.0]) ** Tensor([3, 2]), [8.0, 9.0], dtypes.float32, rtol=3e-6)


def test_pow_int_keeps_int() -> None:
  a = np.array([-3, -2, 0, 1, 2, 3], np.int32)
  for e in (0, 1, 2, 3, 4, 5, 7):
    check(Tensor(a) ** e, a ** e, dtypes.int32)
  check(Tensor(a) ** Tensor(np.array([3, 2, 5, 4, 10, 5], np.int64)), a.astype(np.int64) ** np.array([3, 2, 5, 4, 10, 5]), dtypes.int64)
  check(Tensor([2, 4]) ** 0.5, [math.sqrt(2), 2.0], dtypes.float32)


# ***** comparisons and where *****

CMP_OPS = {"<": operator.lt, ">": operator.gt, "<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}


@pytest.mark.usefixtures("each_device")  # also on the devices with workgroups
@pytest.mark.parametrize("op", sorted(CMP_OPS))
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool])
def test_comparisons(op: str, dtype: DType) -> None:
  fn = CMP_OPS[op]
  a = np.array([0, 1, 2, 3, 1, 0], dtype.np)
  b = np.array([1, 1, 0, 3, 2, 0], dtype.np)
  check(fn(Tensor(a), Tensor(b)), fn(a, b), dtypes.bool)
  check(fn(Tensor(a), 1), fn(a, dtype.np(1)), dtypes.bool)
  check(fn(1, Tensor(a)), fn(dtype.np(1), a), dtypes.bool)
  check(fn(Tensor(a.reshape(2, 3)), Tensor(b[:3])), fn(a.reshape(2, 3), b[:3]), dtypes.bool)


@pytest.mark.parametrize("op", sorted(CMP_OPS))
def test_comparisons_with_nan(op: str) -> None:
  a, b = np.array([np.nan, 1.0, np.nan, 2.0], np.float32), np.array([1.0, np.nan, np.nan, 2.0], np.float32)
  check(CMP_OPS[op](Tensor(a), Tensor(b)), CMP_OPS[op](a, b), dtypes.bool)


def test_comparison_methods_and_mixed_types() -> None:
  check(Tensor([1, 2, 3]).lt(2), [True, False, False])
  check(Tensor([1, 2, 3]).eq(Tensor([1.0, 2.5, 3.0])), [True, False, True])
  check(Tensor([1, 2, 3]) < 2.5, [True, True, False])
  check(Tensor([True, False]) == 1, [True, False])


@pytest.mark.usefixtures("each_device")  # also on the devices with workgroups
def test_where() -> None:
  c, a, b = rand(3, 4) > 0, rand(3, 4, seed=1), rand(4, seed=2)
  check(Tensor(c).where(Tensor(a), Tensor(b)), np.where(c, a, b), dtypes.float32)
  check(Tensor(c).where(Tensor(a), 0.5), np.where(c, a, 0.5), dtypes.float32)
  check(Tensor(c).where(-1.0, Tensor(b)), np.where(c, -1.0, b), dtypes.float32)
  check(Tensor(c).where(1, 0), np.where(c, 1, 0), dtypes.int32)
  check(Tensor(c).where(1.5, 0), np.where(c, 1.5, 0), dtypes.float32)
  check(Tensor(c[:, :1]).where(Tensor(a[0]), Tensor(b[:1])), np.where(c[:, :1], a[0], b[:1]), dtypes.float32)
  check(Tensor(a).where(1, 2), np.where(a != 0, 1, 2))  # a non-bool condition means != 0
  check(Tensor(c).where(Tensor([1, 2, 3, 4], dtype=dtypes.int32), Tensor(np.float16(0.5))), np.where(c, [1, 2, 3, 4], 0.5), dtypes.float16)
  check(Tensor(c).where(Tensor(c), False), c, dtypes.bool)


def test_minimum_propagates_nan() -> None:
  a, b = np.array([np.nan, 1.0, np.nan, 2.0], np.float32), np.array([1.0, np.nan, np.nan, 3.0], np.float32)
  check(Tensor(a).minimum(Tensor(b)), np.minimum(a, b))
  check(Tensor(b).minimum(Tensor(a)), np.minimum(b, a))
  check(Tensor(a).minimum(0.5), np.minimum(a, 0.5))


def test_maximum_minimum_mixed() -> None:
  a = rand(2, 3)
  check(Tensor(a).maximum(0.5), np.maximum(a, 0.5), dtypes.float32)
  check(Tensor(a).minimum(Tensor([1, -1, 0])), np.minimum(a, [1, -1, 0]), dtypes.float32)
  check(Tensor([1, 5, -3]).maximum(2), [2, 5, 2], dtypes.int64)
  check(Tensor([1, 5, -3]).minimum(2.5), [1.0, 2.5, -3.0], dtypes.float32)


# ***** casts *****

CAST_VALUES = {dtypes.bool: [True, False, True], dtypes.uint8: [0, 7, 200], dtypes.int32: [-5, 0, 100], dtypes.int64: [-5, 0, 2 ** 40],
               dtypes.float16: [-2.5, 0.0, 1000.0], dtypes.bfloat16: [-2.5, 0.0, 1.5e38], dtypes.float32: [-2.75, 0.0, 1e6],
               dtypes.int8: [-128, 5, 127], dtypes.int16: [-300, 0, 30000], dtypes.uint16: [0, 7, 60000], dtypes.uint32: [0, 7, 4_000_000_000],
               dtypes.uint64: [0, 7, 2 ** 63 + 5], dtypes.float64: [-2.75, 1e-310, 1e300]}
# every pair of the first seven dtypes; each later one to and from float32 and int32 (int to int wraps, as in NumPy)
CAST_PAIRS = [(s, d) for s in FIRST_DTYPES for d in FIRST_DTYPES] + [(n, p) for n in dtypes.all if n not in FIRST_DTYPES
                                                                     for p in (dtypes.float32, dtypes.int32)] + \
  [(p, n) for n in dtypes.all if n not in FIRST_DTYPES for p in (dtypes.float32, dtypes.int32)] + [(dtypes.float64, dtypes.float16)]


@pytest.mark.usefixtures("each_device")  # also on the devices with workgroups
@pytest.mark.parametrize("src,dst", CAST_PAIRS)
def test_cast(src: DType, dst: DType) -> None:
  a = np.array(CAST_VALUES[src], src.np)
  if dst == dtypes.uint8 and src not in (dtypes.bool, dtypes.uint8): a = (np.abs(a) % 200).astype(src.np)  # out of range is UB in C
  if dst in (dtypes.float16, dtypes.int32, dtypes.int64) and src in (dtypes.int64, dtypes.float32, dtypes.bfloat16): a = (a % 1000).astype(src.np)
  if src.is_float and dst.is_int and not dtypes.min(dst) <= a.astype(np.float64).min() <= a.astype(np.float64).max() <= dtypes.max(dst):
    a = np.fmod(np.abs(a) if dst.is_unsigned else a, 100).astype(src.np)  # a float out of the int's range is UB in C
  check(Tensor(a).cast(dst), a.astype(dst.np), dst)
  check((Tensor(a) ^ True if src == dtypes.bool else Tensor(a) * 1).cast(dst), (a ^ True if src == dtypes.bool else a).astype(dst.np), dst)


def test_cast_by_name_and_numpy_dtype() -> None:
  check(Tensor([1.7, -1.7]).cast("int32"), [1, -1], dtypes.int32)
  check(Tensor([1.7, 0.0]).cast(np.bool_), [True, False], dtypes.bool)
  check(Tensor([1, 2]).cast(np.float16), np.array([1, 2], np.float16), dtypes.float16)
  check(Tensor([1, 2]).cast("bfloat16"), np.array([1, 2], dtypes.bfloat16.np), dtypes.bfloat16)
  check(Tensor([1, 2]).cast(np.dtype(dtypes.bfloat16.np)), np.array([1, 2], dtypes.bfloat16.np), dtypes.bfloat16)
  with pytest.raises(TypeError, match="unsupported dtype"): Tensor([1.0]).cast("complex64")


@pytest.mark.usefixtures("each_device")  # also on the devices with workgroups
def test_bfloat16_cast_rounds_like_ml_dtypes() -> None:
  """float32 -> bfloat16 bit for bit as ml_dtypes: nearest even (ties both ways), NaN of either sign, infinities, overflow, subnormals."""
  special = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F808001, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x7F800000, 0xFF800000, 0x7FC00000,
                      0xFFC00001, 0x7F800001, 0xFFFFFFFF, 0x00000000, 0x80000000, 0x00000001, 0x00008000, 0x00018000, 0x007FFFFF,
                      0x807F8000, 0x00800000], np.uint32)
  rand, mag = np.random.default_rng(0).integers(0, 2 ** 32, 2000, dtype=np.uint32), special & 0x7FFFFFFF
  plain = special[(mag <= 0x7F800000) & ((mag == 0) | (mag >= 0x00800000))]  # no NaN or subnormal
  # an odd length runs the scalar code; 2048 vector lanes, where a vector of plain values takes AVX512_BF16's instruction
  for bits in (np.concatenate([special, rand]), np.concatenate([special, np.tile(plain, 4), rand])[:2048]):
    x = bits.view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"): exp = x.astype(dtypes.bfloat16.np)
    got = Tensor(x).cast(dtypes.bfloat16).numpy()
    assert got.dtype == exp.dtype
    np.testing.assert_array_equal(got.view(np.uint16), exp.view(np.uint16))
    np.testing.assert_array_equal(Tensor(exp).cast(dtypes.float32).numpy().view(np.uint32), exp.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal((Tensor(x) * 1).cast(dtypes.bfloat16).numpy().view(np.uint16), exp.view(np.uint16))


# ***** reductions *****

AXES = [None, 0, 1, -1, 2, (0, 2), (-1, 0), (0, 1, 2), (1,)]


def _np_red(name: str, a: np.ndarray, axis: Any, keepdim: bool) -> np.ndarray:
  fn = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}[name]
  return fn(a.astype(np.float64) if a.dtype.kind == "f" or a.dtype == dtypes.bfloat16.np or name == "mean" else a, axis=axis, keepdims=keepdim)


@pytest.mark.usefixtures("each_device")  # also on the devices with workgroups
@pytest.mark.parametrize("name", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce_float(name: str, axis: Any, keepdim: bool) -> None:
  a = rand(3, 4, 5)
  check(getattr(Tensor(a), name)(axis, keepdim=keepdim), _np_red(name, a, axis, keepdim), dtypes.float32)


@pytest.mark.usefixtures("each_device")  # also on the devices with workgroups
@pytest.mark.parametrize("name", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool, dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)])
def test_reduce_dtypes(name: str, dtype: DType, axis: Any) -> None:
  rng = np.random.default_rng(1)
  a = rng.integers(0 if dtype in (dtypes.uint8, dtypes.bool) else -50, 2 if dtype == dtypes.bool else 250 if dtype == dtypes.uint8 else 50, (3, 4, 5))
  a = a.astype(dtype.np)
  out = getattr(Tensor(a), name)(axis)
  exp_dt = {"sum": dtypes.int64 if not dtype.is_float else dtype, "mean": dtypes.float32 if not dtype.is_float else dtype}.get(name, dtype)
  exp = _np_red(name, a.astype(np.int64) if name == "sum" and not dtype.is_float else a, axis, False)
  check(out, np.asarray(exp).astype(exp_dt.np), exp_dt, **TOL16.get(dtype, {}))


def test_float16_sum_accumulates_in_float32() -> None:
  check(Tensor.ones(4096, dtype=dtypes.float16).sum(), np.float16(4096), dtypes.float16)
  check(Tensor.ones(64, 3000, dtype=dtypes.float16).mean(1), np.ones(64, np.float16), dtypes.float16)
  check(Tensor.ones(4096, dtype=dtypes.bfloat16).sum(), 4096, dtypes.bfloat16)  # a bfloat16 sum would stall at 256


def test_sum_dtype_and_int_overflow() -> None:
  check(Tensor([2 ** 30, 2 ** 30, 2 ** 30], dtype=dtypes.int32).sum(), 3 * 2 ** 30, dtypes.int64)
  check(Tensor(np.full(300, 255, np.uint8)).sum(), 300 * 255, dtypes.int64)
  check(Tensor([True] * 300).sum(), 300, dtypes.int64)
  check(Tensor([1.5, 2.25]).sum(dtype=dtypes.float16), 3.75, dtypes.float16)
  check(Tensor([1, 2], dtype=dtypes.int32).sum(dtype="int32"), 3, dtypes.int32)


def test_extreme_values_in_max_min() -> None:
  check(Tensor(np.array([-2 ** 31, -5], np.int32)).max(), -5, dtypes.int32)
  check(Tensor(np.array([2 ** 31 - 1, -2 ** 31], np.int32)).min(), -2 ** 31, dtypes.int32)
  check(Tensor(np.array([-2 ** 63, -1], np.int64)).max(), -1, dtypes.int64)
  check(Tensor([-np.inf, -np.inf]).max(), -np.inf)
  check(Tensor([np.inf, 1.0]).min(), 1.0)
  check(Tensor(np.array([0, 255], np.uint8)).min(), 0, dtypes.uint8)


@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("correction", [0, 1, 2])
def test_var_std(axis: Any, correction: int) -> None:
  a = rand(3, 4, 5)
  check(Tensor(a).var(axis, correction=correction), np.var(a.astype(np.float64), axis=axis, ddof=correction), dtypes.float32, rtol=1e-5)
  check(Tensor(a).std(axis, keepdim=True, correction=correction), np.std(a.astype(np.float64), axis=axis, ddof=correction, keepdims=True),
        dtypes.float32, rtol=1e-5)


def test_var_of_ints_and_too_few_elements() -> None:
  check(Tensor([1, 2, 4]).var(), np.var([1, 2, 4], ddof=1), dtypes.float32)
  assert math.isnan(Tensor([1.0]).var().item())


@pytest.mark.usefixtures("each_device")  # also on the devices with workgroups
@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, 2])
@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_argmin(name: str, axis: Any, keepdim: bool) -> None:
  a = np.random.default_rng(2).integers(0, 4, (3, 4, 5)).astype(np.float32)  # many ties: the first index wins
  exp = getattr(np, name)(a, axis=axis, keepdims=keepdim if axis is not None else False)
  check(getattr(Tensor(a), name)(axis, keepdim=keepdim), exp, dtypes.int32)


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool, dtypes.float16])
def test_argmax_argmin_dtypes(dtype: DType) -> None:
  a = np.array([[3, 0, 7, 7], [1, 1, 0, 2], [0, 0, 0, 0]]).astype(dtype.np)
  for name in ("argmax", "argmin"):
    for axis in (None, 0, 1):
      check(getattr(Tensor(a), name)(axis), getattr(np, name)(a, axis=axis), dtypes.int32)
  check(Tensor(np.array([5, -2 ** 31, 7], np.int32)).argmin(), 1)


def test_argmax_argmin_with_nan() -> None:  # like numpy: the first NaN
  for a in ([1.0, np.nan], [np.nan, 1.0], [1.0, np.nan, np.nan, 3.0], [[1.0, np.nan], [5.0, 2.0]]):
    x = np.array(a, np.float32)
    for name in ("argmax", "argmin"):
      check(getattr(Tensor(x), name)(), getattr(np, name)(x), dtypes.int32)
      check(getattr(Tensor(x), name)(-1), getattr(np, name)(x, axis=-1), dtypes.int32)


def test_argmax_of_0d() -> None:
  check(Tensor(3.0).argmax(), 0, dtypes.int32)
  check(Tensor(3.0).argmax(0), 0, dtypes.int32)


def _np_softmax(a: np.ndarray, axis: Any) -> np.ndarray:
  e = np.exp(a - a.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def _np_log_softmax(a: np.ndarray, axis: Any) -> np.ndarray:
  shifted = a - a.max(axis=axis, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


@pytest.mark.usefixtures("each_device")  # also on the devices with workgroups
@pytest.mark.parametrize("axis", [0, 1, -1, (0, 2), (1, 2)])
def test_softmax_log_softmax(axis: Any) -> None:
  a = rand(3, 4, 5) * 10
  check(Tensor(a).softmax(axis), _np_softmax(a.astype(np.float64), axis), dtypes.float32, rtol=1e-5, atol=1e-7)
  check(Tensor(a).log_softmax(axis), _np_log_softmax(a.astype(np.float64), axis), dtypes.float32, rtol=1e-5, atol=1e-5)


def test_softmax_large_values_and_ints() -> None:
  a = np.array([[1000.0, 1001.0, -1000.0], [-5e4, -5e4, -5e4]], np.float32)
  check(Tensor(a).softmax(), _np_softmax(a.astype(np.float64), -1), rtol=1e-6, atol=1e-7)
  check(Tensor(a).log_softmax(), _np_log_softmax(a.astype(np.float64), -1), rtol=1e-6, atol=1e-5)
  check(Tensor([1, 2, 3]).softmax(), _np_softmax(np.array([1.0, 2.0, 3.0]), -1), dtypes.float32)


def test_reduce_of_0d_and_size_1() -> None:
  check(Tensor(2.5).sum(), 2.5)
  check(Tensor(2.5).max(0), 2.5)
  check(Tensor(2.5).mean(keepdim=True), 2.5)
  check(Tensor([[2.5]]).sum(1), [2.5])
  check(Tensor([[2.5]]).min((0, 1), keepdim=True), [[2.5]])


# ***** movement *****

def test_reshape() -> None:
  a = rand(2, 3, 4)
  check(Tensor(a).reshape(6, 4), a.reshape(6, 4))
  check(Tensor(a).reshape((4, -1)), a.reshape(4, -1))
  check(Tensor(a).reshape([24]), a.reshape(24))
  check(Tensor(a).permute(2, 0, 1).reshape(4, 6), a.transpose(2, 0, 1).reshape(4, 6))
  check(Tensor(a)[:, 1:].reshape(-1), a[:, 1:].reshape(-1))
  check(Tensor(a[0, 0, :1]).reshape(()), a[0, 0, 0])
  check(Tensor(2.0).reshape(1, 1), [[2.0]])


def test_permute_transpose_T() -> None:
  a = rand(2, 3, 4)
  check(Tensor(a).permute(2, 0, 1), a.transpose(2, 0, 1))
  check(Tensor(a).permute((1, -1, 0)), a.transpose(1, 2, 0))
  check(Tensor(a).transpose(), np.swapaxes(a, -2, -1))
  check(Tensor(a).transpose(0, 2), np.swapaxes(a, 0, 2))
  check(Tensor(a).T, a.T)
  check(Tensor(a[0]).T, a[0].T)
  check(Tensor(a[0, 0]).T, a[0, 0])


def test_expand() -> None:
  a = rand(3, 1)
  check(Tensor(a).expand(3, 4), np.broadcast_to(a, (3, 4)))
  check(Tensor(a).expand((2, 3, 4)), np.broadcast_to(a, (2, 3, 4)))
  check(Tensor(a).expand(-1, 5), np.broadcast_to(a, (3, 5)))
  check(Tensor(1.5).expand(2, 2), np.full((2, 2), 1.5))
  check(Tensor(a).expand(3, 4) * Tensor(rand(3, 4)), a * rand(3, 4))


@pytest.mark.usefixtures("each_device")  # also on the devices with workgroups
def test_pad() -> None:
  a = rand(2, 3)
  check(Tensor(a).pad(((1, 0), (0, 2))), np.pad(a, ((1, 0), (0, 2))))
  check(Tensor(a).pad(((1, 1), None), value=-7.5), np.pad(a, ((1, 1), (0, 0)), constant_values=-7.5))
  check(Tensor(a).pad((1, 2)), np.pad(a, ((0, 0), (1, 2))))  # torch's flat form: last dim first
  check(Tensor(a).pad((1, 2, 3, 0), value=1.0), np.pad(a, ((3, 0), (1, 2)), constant_values=1.0))
  check(Tensor(a).pad(((-1, 1), (1, -2))), np.pad(a[1:, :1], ((0, 1), (1, 0))))
  check(Tensor(np.array([1, 2], np.uint8)).pad(((1, 1),), value=9), np.array([9, 1, 2, 9], np.uint8), dtypes.uint8)
  check(Tensor([True]).pad(((1, 0),), value=True), [True, True], dtypes.bool)
  check(Tensor([1.5], dtype=dtypes.float16).pad(((0, 1),), value=2.5), np.array([1.5, 2.5], np.float16), dtypes.float16)
  check(Tensor(a).pad(((1, 1), (1, 1))).pad(((1, 0), (0, 1)), value=3.0), np.pad(np.pad(a, 1), ((1, 0), (0, 1)), constant_values=3.0))


def test_shrink_flip() -> None:
  a = rand(4, 5)
  check(Tensor(a).shrink(((1, 3), (0, 5))), a[1:3])
  check(Tensor(a).shrink((None, (2, 4))), a[:, 2:4])
  check(Tensor(a).flip(0), a[::-1])
  check(Tensor(a).flip(-1), a[:, ::-1])
  check(Tensor(a).flip((0, 1)), a[::-1, ::-1])
  check(Tensor(a).pad(((1, 0), (0, 0))).flip(0).shrink(((0, 3), None)), np.pad(a, ((1, 0), (0, 0)))[::-1][:3])


def test_flatten_squeeze_unsqueeze() -> None:
  a = rand(2, 1, 3, 1)
  check(Tensor(a).flatten(), a.reshape(-1))
  check(Tensor(a).flatten(1), a.reshape(2, -1))
  check(Tensor(a).flatten(1, 2), a.reshape(2, 3, 1))
  check(Tensor(2.0).flatten(), [2.0])
  check(Tensor(a).squeeze(), a.squeeze())
  check(Tensor(a).squeeze(1), a.squeeze(1))
  check(Tensor(a).squeeze(-1), a.squeeze(-1))
  check(Tensor(a).squeeze(0), a)  # not size 1: unchanged, like torch
  check(Tensor(a).unsqueeze(0), a[None])
  check(Tensor(a).unsqueeze(-1), a[..., None])
  check(Tensor(a).unsqueeze(2), np.expand_dims(a, 2))
  check(Tensor(2.0).unsqueeze(0), [2.0])


def test_cat_stack() -> None:
  a, b, c = rand(2, 3), rand(4, 3, seed=1), rand(2, 5, seed=2)
  check(Tensor(a).cat(Tensor(b)), np.concatenate([a, b]))
  check(Tensor(a).cat(Tensor(c), dim=1), np.concatenate([a, c], axis=1))
  check(Tensor(a).cat(Tensor(c), Tensor(a), dim=-1), np.concatenate([a, c, a], axis=-1))
  check(Tensor(a).cat(Tensor(np.array([[1, 2, 3]], np.int32))), np.concatenate([a, [[1, 2, 3]]]), dtypes.float32)
  check(Tensor([True]).cat(Tensor([False, True])), [True, False, True], dtypes.bool)
  check(Tensor(np.array([1], np.uint8)).cat(Tensor(np.array([200], np.uint8))), np.array([1, 200], np.uint8), dtypes.uint8)
  check(Tensor(a).cat(), a)
  check(Tensor.stack([Tensor(a), Tensor(a * 2)]), np.stack([a, a * 2]))
  check(Tensor.stack([Tensor(a), Tensor(a * 2)], dim=-1), np.stack([a, a * 2], axis=-1))
  check(Tensor.stack([Tensor(a), Tensor(a * 2), Tensor(a * 3)], dim=1), np.stack([a, a * 2, a * 3], axis=1))
  check(Tensor.stack([Tensor(1.0), Tensor(2.0)]), [1.0, 2.0])


@pytest.mark.parametrize("idx", GETITEM_CASES, ids=[_idx_code(i if isinstance(i, tuple) else (i,)) for i in GETITEM_CASES])
def test_getitem(idx: Any) -> None:
  a = rand(3, 4, 5)
  check(Tensor(a)[idx], a[idx])
  check((Tensor(a) * 2)[idx], (a * 2)[idx])


@settings(max_examples=examples(40), **FUZZ)
@given(st.data())
def test_getitem_random(data: Any) -> None:
  shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
  idx = _index_for(data.draw, shape)
  a = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
  check(Tensor(a)[idx], a[idx], dtypes.int32)


# ***** composites: matmul, conv2d, pools, layernorm *****

@pytest.mark.usefixtures("each_device")  # also on the devices with workgroups
@pytest.mark.parametrize("shapes", [((4,), (4,)), ((4,), (4, 3)), ((2, 4), (4,)), ((2, 4), (4, 3)), ((5, 2, 4), (4, 3)), ((2, 4), (5, 4, 3)),
                                    ((2, 1, 3, 4), (5, 4, 2)), ((1, 4), (4, 1)), ((3, 1, 4), (1, 4, 2)), ((4,), (2, 4, 3))])
def test_matmul(shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
  a, b = rand(*shapes[0]), rand(*shapes[1], seed=1)
  exp = np.matmul(a.astype(np.float64), b.astype(np.float64))
  check(Tensor(a) @ Tensor(b), exp, dtypes.float32, rtol=1e-5, atol=1e-5)
  check(Tensor(a).matmul(Tensor(b)), exp, dtypes.float32, rtol=1e-5, atol=1e-5)
  check(Tensor(a).dot(Tensor(b)), exp, dtypes.float32, rtol=1e-5, atol=1e-5)


def test_matmul_dtypes() -> None:
  a, b = np.arange(12).reshape(3, 4).astype(np.int32) - 5, np.arange(8).reshape(4, 2).astype(np.int32)
  check(Tensor(a) @ Tensor(b), a @ b, dtypes.int32)
  check(Tensor(a) @ Tensor(b.astype(np.int64)), a @ b, dtypes.int64)
  check(Tensor(a) @ Tensor(b.astype(np.float32)), (a @ b).astype(np.float32), dtypes.float32)
  h = rand(3, 64, dtype=np.float16)
  check(Tensor(h) @ Tensor(h.T.copy()), h.astype(np.float32) @ h.T.astype(np.float32), dtypes.float16, rtol=2e-3, atol=2e-2)
  bf = h.astype(dtypes.bfloat16.np)
  check(Tensor(bf) @ Tensor(bf.T.copy()), bf.astype(np.float32) @ bf.T.astype(np.float32), dtypes.bfloat16, rtol=1e-2, atol=1e-1)
  m = np.array([[True, False], [False, False]])
  check(Tensor(m) @ Tensor(m), m @ m, dtypes.bool)


def test_matmul_of_views_and_big_inner() -> None:
  a, b = rand(33, 70), rand(70, 17, seed=1)
  exp = a.astype(np.float64) @ b.astype(np.float64)
  check(Tensor(a) @ Tensor(b), exp, rtol=1e-4, atol=1e-4)
  check(Tensor(a.T.copy()).T @ Tensor(b[::-1].copy()).flip(0), exp, rtol=1e-4, atol=1e-4)
  check((Tensor(a) @ Tensor(b)).sum(0), exp.sum(0), rtol=1e-4, atol=1e-3)


CONV_CASES = [  # (x shape, w shape, stride, padding, dilation, groups, bias)
  ((1, 1, 5, 5), (1, 1, 3, 3), 1, 0, 1, 1, False), ((2, 3, 9, 8), (4, 3, 3, 3), 1, 1, 1, 1, True),
  ((2, 4, 9, 8), (6, 2, 3, 3), (2, 1), (1, 2), (1, 2), 2, True), ((1, 4, 7, 7), (4, 1, 3, 3), 2, 1, 1, 4, False),
  ((2, 3, 6, 5), (5, 3, 1, 1), 1, 0, 1, 1, True), ((1, 2, 8, 8), (3, 2, 2, 3), 3, (0, 2), 2, 1, True),
  ((1, 6, 5, 5), (6, 2, 5, 5), 1, 2, 1, 3, False),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(case: tuple) -> None:
  torch = pytest.importorskip("torch")
  xs, ws, stride, padding, dilation, groups, has_bias = case
  x, w, b = rand(*xs), rand(*ws, seed=1), rand(ws[0], seed=2)
  out = Tensor(x).conv2d(Tensor(w), Tensor(b) if has_bias else None, stride=stride, padding=padding, dilation=dilation, groups=groups)
  exp = torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float64), torch.tensor(w, dtype=torch.float64),
                                   torch.tensor(b, dtype=torch.float64) if has_bias else None, stride, padding, dilation, groups)
  check(out, exp.numpy(), dtypes.float32, rtol=1e-5, atol=1e-5)


def test_conv2d_int_and_half() -> None:
  x, w = np.arange(2 * 9).reshape(1, 2, 3, 3).astype(np.int32), np.ones((1, 2, 2, 2), np.int32)
  exp = np.array([[[[x[0, :, i:i + 2, j:j + 2].sum() for j in range(2)] for i in range(2)]]])
  check(Tensor(x).conv2d(Tensor(w)), exp, dtypes.int32)
  check(Tensor(x, dtype=dtypes.float16).conv2d(Tensor(w, dtype=dtypes.float16)), exp.astype(np.float16), dtypes.float16)
  check(Tensor(x, dtype=dtypes.bfloat16).conv2d(Tensor(w, dtype=dtypes.bfloat16)), exp.astype(dtypes.bfloat16.np), dtypes.bfloat16)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_16_bit_products_are_summed_exactly_and_rounded_once(dtype: DType) -> None:
  """A matmul, a convolution (Winograd's 3x3 and a strided one) and a bias of 16-bit floats: their products are exact in float32,
  so the result is within one of the type's ulps of the float64 sum, give or take float32's rounding of the sum of |terms| (rounding
  each product to 16 bits first was off by up to 2**-12 (float16) or 2**-9 (bfloat16) of that sum). softmax and layernorm compute
  in float32 and round once too."""
  rng = np.random.default_rng(3)
  def arr(*shape: int) -> tuple[Tensor, np.ndarray]:
    a = rng.standard_normal(shape).astype(dtype.np)
    return Tensor(a, dtype=dtype), a.astype(np.float64)
  (a, a64), (b, b64) = arr(48, 256), arr(256, 40)
  (x, x64), (w, w64), (bias, bias64) = arr(2, 16, 10, 10), arr(16, 16, 3, 3), arr(16)
  torch = pytest.importorskip("torch")
  def conv(x: np.ndarray, w: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    return torch.nn.functional.conv2d(*(torch.tensor(t) for t in (x, w, bias)), stride=stride, padding=1).numpy()
  e = np.exp(a64 - a64.max(-1, keepdims=True))
  norm = (a64 - a64.mean(-1, keepdims=True)) / np.sqrt(a64.var(-1, keepdims=True) + 1e-5)
  for got, want, terms in [(a @ b, a64 @ b64, np.abs(a64) @ np.abs(b64)), (a.softmax(-1), e / e.sum(-1, keepdims=True), 1.0),
                           (a.layernorm(), norm, 4.0),
                           *((x.conv2d(w, bias, stride=s, padding=1), conv(x64, w64, bias64, s), conv(*map(np.abs, (x64, w64, bias64)), s))
                             for s in (1, 2))]:
    err = np.abs(got.numpy().astype(np.float64) - want) - np.spacing(np.abs(want).astype(dtype.np)).astype(np.float64)
    assert got.dtype == dtype and (err <= 2 ** -20 * terms).all(), (err / terms).max()


POOL_CASES = [(2, None, 0, 1), (3, 2, 1, 1), ((2, 3), (1, 2), (1, 0), 1), (2, 1, 0, 2), (3, 3, 1, (1, 2)), (1, 1, 0, 1)]


@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool2d(case: tuple) -> None:
  torch = pytest.importorskip("torch")
  k, stride, padding, dilation = case
  x = rand(2, 3, 9, 8)
  exp = torch.nn.functional.max_pool2d(torch.tensor(x), k, stride, padding, dilation)
  check(Tensor(x).max_pool2d(k, stride, padding, dilation), exp.numpy(), dtypes.float32)
  check(Tensor(x[0]).max_pool2d(k, stride, padding, dilation), exp.numpy()[0], dtypes.float32)  # (C, H, W) works too


@pytest.mark.parametrize("case", [c for c in POOL_CASES if c[3] == 1])
def test_avg_pool2d(case: tuple) -> None:
  torch = pytest.importorskip("torch")
  k, stride, padding, _ = case
  x = rand(2, 3, 9, 8)
  exp = torch.nn.functional.avg_pool2d(torch.tensor(x, dtype=torch.float64), k, stride, padding)  # count_include_pad=True
  check(Tensor(x).avg_pool2d(k, stride, padding), exp.numpy(), dtypes.float32, rtol=1e-6)


def test_pools_of_ints() -> None:
  x = np.array([[[1, -5, 3], [0, -2, -7], [4, 4, -1]]], np.int32)
  check(Tensor(x).max_pool2d(2, 1), [[[1, 3], [4, 4]]], dtypes.int32)
  check(Tensor(x).max_pool2d(2, 2, padding=1), [[[1, 3], [4, 4]]], dtypes.int32)  # padding never wins the max
  check(Tensor(-np.ones((1, 2, 2), np.float32)).max_pool2d(2, 1, padding=1), -np.ones((1, 3, 3)), dtypes.float32)
  check(Tensor(x).avg_pool2d(3), [[[-3 / 9]]], dtypes.float32)


@pytest.mark.parametrize("axis", [-1, (-2, -1), 1])
@pytest.mark.parametrize("affine", [False, True])
def test_layernorm(axis: Any, affine: bool) -> None:
  torch = pytest.importorskip("torch")
  x = rand(2, 3, 8) * 4 + 1
  axes = _axes(axis, 3)
  norm = tuple(x.shape[a] for a in axes)
  w, b = rand(*norm, seed=1), rand(*norm, seed=2)
  if axes == (1,):
    mean, var = x.mean(1, keepdims=True, dtype=np.float64), x.astype(np.float64).var(1, keepdims=True)
    exp = (x - mean) / np.sqrt(var + 1e-5) * (w[:, None] if affine else 1) + (b[:, None] if affine else 0)
    wt, bt = (Tensor(w).reshape(3, 1), Tensor(b).reshape(3, 1)) if affine else (None, None)
  else:
    exp = torch.nn.functional.layer_norm(torch.tensor(x, dtype=torch.float64), norm, torch.tensor(w, dtype=torch.float64) if affine else None,
                                         torch.tensor(b, dtype=torch.float64) if affine else None).numpy()
    wt, bt = (Tensor(w), Tensor(b)) if affine else (None, None)
  check(Tensor(x).layernorm(axis, weight=wt, bias=bt), exp, dtypes.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_silu_against_torch(approximate: str) -> None:
  torch = pytest.importorskip("torch")
  x = np.linspace(-8, 8, 201).astype(np.float32)
  check(Tensor(x).gelu(approximate), torch.nn.functional.gelu(torch.tensor(x, dtype=torch.float64), approximate=approximate).numpy(), atol=1e-6)
  check(Tensor(x).silu(), torch.nn.functional.silu(torch.tensor(x, dtype=torch.float64)).numpy(), atol=1e-6)


@settings(max_examples=examples(30), **FUZZ)
@given(st.data())
def test_reductions_random(data: Any) -> None:
  shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=4)))
  name = data.draw(st.sampled_from(["var", "std", "softmax", "log_softmax", "argmax", "argmin", "sum", "max", "min", "mean"]))
  float_only = name in ("var", "std", "softmax", "log_softmax")
  dtype = data.draw(st.sampled_from([dtypes.float32, dtypes.int32] if float_only else list(dtypes.all)))
  rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
  a = (rng.uniform(-3, 3, shape) if dtype.is_float else rng.integers(0, 2 if dtype == dtypes.bool else 9, shape)).astype(dtype.np)
  nd = len(shape)
  if name in ("argmax", "argmin", "softmax", "log_softmax"):
    axis = data.draw(st.integers(-nd, nd - 1) if name.endswith("softmax") else st.one_of(st.none(), st.integers(-nd, nd - 1)))
  else: axis = _axis_arg(data.draw, nd)
  keepdim = data.draw(st.booleans())
  x, a64 = Tensor(a), a.astype(np.float64)
  tol = TOL16.get(dtype, dict(rtol=1e-5, atol=1e-5))
  if name in ("var", "std"):
    corr = data.draw(st.integers(0, 1))
    assume(math.prod(shape[a] for a in _axes(axis, nd)) > corr)
    exp = getattr(np, name)(a64, axis=axis, ddof=corr, keepdims=keepdim)
    check(getattr(x, name)(axis, keepdim=keepdim, correction=corr), exp, dtypes.float32, **tol)
  elif name == "softmax": check(x.softmax(axis), _np_softmax(a64, axis), dtypes.float32, **tol)
  elif name == "log_softmax": check(x.log_softmax(axis), _np_log_softmax(a64, axis), dtypes.float32, **tol)
  elif name in ("argmax", "argmin"):
    check(getattr(x, name)(axis, keepdim=keepdim), getattr(np, name)(a, axis=axis, keepdims=keepdim and axis is not None), dtypes.int32)
  else:
    ref = _np_red(name, a.astype(np.int64) if name == "sum" and not dtype.is_float else a, axis, keepdim)
    check(getattr(x, name)(axis, keepdim=keepdim), ref, **tol)


@settings(max_examples=examples(25), **FUZZ)
@given(st.data())
def test_matmul_random(data: Any) -> None:
  n, k, m = (data.draw(st.integers(1, 19)) for _ in range(3))
  batch = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
  bx = tuple(1 if data.draw(st.booleans()) else b for b in batch)
  ax = (data.draw(st.sampled_from([(), bx])) + (n, k)) if data.draw(st.integers(0, 4)) else (k,)
  bw = (batch + (k, m)) if data.draw(st.integers(0, 4)) else (k,)
  a, b = rand(*ax, seed=n), rand(*bw, seed=m)
  out = Tensor(a) @ Tensor(b)
  if data.draw(st.booleans()): out = (Tensor(a).T.T if len(ax) == 2 else Tensor(a)) @ Tensor(b).contiguous()
  check(out, np.matmul(a.astype(np.float64), b.astype(np.float64)), dtypes.float32, rtol=1e-5, atol=1e-5)


@settings(max_examples=examples(25), **FUZZ)
@given(st.data())
def test_conv2d_and_pools_random(data: Any) -> None:
  torch = pytest.importorskip("torch")
  F = torch.nn.functional
  groups = data.draw(st.integers(1, 3))
  cin, cout = groups * data.draw(st.integers(1, 3)), groups * data.draw(st.integers(1, 2))
  kh, kw = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
  stride, dilation = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))), (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
  padding = (data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2)))
  h = data.draw(st.integers(max(1, dilation[0] * (kh - 1) + 1 - 2 * padding[0]), 10))
  w = data.draw(st.integers(max(1, dilation[1] * (kw - 1) + 1 - 2 * padding[1]), 10))
  x, wt, b = rand(data.draw(st.integers(1, 2)), cin, h, w), rand(cout, cin // groups, kh, kw, seed=1), rand(cout, seed=2)
  bias = data.draw(st.booleans())
  exp = F.conv2d(torch.tensor(x, dtype=torch.float64), torch.tensor(wt, dtype=torch.float64), torch.tensor(b, dtype=torch.float64) if bias else None,
                 stride, padding, dilation, groups)
  out = Tensor(x).conv2d(Tensor(wt), Tensor(b) if bias else None, stride, padding, dilation, groups)
  check(out, exp.numpy(), dtypes.float32, rtol=1e-5, atol=1e-5)
  # pools with the same stride, padding and dilation: torch wants padding <= kernel / 2 and the window inside the padded input
  top = [(s + 2 * p - 1) // d + 1 for s, p, d in zip((h, w), padding, dilation)]
  if any(2 * p > min(t, 4) for p, t in zip(padding, top)): return
  k = tuple(data.draw(st.integers(max(1, 2 * p), min(t, 4))) for p, t in zip(padding, top))
  check(Tensor(x).max_pool2d(k, stride, padding, dilation), F.max_pool2d(torch.tensor(x), k, stride, padding, dilation).numpy(), dtypes.float32)
  check(Tensor(x).avg_pool2d(k, stride, padding), F.avg_pool2d(torch.tensor(x, dtype=torch.float64), k, stride, padding).numpy(), dtypes.float32)


def test_large_kernels() -> None:
  """Big enough for the heuristics' threads, SIMD lanes and register tiles, with ragged edges."""
  a, b = rand(300, 257), rand(257, 131, seed=1)
  a64 = a.astype(np.float64)
  check(Tensor(a) @ Tensor(b), a64 @ b, rtol=1e-4, atol=1e-4)
  check(Tensor(a).sum(0), a64.sum(0), rtol=1e-4, atol=1e-4)
  check(Tensor(a).max(1), a.max(1))
  check(Tensor(a).softmax(1), _np_softmax(a64, 1), rtol=1e-5, atol=1e-7)
  check(Tensor(a).exp() * 2 + Tensor(a).T.T.sin(), np.exp(a64) * 2 + np.sin(a64), rtol=1e-5)
  check(Tensor(a).T + 1, a.T + 1)
  check(Tensor(a).argmax(0), a.argmax(0))
  check(Tensor((a * 10).astype(np.int32)).sum(1), (a * 10).astype(np.int32).astype(np.int64).sum(1))
  check(Tensor(a.astype(np.float16)).sum(0), a.astype(np.float16).astype(np.float64).sum(0), rtol=2e-3, atol=2e-2)
  bf = a.astype(dtypes.bfloat16.np)
  check(Tensor(bf).sum(0), bf.astype(np.float64).sum(0), rtol=1e-2, atol=1e-1)


# ***** bugs outside tensor.py, fixed: regression tests (new known bugs go here as strict xfails) *****

def test_heuristic_reduce_output_with_more_dims() -> None:
  check(Tensor([1.0, 2.0]).sum().reshape(1, 1), [[3.0]])


def test_max_propagates_nan() -> None:
  """MAX was rendered as (a>b?a:b), which dropped a NaN in one operand order: maximum, relu, clip and max/min reductions lost it."""
  check(Tensor([np.nan, 1.0]).maximum(0.0), [np.nan, 1.0])
  check(Tensor([np.nan, 1.0]).max(), np.nan)


def test_select_of_lanes_under_a_scalar_bool() -> None:
  """Found by the float fuzzer: E_8 computes (v9 ? v13 : v22) per lane, and gcc 12.2's loop if-conversion with AVX-512VL
  masks zeroed lanes 1-3. The CPU device now builds with gcc's -fno-tree-loop-if-convert."""
  x0 = np.array([0.82177013, -1.3812797, -2.754159, -2.900834, 1.8796214, 2.4765334, 0.6398147, 1.3769794], np.float32)
  x1 = np.array([0.26174995], np.float32)
  check((Tensor(x1).abs() != 0.5).where(Tensor(x0).cos(), Tensor(x1).abs()), np.cos(x0.astype(np.float64)))


def test_sum_over_empty_axis() -> None:
  """Was rendered as one iteration (loops opened only for size > 1), reading past the empty input instead of returning 0."""
  check(Tensor(np.zeros((0, 3), np.float32)).sum(0), [0.0, 0.0, 0.0])


def test_zero_size_output() -> None:
  """Kernels for empty outputs ran with size-0 loops run once, writing past the empty output; they are skipped now."""
  check(Tensor(np.zeros((0, 3), np.float32)) + 1, np.zeros((0, 3)))  # check() fails on the guard's canaries
  check(Tensor(rand(3, 4))[:, 3:1] * 2, np.zeros((3, 0)))
