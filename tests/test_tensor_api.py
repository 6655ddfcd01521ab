"""The Tensor API around the ops: creation, properties, conversion, devices, and bad calls failing clearly at the call."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from ops_support import check, oob_guard, rand  # noqa: F401  (oob_guard: the autouse out-of-bounds guard, here too)

from tinytune import Tensor, dtypes
from tinytune.dtype import DType
from tinytune.runtime import Device

# ***** creation *****


@pytest.mark.parametrize("data,dtype,expected", [
  ([1, 2, 3], dtypes.int64, np.array([1, 2, 3])),
  ([1.5, 2.0], dtypes.float32, np.array([1.5, 2.0], np.float32)),
  ([[True, False]], dtypes.bool, np.array([[True, False]])),
  ([], dtypes.float32, np.zeros(0, np.float32)),
  (np.arange(6, dtype=np.int32).reshape(2, 3), dtypes.int32, np.arange(6).reshape(2, 3)),
  (np.arange(6, dtype=np.uint8), dtypes.uint8, np.arange(6)),
  (np.array([1.5, -2.5]), dtypes.float64, np.array([1.5, -2.5])),  # an array keeps its dtype, as torch.from_numpy
  ([1.5, 2.5], dtypes.float32, np.array([1.5, 2.5])),  # a list of floats gives default_float
  (np.array([1.5, -2.5], np.float16), dtypes.float16, np.array([1.5, -2.5])),
  (np.array([1.5, -2.5, 3e38], dtypes.bfloat16.np), dtypes.bfloat16, np.array([1.5, -2.5, 3e38])),
  (dtypes.bfloat16.np(0.1), dtypes.bfloat16, np.array(0.10009765625)),
  (np.array([1, 2], np.int16), dtypes.int16, np.array([1, 2])),
  (np.array([1, 2**32 - 1], np.uint32), dtypes.uint32, np.array([1, 2**32 - 1])),
  (3, dtypes.int32, np.array(3)),
  (2 ** 40, dtypes.int64, np.array(2 ** 40)),  # too big for int32
  (-2 ** 31, dtypes.int32, np.array(-2 ** 31)),
  (2.5, dtypes.float32, np.array(2.5)),
  (True, dtypes.bool, np.array(True)),
  (np.float32(1.25), dtypes.float32, np.array(1.25)),
  (np.int64(7), dtypes.int64, np.array(7)),
])
def test_tensor_from_data(data: Any, dtype: DType, expected: np.ndarray) -> None:
  t = Tensor(data)
  assert t.dtype == dtype and t.shape == expected.shape and t.device == Device.DEFAULT
  check(t, expected.astype(dtype.np), dtype)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool])
@pytest.mark.parametrize("spelling", ["dtype", "name", "numpy"])
def test_tensor_with_dtype(dtype: DType, spelling: str) -> None:
  arg = {"dtype": dtype, "name": dtype.name, "numpy": dtype.np}[spelling]
  for data in ([0, 1, 2], np.array([0.0, 1.0, 2.0]), 1):
    t = Tensor(data, dtype=arg)
    assert t.dtype == dtype
    check(t, np.asarray(data).astype(dtype.np), dtype)


def test_tensor_from_tensor_and_truncating_casts() -> None:
  a = Tensor([1.7, -1.7])
  assert Tensor(a).dtype == dtypes.float32
  check(Tensor(a, dtype=dtypes.int32), [1, -1], dtypes.int32)
  check(Tensor([1.7, -1.7], dtype=dtypes.int32), [1, -1], dtypes.int32)
  check(Tensor(2.9, dtype="int64"), 2, dtypes.int64)
  check(Tensor(True, dtype=dtypes.float32), 1.0, dtypes.float32)


def test_tensor_device() -> None:
  assert Tensor([1.0], device="cpu").device == "CPU"
  assert Tensor([1.0], device="CPU:0").device == "CPU"
  t = Tensor([1.0, 2.0], device="CPU")
  assert t.to("cpu") is t
  check(t.to("CPU"), [1.0, 2.0])


@pytest.mark.parametrize("dtype", [None, dtypes.float16, dtypes.bfloat16, dtypes.int32, dtypes.uint8, dtypes.bool])
def test_zeros_ones_full(dtype: DType | None) -> None:
  npdt = (dtype or dtypes.float32).np
  check(Tensor.zeros(2, 3, dtype=dtype), np.zeros((2, 3), npdt), dtype or dtypes.float32)
  check(Tensor.ones((2, 3), dtype=dtype), np.ones((2, 3), npdt), dtype or dtypes.float32)
  check(Tensor.zeros([4], dtype=dtype), np.zeros(4, npdt), dtype or dtypes.float32)
  check(Tensor.ones(dtype=dtype), np.ones((), npdt), dtype or dtypes.float32)
  check(Tensor.full((3, 1), 1, dtype=dtype), np.full((3, 1), 1, npdt), dtype or dtypes.int32)


def test_full_infers_dtype_from_value() -> None:
  check(Tensor.full((2,), 2.5), [2.5, 2.5], dtypes.float32)
  check(Tensor.full(2, 3), [3, 3], dtypes.int32)
  check(Tensor.full((2,), True), [True, True], dtypes.bool)
  check(Tensor.full((), -1.0), -1.0, dtypes.float32)
  check(Tensor.full((2, 2), 7, device="cpu") + 1, np.full((2, 2), 8), dtypes.int32)


@pytest.mark.parametrize("args,kwargs", [((5,), {}), ((2, 7), {}), ((1, 2, 0.25), {}), ((5, 0, -2), {}), ((-3, 3), {}), ((0.5, 3), {}),
                                         ((4,), {"dtype": dtypes.float32}), ((0, 10, 3), {"dtype": dtypes.int64}), ((3,), {"dtype": "float16"}),
                                         ((3,), {"dtype": "bfloat16"}), ((0,), {})])
def test_arange(args: tuple, kwargs: dict) -> None:
  dt = kwargs.get("dtype")
  t = Tensor.arange(*args, **kwargs)
  exp = np.arange(*args)
  exp_dt = dtypes.from_any(dt) if dt else dtypes.int32 if exp.dtype.kind == "i" else dtypes.float32
  check(t, exp.astype(exp_dt.np), exp_dt)


def test_eye() -> None:
  check(Tensor.eye(3), np.eye(3, dtype=np.float32), dtypes.float32)
  check(Tensor.eye(2, 4), np.eye(2, 4, dtype=np.float32), dtypes.float32)
  check(Tensor.eye(3, dtype=dtypes.int32), np.eye(3, dtype=np.int32), dtypes.int32)
  check(Tensor.eye(2, dtype=dtypes.bool), np.eye(2, dtype=bool), dtypes.bool)


@pytest.mark.parametrize("fn", [lambda: Tensor.rand(3, 4), lambda: Tensor.randn(3, 4), lambda: Tensor.uniform(3, 4, low=-2.0, high=5.0)])
def test_random_creation_is_reproducible(fn: Callable[[], Tensor]) -> None:
  Tensor.manual_seed(123)
  a = fn().numpy()
  b = fn().numpy()
  Tensor.manual_seed(123)
  c = fn().numpy()
  assert a.shape == (3, 4) and a.dtype == np.float32
  np.testing.assert_array_equal(a, c)
  assert not np.array_equal(a, b)


def test_random_distributions() -> None:
  Tensor.manual_seed(0)
  r = Tensor.rand(100, 100).numpy()
  assert r.min() >= 0 and r.max() < 1 and abs(r.mean() - 0.5) < 0.02
  n = Tensor.randn(100, 100).numpy()
  assert abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05
  u = Tensor.uniform(100, 100, low=-2.0, high=6.0).numpy()
  assert u.min() >= -2 and u.max() < 6 and abs(u.mean() - 2) < 0.1
  assert Tensor.rand(2, dtype=dtypes.float16).dtype == dtypes.float16
  assert Tensor.randn((2, 3)).shape == (2, 3)


def test_like_constructors() -> None:
  a = Tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
  check(a.zeros_like(), np.zeros((2, 3), np.int32), dtypes.int32)
  check(a.ones_like(), np.ones((2, 3), np.int32), dtypes.int32)
  check(a.full_like(7), np.full((2, 3), 7, np.int32), dtypes.int32)
  check(a.full_like(0.5, dtype=dtypes.float32), np.full((2, 3), 0.5, np.float32), dtypes.float32)
  check(a.ones_like(dtype=dtypes.bool), np.ones((2, 3), bool), dtypes.bool)
  f = Tensor.zeros(2, 3, dtype=dtypes.float16)
  for r in (f.rand_like(), f.randn_like()):
    assert r.shape == (2, 3) and r.dtype == dtypes.float16
  assert Tensor.zeros(4).rand_like(dtype=dtypes.float32).numpy().shape == (4,)


# ***** properties and conversion *****

def test_properties() -> None:
  t = Tensor(rand(2, 3, 4))
  assert t.shape == (2, 3, 4) and t.ndim == 3 and t.numel() == 24 and len(t) == 2
  assert t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
  assert t.dtype == dtypes.float32 and t.device == Device.DEFAULT
  assert repr(t) == f"<Tensor (2, 3, 4) float32 on {Device.DEFAULT}>"
  s = Tensor(1.5)
  assert s.shape == () and s.ndim == 0 and s.numel() == 1


def test_numpy_tolist_item() -> None:
  a = rand(2, 3)
  t = Tensor(a)
  out = t.numpy()
  np.testing.assert_array_equal(out, a)
  out[0, 0] = 99.0  # a copy: writing it leaves the tensor alone
  assert t.numpy()[0, 0] == a[0, 0]
  assert Tensor(a).T.numpy().flags.c_contiguous
  assert t.tolist() == a.tolist()
  assert Tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
  assert Tensor([True]).tolist() == [True]
  assert Tensor(2.5).item() == 2.5 and isinstance(Tensor(2.5).item(), float)
  assert Tensor([[3]]).item() == 3 and isinstance(Tensor([[3]]).item(), int)
  assert Tensor(True).item() is True
  assert (Tensor(a).sum() * 0 + 4).item() == 4.0


def test_realize_and_contiguous_keep_values() -> None:
  a = rand(3, 4)
  t = (Tensor(a) * 2).realize()
  check(t, a * 2)
  check(t.T.contiguous(), (a * 2).T)
  check(t + 1, a * 2 + 1)
  u = Tensor(a).T
  assert u.contiguous().shape == (4, 3)
  check(u.contiguous().realize() * u, a.T * a.T)


def test_tensors_are_immutable_values() -> None:
  a = Tensor([1.0, 2.0])
  b = a + 1
  a2 = a * 3
  check(a, [1.0, 2.0])
  check(b, [2.0, 3.0])
  check(a2, [3.0, 6.0])
  check(b, [2.0, 3.0])


def test_truth_value_and_hash() -> None:
  t = Tensor([1.0])
  with pytest.raises(TypeError, match="ambiguous"): bool(t)
  with pytest.raises(TypeError, match="ambiguous"):
    if t == 1.0: pass
  assert len({t, Tensor([1.0])}) == 2  # hashable by identity, although == builds a Tensor


# ***** bad calls fail at the call with a clear message *****

BAD_CALLS: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
  ("add shape mismatch", lambda: Tensor.zeros(3, 4) + Tensor.zeros(3), ValueError, r"shapes \(3, 4\) and \(3,\) do not broadcast"),
  ("where shape mismatch", lambda: Tensor([True, False]).where(Tensor.zeros(3), 0), ValueError, "do not broadcast"),
  ("add a string", lambda: Tensor([1.0]) + "a", TypeError, "cannot combine a Tensor with str"),
  ("add a list", lambda: Tensor([1.0]) * [1.0], TypeError, "cannot combine a Tensor with list"),
  ("add an ndarray", lambda: Tensor([1.0]) + np.ones(1), TypeError, "cannot combine a Tensor with ndarray"),
  ("ndarray plus tensor", lambda: np.ones(1) + Tensor([1.0]), TypeError, "cannot combine a Tensor with ndarray"),
  ("subtract bools", lambda: Tensor([True]) - Tensor([False]), TypeError, "bool"),
  ("float and", lambda: Tensor([1.0]) & Tensor([2.0]), TypeError, "bitwise and needs bool or int tensors, got float32"),
  ("float or scalar", lambda: Tensor([1.0], dtype=dtypes.float16) | True, TypeError, "bitwise or needs bool or int tensors, got float16"),
  ("int xor float", lambda: Tensor([1]) ^ 1.5, TypeError, "bitwise xor needs bool or int tensors, got float32"),
  ("float invert", lambda: ~Tensor([1.0]), TypeError, "bitwise not needs a bool or int tensor, got float32"),
  ("reduce axis out of range", lambda: Tensor.zeros(2, 3).sum(2), IndexError, "axis 2 is out of range for 2 dims"),
  ("reduce negative axis", lambda: Tensor.zeros(2, 3).max(-3), IndexError, "axis -3 is out of range"),
  ("reduce axis tuple", lambda: Tensor.zeros(2, 3).mean((0, 5)), IndexError, "axis 5 is out of range"),
  ("reduce float axis", lambda: Tensor.zeros(2, 3).sum(1.0), TypeError, "an axis is an int"),
  ("argmax tuple axis", lambda: Tensor.zeros(2, 3).argmax((0, 1)), TypeError, "an axis is an int"),
  ("softmax axis", lambda: Tensor.zeros(2, 3).softmax(2), IndexError, "axis 2 is out of range"),
  ("0-d axis 1", lambda: Tensor(1.0).sum(1), IndexError, "axis 1 is out of range for 0 dims"),
  ("reshape count", lambda: Tensor.zeros(3, 4).reshape(5), ValueError, r"cannot reshape \(3, 4\) \(12 elements\) to \(5,\)"),
  ("reshape two -1", lambda: Tensor.zeros(4).reshape(-1, -1), ValueError, r"bad shape \(-1, -1\)"),
  ("reshape -1 no fit", lambda: Tensor.zeros(5).reshape(2, -1), ValueError, "cannot reshape"),
  ("reshape float", lambda: Tensor.zeros(4).reshape(2.0, 2), ValueError, "bad shape"),
  ("reshape negative", lambda: Tensor.zeros(4).reshape(-2, -2), ValueError, "bad shape"),
  ("permute repeat", lambda: Tensor.zeros(2, 3).permute(0, 0), ValueError, r"permute: duplicate dims are not allowed, got \(0, 0\)"),
  ("permute short", lambda: Tensor.zeros(2, 3).permute(0), ValueError, r"permute needs one dim per dim of the tensor \(2\), got 1"),
  ("permute oob", lambda: Tensor.zeros(2, 3).permute(0, 2), IndexError, "axis 2 is out of range"),
  ("transpose 1-d", lambda: Tensor.zeros(3).transpose(), IndexError, "axis -2 is out of range for 1 dims"),
  ("expand", lambda: Tensor.zeros(2).expand(3), ValueError, r"cannot expand \(2,\) to \(3,\)"),
  ("expand fewer dims", lambda: Tensor.zeros(1, 2).expand(2), ValueError, "fewer dims"),
  ("expand negative", lambda: Tensor.zeros(1).expand(-2), ValueError, r"cannot expand \(1,\) to \(-2,\)"),
  ("pad entries", lambda: Tensor.zeros(2).pad(((1, 1), (1, 1))), ValueError, r"pad needs one entry per dim \(1\), got 2"),
  ("pad flat odd", lambda: Tensor.zeros(2).pad((1,)), ValueError, "Padding length must be divisible by 2"),
  ("pad crops too much", lambda: Tensor.zeros(3).pad(((-4, 1),)), ValueError, "out of bounds"),
  ("shrink oob", lambda: Tensor.zeros(2).shrink(((0, 3),)), ValueError, r"shrink \(\(0, 3\),\) is out of bounds for \(2,\)"),
  ("shrink reversed", lambda: Tensor.zeros(2).shrink(((2, 1),)), ValueError, "out of bounds"),
  ("shrink entries", lambda: Tensor.zeros(2, 2).shrink(((0, 1),)), ValueError, "shrink needs one entry per dim"),
  ("flip oob", lambda: Tensor.zeros(2).flip(1), IndexError, "axis 1 is out of range"),
  ("flip twice", lambda: Tensor.zeros(2).flip(0, -1), ValueError, "dim 0 appears multiple times in the list of dims"),
  ("squeeze oob", lambda: Tensor.zeros(1, 2).squeeze(2), IndexError, "axis 2 is out of range"),
  ("unsqueeze oob", lambda: Tensor.zeros(1, 2).unsqueeze(4), IndexError, "axis 4 is out of range for 3 dims"),
  ("flatten oob", lambda: Tensor.zeros(1, 2).flatten(3), IndexError, "axis 3 is out of range"),
  ("cat shapes", lambda: Tensor.zeros(1, 2).cat(Tensor.zeros(1, 1)), ValueError, "cat needs equal shapes except along dim 0"),
  ("cat ndim", lambda: Tensor.zeros(1, 2).cat(Tensor.zeros(2)), ValueError, "cat needs equal shapes"),
  ("cat 0-d", lambda: Tensor(1.0).cat(Tensor(2.0)), IndexError, r"zero-dimensional tensor \(at position 0\) cannot be concatenated"),
  ("cat non-tensor", lambda: Tensor.zeros(2).cat([1.0]), TypeError, "cat needs Tensors"),
  ("cat dim", lambda: Tensor.zeros(2).cat(Tensor.zeros(2), dim=1), IndexError, "axis 1 is out of range"),
  ("stack shapes", lambda: Tensor.stack([Tensor.zeros(1), Tensor.zeros(2)]), ValueError, r"but got \[1\] at entry 0 and \[2\] at entry 1"),
  ("stack empty", lambda: Tensor.stack([]), ValueError, "stack expects a non-empty TensorList"),
  ("stack non-tensor", lambda: Tensor.stack([Tensor(1.0), 2.0]), TypeError, "stack needs Tensors"),
  ("stack dim", lambda: Tensor.stack([Tensor.zeros(1)], dim=3), IndexError, "axis 3 is out of range for 2 dims"),
  ("getitem int oob", lambda: Tensor.zeros(3, 4)[3], IndexError, "index 3 is out of bounds for dimension 0 with size 3"),
  ("getitem neg oob", lambda: Tensor.zeros(3, 4)[:, -5], IndexError, "index -5 is out of bounds for dimension 1 with size 4"),
  ("getitem too many", lambda: Tensor.zeros(3)[0, 0], (ValueError, IndexError), "too many indices"),
  ("getitem 0-d", lambda: Tensor(1.0)[0], (ValueError, IndexError), "too many indices"),
  ("getitem two ellipsis", lambda: Tensor.zeros(3)[..., ...], IndexError, "single ellipsis"),
  ("getitem float", lambda: Tensor.zeros(3)[1.0], IndexError, "unsupported index 1.0"),
  ("getitem bool", lambda: Tensor.zeros(3)[True], IndexError, "unsupported index True"),
  ("getitem list oob", lambda: Tensor.zeros(3)[[0, 3]], IndexError, "index 3 is out of bounds for dimension 0 with size 3"),
  ("getitem float list", lambda: Tensor.zeros(3)[[0.5]], IndexError, "indices are ints or bools, got float64"),
  ("getitem float tensor", lambda: Tensor.zeros(3)[Tensor([0.5])], IndexError, "tensors used as indices must be int or bool tensors"),
  ("unknown dtype", lambda: Tensor([1.0], dtype="float64x"), TypeError, "unsupported dtype 'float64x'; use one of bool, int8, uint8"),
  ("numpy dtype", lambda: Tensor([1], dtype=np.complex64), TypeError, "unsupported dtype"),
  ("cast dtype", lambda: Tensor([1.0]).cast("complex64"), TypeError, "unsupported dtype 'complex64'"),
  ("zeros dtype", lambda: Tensor.zeros(2, dtype="complex128"), TypeError, "unsupported dtype"),
  ("string data", lambda: Tensor("abc"), TypeError, "unsupported dtype"),
  ("None data", lambda: Tensor(None), TypeError, "cannot make a Tensor from NoneType"),
  ("ragged data", lambda: Tensor([[1.0], [1.0, 2.0]]), ValueError, "inhomogeneous"),
  ("unknown device", lambda: Tensor([1.0], device="GPU"), ValueError, "unknown device 'GPU'; available: CPU"),
  ("to unknown device", lambda: Tensor([1.0]).to("TPU"), ValueError, "unknown device 'TPU'"),
  ("negative shape", lambda: Tensor.zeros(2, -1), RuntimeError, r"Dimension size must be non-negative, got \(2, -1\)"),
  ("float shape", lambda: Tensor.full(2.5, 1.0), ValueError, "a shape is ints"),
  ("rand shape", lambda: Tensor.rand(-1), ValueError, "Dimension size must be non-negative"),
  ("arange step", lambda: Tensor.arange(0, 5, 0), RuntimeError, "step must be nonzero"),
  ("item", lambda: Tensor([1.0, 2.0]).item(), ValueError, r"item\(\) needs a tensor with one element, this one has shape \(2,\)"),
  ("len 0-d", lambda: len(Tensor(1.0)), TypeError, "len"),
  ("clip", lambda: Tensor([1.0]).clip(), ValueError, "clip needs min_ or max_"),
  ("gelu", lambda: Tensor([1.0]).gelu("fast"), ValueError, "gelu approximate is 'none' or 'tanh', got 'fast'"),
  ("matmul inner", lambda: Tensor.zeros(3, 4) @ Tensor.zeros(3, 4), ValueError, r"matmul shapes \(3, 4\) and \(3, 4\) do not match \(inner 4 != 3\)"),
  ("matmul 1-d inner", lambda: Tensor.zeros(3) @ Tensor.zeros(4), ValueError, "inner 3 != 4"),
  ("matmul batch", lambda: Tensor.zeros(2, 3, 4) @ Tensor.zeros(3, 4, 5), ValueError, r"batch dims \(2,\) and \(3,\) do not broadcast"),
  ("matmul 0-d", lambda: Tensor(1.0) @ Tensor([1.0]), ValueError, "matmul needs tensors of at least one dim"),
  ("matmul non-tensor", lambda: Tensor([1.0]) @ [1.0], TypeError, "matmul needs a Tensor, got list"),
  ("conv2d ndim", lambda: Tensor.zeros(1, 3, 3).conv2d(Tensor.zeros(1, 1, 3, 3)), ValueError, r"conv2d needs a \(N, C, H, W\) input"),
  ("conv2d channels", lambda: Tensor.zeros(1, 4, 5, 5).conv2d(Tensor.zeros(6, 2, 3, 3)), ValueError,
   r"conv2d: 4 input channels, weight \(6, 2, 3, 3\) and groups 1 do not match"),
  ("conv2d groups", lambda: Tensor.zeros(1, 4, 5, 5).conv2d(Tensor.zeros(6, 2, 3, 3), groups=3), ValueError, "groups 3 do not match"),
  ("conv2d groups 0", lambda: Tensor.zeros(1, 4, 5, 5).conv2d(Tensor.zeros(6, 2, 3, 3), groups=0), ValueError, "groups is a positive int"),
  ("conv2d bias", lambda: Tensor.zeros(1, 1, 3, 3).conv2d(Tensor.zeros(2, 1, 3, 3), bias=Tensor.zeros(3)), ValueError,
   r"conv2d bias needs shape \(2,\), got \(3,\)"),
  ("conv2d kernel too big", lambda: Tensor.zeros(1, 1, 3, 3).conv2d(Tensor.zeros(1, 1, 4, 4)), ValueError, r"window \(4, 4\) .* not fit input 3x3"),
  ("conv2d stride 0", lambda: Tensor.zeros(1, 1, 3, 3).conv2d(Tensor.zeros(1, 1, 1, 1), stride=0), ValueError, "expected an int >= 1"),
  ("conv2d dilation 0", lambda: Tensor.zeros(1, 1, 3, 3).conv2d(Tensor.zeros(1, 1, 1, 1), dilation=(1, 0)), ValueError, "expected an int >= 1"),
  ("conv2d padding", lambda: Tensor.zeros(1, 1, 3, 3).conv2d(Tensor.zeros(1, 1, 1, 1), padding=(1, 2, 3)), ValueError,
   r"conv2d padding is an int, 2 ints or 4 ints, got \(1, 2, 3\)"),
  ("conv2d triple", lambda: Tensor.zeros(1, 1, 3, 3).conv2d(Tensor.zeros(1, 1, 1, 1), stride=(1, 2, 3)), ValueError, "or a pair of them"),
  ("max_pool2d 1-d", lambda: Tensor.zeros(3).max_pool2d(2), ValueError, r"max_pool2d needs a tensor of at least 2 dims \(..., H, W\), got \(3,\)"),
  ("avg_pool2d 1-d", lambda: Tensor.zeros(3).avg_pool2d(2), ValueError, "avg_pool2d needs a tensor of at least 2 dims"),
  ("max_pool2d kernel 0", lambda: Tensor.zeros(1, 3, 3).max_pool2d(0), ValueError, "expected an int >= 1"),
  ("max_pool2d too big", lambda: Tensor.zeros(1, 3, 3).max_pool2d(4), ValueError, "does not fit"),
  ("layernorm axis", lambda: Tensor.zeros(2, 3).layernorm(axis=3), IndexError, "axis 3 is out of range"),
]


@pytest.mark.parametrize("fn,exc,match", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_raise_clearly(fn: Callable[[], Any], exc: type[Exception], match: str) -> None:
  with pytest.raises(exc, match=match): fn()


def test_bad_calls_fail_before_any_kernel_runs() -> None:
  from tinytune import GlobalCounters
  GlobalCounters.reset()
  for _, fn, exc, _ in BAD_CALLS:
    with pytest.raises(exc): fn()
  assert GlobalCounters.kernel_count == 0
