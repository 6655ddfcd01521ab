"""Every dtype end to end: promotion, aliases, the settable defaults, and casts, wrap-around arithmetic, comparisons, reductions,
bitcasts and bitwise ops against PyTorch (NumPy for uint16, uint32 and uint64, where torch has no arithmetic). The wrap-around,
cast, bitcast and float64 tests run on each device; the op-by-op oracles on the CPU only, as they exercise the same type tables."""
from __future__ import annotations

import math
from typing import Iterator

import numpy as np
import pytest
from oracle import helper_test_op, torch

from tinytune import Tensor, dtypes
from tinytune.codegen.cstyle import OpenCLRenderer
from tinytune.codegen.kernel import Kernel
from tinytune.dtype import DType, least_upper
from tinytune.engine.schedule import create_schedule
from tinytune.runtime import DeviceCaps

INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64]
FLOATS = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
TORCH_ARITH = {d for d in dtypes.all if d not in (dtypes.uint16, dtypes.uint32, dtypes.uint64)}  # torch's CPU kernels exist for these


def _torch(dt: DType) -> object: return getattr(torch, dt.name)


def test_promotion_matches_torch() -> None:
  for a in TORCH_ARITH:
    for b in TORCH_ARITH:
      assert least_upper(a, b).name == str(torch.promote_types(_torch(a), _torch(b))).removeprefix("torch."), (a, b)


def test_promotion_of_unsigned_types() -> None:
  assert least_upper(dtypes.int16, dtypes.uint16) == dtypes.int32 and least_upper(dtypes.int32, dtypes.uint32) == dtypes.int64
  assert least_upper(dtypes.int8, dtypes.uint32) == dtypes.int64 and least_upper(dtypes.int64, dtypes.uint32) == dtypes.int64
  assert least_upper(dtypes.uint16, dtypes.uint64) == dtypes.uint64 and least_upper(dtypes.uint64, dtypes.float16) == dtypes.float16
  with pytest.raises(TypeError, match="int64 and uint64 have no common int type"): least_upper(dtypes.int64, dtypes.uint64)


def test_aliases_and_cast_shorthands() -> None:
  assert (dtypes.half, dtypes.float, dtypes.double, dtypes.int, dtypes.long) == (dtypes.float16, dtypes.float32, dtypes.float64, dtypes.int32,
                                                                                  dtypes.int64)
  assert (dtypes.char, dtypes.uchar, dtypes.short, dtypes.ushort, dtypes.uint, dtypes.ulong) == tuple(INTS[:4] + INTS[5:8:2])
  assert dtypes.from_any("double") == dtypes.float64 and dtypes.from_any(np.uint16) == dtypes.uint16
  t = Tensor([1, 2])
  assert [t.double().dtype, t.long().dtype, t.short().dtype, t.char().dtype, t.byte().dtype, t.half().dtype, t.bfloat16().dtype] == \
    [dtypes.float64, dtypes.int64, dtypes.int16, dtypes.int8, dtypes.uint8, dtypes.float16, dtypes.bfloat16]


@pytest.fixture
def float64_default() -> Iterator[None]:
  dtypes.default_float = dtypes.float64
  try: yield
  finally: dtypes.default_float = dtypes.float32


@pytest.mark.usefixtures("float64_default")
def test_default_float_is_settable() -> None:
  made = [Tensor(1.5), Tensor([1.0, 2.0]), Tensor.rand(3), Tensor.randn(2), Tensor.ones(2), Tensor.linspace(0, 1, 5), Tensor.arange(0.5, 2),
          Tensor([1, 2]) / Tensor([3, 4]), Tensor([1, 2]) * 0.5, Tensor([1, 2]).mean(), Tensor([1, 2]).exp()]
  assert all(t.dtype == dtypes.float64 for t in made), [t.dtype for t in made]
  np.testing.assert_equal((Tensor([1, 2]) / 3).numpy(), np.array([1, 2]) / 3)  # divided in float64


def test_default_int_is_settable() -> None:
  dtypes.default_int = dtypes.int64
  try: assert Tensor(3).dtype == Tensor.arange(3).dtype == (Tensor([True]) + 1).dtype == dtypes.int64
  finally: dtypes.default_int = dtypes.int32


def test_numpy_arrays_keep_their_dtype() -> None:
  for dt in dtypes.all: assert Tensor(np.zeros(2, dt.np)).dtype == dt
  assert Tensor(np.random.rand(3)).dtype == dtypes.float64 and Tensor([0.5]).dtype == dtypes.float32 and Tensor([3]).dtype == dtypes.int64
  np.testing.assert_equal(Tensor(np.array([0.1, 1e300])).numpy(), [0.1, 1e300])


def _edges(dt: DType, n: int = 12) -> np.ndarray:
  """Values at both ends of dt's range and around 0, so that sums and products wrap."""
  lo, hi = dtypes.min(dt), dtypes.max(dt)
  return np.array([lo, lo + 1, hi, hi - 1, 0, 1, 2, 3, 100 % (hi + 1), hi // 2 + 1, lo // 2, 7][:n], dtype=dt.np)


@pytest.mark.usefixtures("each_device")
@pytest.mark.parametrize("dt", INTS, ids=lambda d: d.name)
def test_int_arithmetic_wraps(dt: DType) -> None:
  a, b = _edges(dt), np.roll(_edges(dt), 3)
  with np.errstate(over="ignore"): want = [np.stack([a + b, a - b, a * b, -a, np.maximum(a, b)]), np.stack([a < b, a == b, a >= b])]
  x, y = Tensor(a), Tensor(b)
  got = [Tensor.stack(x + y, x - y, x * y, -x, x.maximum(y)), Tensor.stack(x < y, x == y, x >= y)]  # one kernel each
  for g, w in zip(got, want):
    assert g.dtype.np == w.dtype
    np.testing.assert_array_equal(g.numpy(), w)


@pytest.mark.parametrize("dt", [d for d in INTS if d in TORCH_ARITH], ids=lambda d: d.name)
def test_int_ops_match_torch(dt: DType) -> None:
  lo, hi = max(dtypes.min(dt), -1000), min(dtypes.max(dt), 1000)
  helper_test_op([(3, 5), (3, 5)], lambda a, b: (a * b + a - b, a // (b.abs() + 1), a % (b.abs() + 1)), dtype=dt, low=lo, high=hi)
  helper_test_op([(4, 6)], lambda a: (a.sum(0), a.sum(), a.amax(1), a.amin(0), a & 0x55, a | 3, a ^ a.flip(0), ~a),
                 lambda a: (a.sum(0), a.sum(), a.max(1), a.min(0), a & 0x55, a | 3, a ^ a.flip(0), ~a), dtype=dt, low=lo, high=hi)


@pytest.mark.parametrize("dt", [dtypes.uint16, dtypes.uint32, dtypes.uint64], ids=lambda d: d.name)
def test_unsigned_ops_match_numpy(dt: DType) -> None:
  a, b = _edges(dt), np.roll(_edges(dt), 5) | 1
  x, y = Tensor(a), Tensor(b)
  with np.errstate(over="ignore"):
    cases = [(x // y, a // b), (x % y, a % b), (x & y, a & b), (x | y, a | b), (x ^ y, a ^ b), (~x, ~a), (x >> 3, a >> 3), (x << 2, a << 2),
             (x.max(), a.max()), (x.min(), a.min()), (x.sum(), a.astype(np.int64).sum())]
  for i, (g, w) in enumerate(cases): np.testing.assert_array_equal(g.numpy(), w, err_msg=f"case {i}")
  assert x.sum().dtype == dtypes.int64  # as torch: every int sum is int64


@pytest.mark.usefixtures("each_device")
@pytest.mark.parametrize("dt", [d for d in dtypes.all if d != dtypes.bool], ids=lambda d: d.name)
def test_casts(dt: DType) -> None:
  vals = np.array([-3.75, -1.0, -0.5, 0.0, 0.5, 1.0, 2.5, 100.25, 127.0], np.float32)
  if dt.is_unsigned: vals = np.abs(vals)
  x = Tensor(vals).cast(dt)
  want = vals.astype(dt.np)
  np.testing.assert_array_equal(x.numpy(), want)
  np.testing.assert_array_equal(x.cast(dtypes.bool).numpy(), want != 0)
  np.testing.assert_array_equal(Tensor(np.array([True, False])).cast(dt).numpy(), np.array([1, 0], dt.np))


@pytest.mark.usefixtures("each_device")
def test_float64_matches_torch() -> None:
  helper_test_op([(3, 5), (3, 5)], lambda a, b: (a * b - a / b, (a * 1e-300) * 1e-10, a.maximum(b), (a < b)), dtype=dtypes.float64, grad=False)
  helper_test_op([(3, 5)], lambda a: (a.exp(), a.abs().log(), a.abs().sqrt(), a.sin(), a.sum(1), a.amax(0), a.trunc()),
                 lambda a: (a.exp(), a.abs().log(), a.abs().sqrt(), a.sin(), a.sum(1), a.max(0), a.trunc()),
                 dtype=dtypes.float64, low=-50, high=50, grad=False, atol=1e-12, rtol=1e-12)


@pytest.mark.usefixtures("each_device")
@pytest.mark.parametrize("src,dst", [(dtypes.float32, dtypes.int32), (dtypes.float64, dtypes.uint64), (dtypes.int16, dtypes.float16),
                                     (dtypes.bfloat16, dtypes.uint16), (dtypes.int8, dtypes.uint8), (dtypes.uint32, dtypes.float32)],
                         ids=lambda d: d.name)
def test_bitcast_round_trips(src: DType, dst: DType) -> None:
  bits = np.random.default_rng(0).integers(0, 256, 8 * src.itemsize, dtype=np.uint8)
  if src.is_float:  # finite values, then the special ones; a NaN's payload is not kept through float32 math, so its bits are not compared
    a = np.nan_to_num(bits.view(src.np), nan=1.0, posinf=2.0, neginf=-2.0)
    a[:3] = [-0.0, np.inf, -np.inf]
  else: a = bits.view(src.np)
  x = Tensor(a)
  np.testing.assert_array_equal(x.bitcast(dst).numpy().view(np.uint8), a.view(np.uint8))
  np.testing.assert_array_equal(x.bitcast(dst).bitcast(src).numpy().view(np.uint8), a.view(np.uint8))
  np.testing.assert_array_equal((x.bitcast(dst) + 0).bitcast(src).numpy().view(np.uint8), a.view(np.uint8))  # through a kernel's value


def test_bitcast_refuses_bad_calls() -> None:
  with pytest.raises(ValueError, match="changes the item size"): Tensor([1.0]).bitcast(dtypes.int64)
  with pytest.raises(TypeError, match="bitcast of bool"): Tensor([True]).bitcast(dtypes.uint8)


@pytest.mark.usefixtures("each_device")
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.float16], ids=lambda d: d.name)
def test_copysign_sees_nan_and_negative_zero_signs(dt: DType) -> None:
  mag = [1.0, -2.0, 3.0, -4.0, 0.0, -0.0, math.nan, 5.0]
  sign = [-0.0, 0.0, math.nan, -math.nan, -1.0, 1.0, -1.0, -math.inf]
  helper_test_op(None, torch.copysign, Tensor.copysign, vals=[mag, sign], dtype=dt, grad=False)
  got = Tensor(np.array(mag, dt.np)).copysign(Tensor(np.array(sign, dt.np))).numpy()
  np.testing.assert_array_equal(np.signbit(got), np.signbit(np.copysign(np.array(mag), np.array(sign))))  # the zeros' and NaNs' signs too


def test_opencl_without_fp64_says_so() -> None:
  ast = create_schedule((Tensor(np.ones(4)) + 1).uop, "CPU")[0][0].ast
  k = Kernel(ast, DeviceCaps(has_local=True, threads=1, simd_width=4, max_local=256, shared_bytes=1 << 15))
  assert "#pragma OPENCL EXTENSION cl_khr_fp64 : enable" in OpenCLRenderer().render(k)
  with pytest.raises(NotImplementedError, match="no float64"): OpenCLRenderer(fp64=False).render(k)
