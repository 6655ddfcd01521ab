"""Indexing, gather/scatter, running reductions, sorting, movement and creation ops against PyTorch (one line per case),
bad calls failing like torch, and hypothesis properties of cumsum, indexing and sort against NumPy."""
from __future__ import annotations

import math
import shutil
import subprocess
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_support import FUZZ, GETITEM_CASES, bench_module, examples, oob_guard  # noqa: F401  (oob_guard: the autouse out-of-bounds guard, here too)
from oracle import helper_test_op, torch

from tinytune import Tensor, TinyJit, dtypes, nn, no_grad

F = torch.nn.functional


def idx(*data: Any) -> tuple[Any, Tensor]:
  """The same int64 index for torch and for tinytune."""
  a = np.array(data[0] if len(data) == 1 else data, dtype=np.int64)
  return torch.from_numpy(a), Tensor(a)


def both(fn: Callable[..., Any], *args: Any) -> tuple[Callable, Callable]:
  """torch and tinytune versions of x -> fn(x, index...) for index arguments built by idx()."""
  def side(k: int) -> Callable: return lambda x: fn(x, *[a[k] if isinstance(a, tuple) else a for a in args])
  return side(0), side(1)


# ***** indexing with Tensors and lists *****
I1, I2, INEG = idx(2, 0, 2), idx([[0, 1], [3, 3]]), idx(-1, 0, -4)


def test_index_by_tensor() -> None:
  helper_test_op([(4, 5)], *both(lambda x, i: x[i], I1))
  helper_test_op([(4, 5)], *both(lambda x, i: x[i], I2))  # a 2-d index adds its dims
  helper_test_op([(4, 5)], *both(lambda x, i: x[i], INEG))  # negative indices count from the end
  helper_test_op([(4, 5)], *both(lambda x, i: x[:, i], I1))
  helper_test_op([(4, 5, 3)], *both(lambda x, i: x[i, 1:3], I1))
  helper_test_op([(4, 5, 3)], *both(lambda x, i: x[None, ..., i], I1))
  helper_test_op([(4, 5, 3)], *both(lambda x, i, j: x[i, j], I1, idx(1, 4, 0)))  # two indices pair up
  helper_test_op([(4, 5, 3)], *both(lambda x, i, j: x[i, :, j], I1, idx(1, 2, 0)))  # apart: their dims go first, like torch
  helper_test_op([(4, 5, 3)], *both(lambda x, i, j: x[1:, i, j], idx([[0], [1]]), idx(1, 2, 0)))  # broadcast together
  helper_test_op([(4, 5, 3)], *both(lambda x, i: x[2, i, ::2], I1))
  helper_test_op([(4, 5)], *both(lambda x, i: x[i], idx([])))  # an empty index
  helper_test_op([(4, 0)], *both(lambda x, i: x[i], I1))  # an empty dim
  helper_test_op([(1, 5)], *both(lambda x, i: x[i], idx(0, 0, 0)))
  helper_test_op([(4, 5)], *both(lambda x, i: x[i], I1), dtype=dtypes.int32)
  helper_test_op([(2, 2)], *both(lambda x, i: x[i], idx(np.array([1, 0]).reshape((2,) + (1,) * 7))))  # 9-d: loop g8 and the read's index
  helper_test_op([(4, 5)], *both(lambda x, i: x[i], I1), dtype=dtypes.bool)
  helper_test_op([(4, 5)], *both(lambda x, i: x[i], I1), dtype=dtypes.float16)
  helper_test_op(None, *both(lambda x, i: x[i], I1), vals=[[math.inf, math.nan, -math.inf]])  # inf and NaN elsewhere stay out


def test_index_by_list_and_mask() -> None:
  helper_test_op([(4, 5)], lambda x: x[[0, 2]])
  helper_test_op([(4, 5)], lambda x: x[[-1, 0], [2, -5]])
  helper_test_op([(4, 5, 3)], lambda x: x[[0, 2], 1:, [[1], [2]]])
  helper_test_op([(4, 5)], lambda x: x[:, [True, False, True, True, False]])
  helper_test_op([(4, 5)], lambda x: x[x > 0])  # a bool mask realizes to find its True positions
  helper_test_op([(4, 5, 2)], lambda x: x[x[..., 0] > 0])


# ***** writing: x[index] = value *****
def check_setitem(shape: tuple[int, ...], index: list[Any], value: Any, dtype: Any = dtypes.float32) -> None:
  """x[index] = value in torch and in tinytune on the same input; index is a list of items, each may be an idx() pair."""
  a = (np.arange(int(np.prod(shape))).reshape(shape) - 3).astype(dtype.np)
  t, x = torch.from_numpy(a.copy()), Tensor(a, dtype=dtype)
  def side(k: int) -> tuple[Any, ...]: return tuple(i[k] if isinstance(i, tuple) else i for i in index)
  t[side(0)] = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
  x[side(1)] = Tensor(value) if isinstance(value, np.ndarray) else value
  np.testing.assert_array_equal(x.numpy(), t.numpy())


def test_setitem() -> None:
  check_setitem((4, 5), [slice(1, 3)], 0.0)
  check_setitem((4, 5), [slice(None), slice(None, None, 2)], 7.5)
  check_setitem((4, 5), [1], np.arange(5, dtype=np.float32))  # a row
  check_setitem((4, 5), [None, Ellipsis, 1], np.arange(4, dtype=np.float32))  # None and Ellipsis, the value broadcast
  check_setitem((4, 5), [-1, slice(2, None)], np.ones((1, 1, 3), np.float32))  # leading 1s of the value are dropped, as torch does
  check_setitem((4, 5), [I1], np.arange(15, dtype=np.float32).reshape(3, 5))  # a place written twice: the last write wins
  check_setitem((4, 5), [slice(None), I1], 1.0)
  check_setitem((4, 5), [I1, idx(1, 4, 0)], np.array([1.0, 2.0, 3.0], np.float32))
  check_setitem((4, 5), [INEG], -1.0)  # negative indices count from the end
  check_setitem((4, 5, 3), [slice(1, None), idx(0, 1), slice(None, None, 2)], np.array([[5.0], [6.0]], np.float32))
  check_setitem((4, 5, 3), [I1, slice(None), idx(1, 2, 0)], np.arange(5, dtype=np.float32))  # apart: the index dims first
  check_setitem((4, 5), [[0, 2]], 3.0)  # a list
  check_setitem((4, 5), [[True, False, False, True]], 9.0)  # a bool mask
  check_setitem((4, 5), [idx([])], 1.0)  # an empty index writes nothing
  check_setitem((4, 5), [slice(1, 3), 2], 7, dtype=dtypes.int32)
  check_setitem((4, 5), [0], 2.7, dtype=dtypes.int32)  # cast to the tensor's dtype: truncated
  check_setitem((4, 5), [I1], True, dtype=dtypes.bool)
  check_setitem((4, 5), [slice(None, 2)], 0.1, dtype=dtypes.float16)
  a = np.arange(30, dtype=np.float32).reshape(6, 5)  # torch has no negative steps: numpy's result
  x, a[4:0:-3, ::-2] = Tensor(a), np.arange(6, dtype=np.float32).reshape(2, 3)
  x[4:0:-3, ::-2] = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
  np.testing.assert_array_equal(x.numpy(), a)


@pytest.mark.parametrize("index", GETITEM_CASES, ids=[str(i) for i in range(len(GETITEM_CASES))])
def test_setitem_basic_matches_numpy(index: Any) -> None:  # the basic indices x[index] reads, each written (negative steps too)
  a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
  x, value = Tensor(a), -1 - np.arange(a[index].size, dtype=np.float32).reshape(a[index].shape)
  a[index] = value
  x[index] = Tensor(value)
  np.testing.assert_array_equal(x.numpy(), a)


def test_setitem_in_place_and_out_of_range() -> None:
  x = Tensor([1.0, 2.0, 3.0, 4.0])
  x[0] = 5.0
  memory = x._memory
  with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 4"): x[Tensor([3, 9, -9])] = Tensor([6.0, 7.0, 8.0])
  assert x.tolist() == [5.0, 2.0, 3.0, 4.0]  # checked before anything is written, as torch
  x[Tensor([3])] = Tensor([6.0])
  x[1:] = x[:-1]  # the value reads the memory written: computed first
  assert x._memory is memory and x.tolist() == [5.0, 5.0, 2.0, 3.0]
  x = Tensor(np.arange(64, dtype=np.float32))  # a write whose value gathers from its own memory goes through a copy
  x[0] = 0.0
  x.assign(x.gather(0, Tensor(np.arange(64)[::-1].copy()))).realize()
  x[Tensor(np.arange(64))] = x[Tensor(np.arange(64)[::-1].copy())]
  np.testing.assert_array_equal(x.numpy(), np.arange(64))
  with no_grad():  # initializers write parameters that require grad
    w = Tensor.zeros(3).requires_grad_()
    w[1] = 2.0
  assert w.tolist() == [0.0, 2.0, 0.0] and w.requires_grad


def test_gather_kernel_out_of_range_reads_zero() -> None:
  """Under the checks that raise (see test_index_out_of_range_raises), the kernel itself never reads out of bounds: a kernel can't
  raise, so each index is clamped and its read zeroed."""
  x = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
  np.testing.assert_array_equal(Tensor(x)._gather(1, Tensor([[4], [-1], [3]])).numpy(), [[0.0], [0.0], [12.0]])


def test_index_by_tensor_is_one_small_kernel() -> None:
  from tinytune.codegen.heuristic import hand_coded_optimizations
  from tinytune.codegen.kernel import Kernel
  from tinytune.engine.schedule import create_schedule
  from tinytune.runtime import DeviceCaps
  X = Tensor(np.zeros((6000, 784), np.float32)).realize()
  items, _ = create_schedule(X[Tensor(np.arange(128, dtype=np.int32))].uop, "CPU")
  k = Kernel(items[0].ast, DeviceCaps(has_local=False, threads=2, max_upcast=256, simd_width=16, vector_registers=32))
  assert len(items) == 1 and k.flops < 1000  # reads the rows it selects: no compare of each index with each row
  assert not any(o.op.name == "THREAD" for o in hand_coded_optimizations(k))  # a small copy: a thread put off by the OS would stall it


def test_index_by_tensor_in_jit() -> None:
  x = np.random.default_rng(0).random((50, 7), dtype=np.float32)
  X = Tensor(x).realize()
  @TinyJit
  def sample(X: Tensor, i: Tensor) -> Tensor: return (X[i] * 2).realize()
  @TinyJit
  def draw(X: Tensor) -> tuple[Tensor, Tensor]:
    i = Tensor.randint(8, low=0, high=50)
    return i.realize(), X[i].realize()
  drawn = []
  for k in range(4):
    i = np.random.default_rng(k).integers(0, 50, 8).astype(np.int32)
    np.testing.assert_array_equal(sample(X, Tensor(i)).numpy(), x[i] * 2)  # a fresh index each call, the replay reads it
    got_i, got = draw(X)
    np.testing.assert_array_equal(got.numpy(), x[got_i.numpy()])
    drawn.append(tuple(got_i.tolist()))
  assert len(set(drawn)) == 4


def test_setitem_in_jit() -> None:
  @TinyJit
  def push(memory: Tensor, at: Tensor, row: Tensor) -> Tensor:
    memory[at] = row
    return memory
  memory, want = Tensor.zeros(5, 3).contiguous().realize(), np.zeros((5, 3), np.float32)
  for k in range(5):
    push(memory, Tensor([k]), Tensor(np.full((1, 3), k + 1, np.float32)))
    want[k] = k + 1
    np.testing.assert_array_equal(memory.numpy(), want)


# ***** gather, scatter and masks *****
G = idx([[0, 3, 3], [1, 0, 2]])


def test_gather() -> None:
  helper_test_op([(2, 4)], *both(lambda x, i: x.gather(1, i), G))
  helper_test_op([(2, 4)], *both(lambda x, i: x.gather(-1, i), G))
  helper_test_op([(4, 3)], *both(lambda x, i: x.gather(0, i), G))
  helper_test_op([(4, 5)], *both(lambda x, i: x.gather(0, i), G))  # an index smaller than the input
  helper_test_op([(4, 3)], *both(lambda x, i: x.gather(0, i), G), dtype=dtypes.int32)
  helper_test_op([(4, 3)], *both(lambda x, i: x.gather(0, i), idx(np.zeros((0, 3)))))
  helper_test_op([(2, 3)], *both(lambda x, i: x.gather(1, i), idx([[0, 1, 2, 2, 0]])))  # longer than the input along dim
  helper_test_op([()], *both(lambda x, i: x.gather(0, i), idx([0, 0, 0])))  # a 0-d input counts as 1-d, as in torch
  helper_test_op([()], *both(lambda x, i: x.gather(-1, i), idx([0])))


S, SRC = idx([[0, 1, 2, 0], [2, 0, 0, 1]]), np.arange(8, dtype=np.float32).reshape(2, 4) - 3


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce: str, include_self: bool) -> None:
  helper_test_op([(3, 5)], lambda x: x.scatter_reduce(0, S[0], torch.from_numpy(SRC), reduce, include_self=include_self),
                 lambda x: x.scatter_reduce(0, S[1], Tensor(SRC), reduce, include_self=include_self))


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_scatter() -> None:
  helper_test_op([(3, 5)], lambda x: x.scatter(0, S[0], torch.from_numpy(SRC)), lambda x: x.scatter(0, S[1], Tensor(SRC)))
  helper_test_op([(5, 3)], lambda x: x.scatter(0, S[0].T, torch.from_numpy(SRC).T), lambda x: x.scatter(0, S[1].T, Tensor(SRC).T))
  helper_test_op([(3, 5)], lambda x: x.scatter(1, S[0], 7.0), lambda x: x.scatter(1, S[1], 7.0))
  helper_test_op([(3, 5)], lambda x: x.scatter(0, S[0], torch.from_numpy(SRC), reduce="add"), lambda x: x.scatter(0, S[1], Tensor(SRC), reduce="add"))
  helper_test_op([(3, 5)], lambda x: x.scatter(0, S[0], torch.from_numpy(SRC).int(), reduce="multiply"),
                 lambda x: x.scatter(0, S[1], Tensor(SRC).cast(dtypes.int32), reduce="multiply"), dtype=dtypes.int32)
  helper_test_op([()], lambda x: x.scatter(0, idx([0])[0], torch.tensor([3.0])), lambda x: x.scatter(0, idx([0])[1], Tensor([3.0])))


def test_one_hot_and_masks() -> None:
  helper_test_op(None, lambda x: F.one_hot(x, 5), lambda x: x.one_hot(5), vals=[[[0, 4], [2, 2]]], dtype=dtypes.int64)
  helper_test_op(None, lambda x: F.one_hot(x), lambda x: x.one_hot(), vals=[[3, 0, 1]], dtype=dtypes.int64)
  helper_test_op([(3, 4)], lambda x: x.masked_fill(x > 0, -1.5))
  helper_test_op([(3, 4)], lambda x: x.masked_fill(x[0] > 0, 2))  # the mask broadcasts
  helper_test_op([(3, 4)], lambda x: x.masked_fill(x > 0, 9), dtype=dtypes.int32)
  helper_test_op([(3, 4)], lambda x: x.masked_select(x > 0))
  helper_test_op([(3, 4)], lambda x: x.masked_select(x[0] > 0))
  helper_test_op([(3, 4)], lambda x: x.nonzero(), dtype=dtypes.int32, low=-1, high=1)
  helper_test_op([(2, 0)], lambda x: x.nonzero())
  helper_test_op(None, lambda x: x.nonzero(), vals=[[0.0, math.nan, -0.0, 1.0]])
  for size in (0, 3, 12):  # with size (tinygrad's form) lazy: the first size found, then fill_value (torch.nonzero_static)
    helper_test_op([(3, 4)], lambda x: torch.nonzero_static(x, size=size), lambda x: x.nonzero(size=size, fill_value=-1), low=-1, high=1,
                   dtype=dtypes.int32)
    helper_test_op([(3, 4)], lambda x: torch.cat([x.masked_select(x > 0)[:size], torch.full((max(0, size - int((x > 0).sum())),), 7.0)]),
                   lambda x: x.masked_select(x > 0, size=size, fill_value=7.0))
  helper_test_op([()], lambda x: torch.nonzero_static(x, size=2, fill_value=0), lambda x: x.nonzero(size=2), dtype=dtypes.int32, low=1, high=1)
  helper_test_op([(2, 0)], lambda x: torch.nonzero_static(x, size=2, fill_value=0), lambda x: x.nonzero(size=2))


# ***** reductions *****
def test_running_reductions() -> None:
  for ax in (0, 1, -1):
    helper_test_op([(3, 5)], lambda x: x.cumsum(ax))
    helper_test_op([(3, 5)], lambda x: x.cumprod(ax), low=0.5, high=1.5)
    helper_test_op([(3, 5)], lambda x: x.cummax(ax))
    helper_test_op([(3, 5)], lambda x: x.cummin(ax))
    helper_test_op([(3, 5)], lambda x: x.logcumsumexp(ax))
  helper_test_op([(3, 5)], lambda x: x.cumsum(1), dtype=dtypes.int32, low=-9, high=9)  # int32 sums in int64, like torch
  helper_test_op([(3, 5)], lambda x: x.cumprod(0), dtype=dtypes.int32, low=-9, high=9)
  helper_test_op([(3, 5)], lambda x: x.cummax(1), dtype=dtypes.int32, low=-9, high=9)
  helper_test_op([(3, 5)], lambda x: x.cummin(1), dtype=dtypes.uint8, low=0, high=255)
  helper_test_op([(3, 0)], lambda x: x.cumsum(1))
  helper_test_op([(2, 700)], lambda x: x.cumsum(1), atol=1e-4)  # past BLOCK: in blocks, then over the blocks
  helper_test_op([(300, 2)], lambda x: x.cumprod(0), low=0.98, high=1.02, rtol=1e-4)
  helper_test_op(None, lambda x: x.cumprod(1), vals=[[[2.0, 0.0, -3.0, 0.0, 5.0], [0.0, -1.0, 2.0, 3.0, 0.5], [1.5, 2.0, -0.5, 0.0, 4.0]]])  # zeros
  helper_test_op([(2, 300)], lambda x: x.cummax(1), dtype=dtypes.int32, low=-999, high=999)
  # the gradient goes where torch's cummax/cummin index points: the last occurrence of the running max (min), of the last NaN
  helper_test_op(None, lambda x: x.cummin(0), vals=[[1.0] * 290 + [math.nan] + [0.0] * 9])
  helper_test_op(None, lambda x: x.cummax(0), vals=[[1.0, 3.0, 3.0, 2.0, 3.0, 5.0, 5.0, math.nan, 1.0, math.nan]])
  helper_test_op(None, lambda x: x.cummin(-1), vals=[[[2.0, 2.0, 1.0, 1.0], [0.0, -0.0, 0.0, 4.0]]])
  helper_test_op(None, lambda x: x.cummax(0), vals=[[[1.0, 2.0], [1.0, 0.0], [1.0, 2.0]]])
  helper_test_op(None, lambda x: x.cummax(0), vals=[[-math.inf, -math.inf, 1.0]])
  helper_test_op(None, lambda x: x.cummax(0), vals=[3.0])  # 0-d
  for shape, ax in (((0, 3), 0), ((3, 0), 1), ((0, 3), 1)):  # size 0 along the axis or across it: (values, indices) both empty
    helper_test_op([shape], lambda x: x.cummax(ax))
    helper_test_op([shape], lambda x: x.cummin(ax), dtype=dtypes.int32)
  helper_test_op([(1,)], lambda x: x.cumprod(0))
  helper_test_op([()], lambda x: x.cumsum(0))
  helper_test_op(None, lambda x: x.cummax(0), vals=[[1.0, math.nan, 3.0, -math.inf]])
  helper_test_op(None, lambda x: x.logcumsumexp(0), vals=[[-200.0, 0.0, -math.inf, 100.0]])  # each prefix shifted by its own max
  helper_test_op(None, lambda x: x.logcumsumexp(0), vals=[[-math.inf, -math.inf, 1.0]])


def test_reductions() -> None:
  helper_test_op([(3, 4, 5)], lambda x: x.logsumexp(1))
  helper_test_op([(3, 4, 5)], lambda x: x.logsumexp((0, 2), keepdim=True))
  helper_test_op([(3, 4)], lambda x: torch.logsumexp(x, (0, 1)), lambda x: x.logsumexp())
  helper_test_op([(3, 0)], lambda x: x.logsumexp(1))
  helper_test_op(None, lambda x: x.logsumexp(1), vals=[[[-math.inf, -math.inf], [math.inf, 1.0], [math.nan, 1.0], [1e3, 1e3]]])
  helper_test_op([(3, 4)], lambda x: x.prod(), low=0.5, high=1.5)
  helper_test_op([(3, 5, 2)], lambda x: x.prod(1), low=0.5, high=1.5)
  helper_test_op([(3, 5, 2)], lambda x: x.prod(-1, keepdim=True))
  helper_test_op([(3, 7)], lambda x: x.prod(1), dtype=dtypes.int32, low=-3, high=3)
  helper_test_op([(3, 0)], lambda x: x.prod(1))
  helper_test_op([(3, 4)], lambda x: torch.prod(x, 1, dtype=torch.float32), lambda x: x.prod(1, dtype=dtypes.float32), dtype=dtypes.int32)
  helper_test_op([(3, 4)], lambda x: x.any(1), low=-1, high=1, dtype=dtypes.int32)
  helper_test_op([(3, 4)], lambda x: x.all(0), low=-1, high=1, dtype=dtypes.int32)
  helper_test_op([(3, 4)], lambda x: x.all(), dtype=dtypes.bool)
  helper_test_op([(3, 4)], lambda x: x.any(-1, keepdim=True), dtype=dtypes.bool)
  helper_test_op([(0, 4)], lambda x: x.all(0))
  helper_test_op(None, lambda x: x.all(), vals=[[math.nan, 1.0]])
  helper_test_op([(3, 4)], lambda x: torch.std_mean(x, 1), lambda x: x.std_mean(1))
  helper_test_op([(3, 4)], lambda x: torch.std_mean(x, None, correction=0, keepdim=True), lambda x: x.std_mean(None, True, 0))


def test_max_min_argmax() -> None:
  helper_test_op([(3, 4)], lambda x: x.amax(1), lambda x: x.max(1))
  helper_test_op([(3, 4)], lambda x: x.amin(-1, keepdim=True), lambda x: x.min(axis=-1, keepdim=True))
  helper_test_op([(3, 4)], lambda x: x.amax((0, 1)), lambda x: x.max())
  helper_test_op(None, lambda x: x.amax(1), lambda x: x.max(1), vals=[[[1.0, math.nan], [-math.inf, 2.0]]])
  helper_test_op(None, lambda x: x.amin(1), lambda x: x.min(1), vals=[[[1.0, math.nan], [-math.inf, 2.0]]])
  helper_test_op([(3, 4)], lambda x: x.amin(0), lambda x: x.min(0), dtype=dtypes.int32, low=-9, high=9)
  helper_test_op([(3, 4)], lambda x: x.argmax(1))
  helper_test_op([(3, 4)], lambda x: x.argmin(0, keepdim=True))
  helper_test_op([(3, 4)], lambda x: x.argmax())
  assert Tensor([1, 3, 2]).argmax().dtype == dtypes.int32 and Tensor([1.0, 0.0]).argmin(0).dtype == dtypes.int32  # like tinygrad


# ***** sorting *****
NAN_ROWS = [[[0.5, math.nan, -1.0, math.inf], [2.0, -math.inf, 0.0, 1.0]]]


def test_sort() -> None:
  helper_test_op([(3, 6)], lambda x: x.sort())
  helper_test_op([(3, 6)], lambda x: x.sort(0, descending=True))
  helper_test_op([(2, 3, 6)], lambda x: x.sort(-2))
  helper_test_op([(3, 1)], lambda x: x.sort(1))
  helper_test_op([(3, 0)], lambda x: x.sort(1))
  helper_test_op(None, lambda x: x.sort(1), vals=NAN_ROWS)  # NaN sorts as the largest, like torch
  helper_test_op(None, lambda x: x.sort(1, descending=True), vals=NAN_ROWS)
  helper_test_op(None, lambda x: x.sort(stable=True), lambda x: x.sort(), vals=[[3, 1, 3, 0, 1]], dtype=dtypes.int32)  # ties keep order
  helper_test_op(None, lambda x: x.sort(descending=True, stable=True), lambda x: x.sort(descending=True), vals=[[3, 1, 3, 0, 1]], dtype=dtypes.int64)
  helper_test_op([(4, 5)], lambda x: x.sort(), dtype=dtypes.uint8, low=0, high=255)
  helper_test_op([(3, 6)], lambda x: x.argsort(1))
  helper_test_op([(3, 6)], lambda x: x.argsort(0, descending=True))
  helper_test_op([(3, 6)], lambda x: x.topk(2))
  helper_test_op([(3, 6)], lambda x: x.topk(3, 0, largest=False))
  helper_test_op([(3, 6)], lambda x: x.topk(0))
  helper_test_op([(3, 6)], lambda x: x.topk(6, dim=-1))


# ***** joining, 1-d matmul, movement *****
def test_stack_cat_matmul() -> None:
  helper_test_op([(2, 3), (2, 3), (2, 3)], lambda x, y, z: torch.stack([x, y, z], dim=1), lambda x, y, z: x.stack(y, z, dim=1))
  helper_test_op([(2, 3), (2, 3)], lambda x, y: torch.stack([x, y], -1), lambda x, y: Tensor.stack(x, y, dim=-1))
  helper_test_op([(), ()], lambda x, y: torch.stack([x, y]), lambda x, y: x.stack(y))  # 0-d tensors stack
  helper_test_op([(2,), (2,)], lambda x, y: torch.stack((x, y), 1), lambda x, y: Tensor.stack((x, y), 1))  # a tuple, dim positional
  helper_test_op([(), ()], lambda x, y: torch.stack([x, y], dim=-1), lambda x, y: Tensor.stack([x, y], dim=-1))
  helper_test_op([(2, 3)], lambda x: torch.stack([x]), lambda x: Tensor.stack([x]))
  helper_test_op([(2,), (2,)], lambda x, y: torch.stack([x, y.int()]), lambda x, y: x.stack(y.cast(dtypes.int32)))  # dtypes promote
  helper_test_op([(2, 3), (1, 3), (4, 3)], lambda x, y, z: torch.cat([x, y, z]), lambda x, y, z: x.cat(y, z))
  helper_test_op([(2, 3), (2, 0)], lambda x, y: torch.cat([x, y], -1), lambda x, y: Tensor.cat(x, y, dim=-1))
  helper_test_op([(4,), (4,)], lambda x, y: x @ y)
  helper_test_op([(4,), (4, 3)], lambda x, y: x.matmul(y))
  helper_test_op([(2, 4), (4,)], lambda x, y: x.matmul(y))
  helper_test_op([(4,), (4,)], lambda x, y: x.dot(y))
  helper_test_op([(4,), (4,)], lambda x, y: x.dot(y), dtype=dtypes.int32)


def test_pad_modes() -> None:
  for mode in ("constant", "reflect", "replicate", "circular"):
    helper_test_op([(2, 3, 4)], lambda x: F.pad(x, (2, 1), mode=mode), lambda x: x.pad((2, 1), mode=mode))
    helper_test_op([(2, 3, 4)], lambda x: F.pad(x, (1, 3, 2, 0), mode=mode), lambda x: x.pad((1, 3, 2, 0), mode=mode))
    helper_test_op([(2, 3, 4)], lambda x: F.pad(x, (-1, 2, 1, -2), mode=mode), lambda x: x.pad((-1, 2, 1, -2), mode=mode))
  helper_test_op([(2, 3)], lambda x: F.pad(x, (1, 1), value=-2.5), lambda x: x.pad((1, 1), value=-2.5))
  helper_test_op([(1, 2, 3)], lambda x: F.pad(x.float(), (1, 2, 0, 1), mode="replicate").int(),  # torch pads ints only in constant mode
                 lambda x: x.pad((None, (0, 1), (1, 2)), mode="replicate"), dtype=dtypes.int32)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16])
def test_pad_of_a_constant(dtype: Any) -> None:
  """A padded constant is a kernel of constant vectors once the compiler unrolls its few iterations: gcc 12 with AVX-512 stored
  {1,1,1,1,0,0,0,0} as eight 1s where the vector went to memory through memcpy (ones(16) padded by 4 read ones at 20..23)."""
  for n, pads in ((16, (4, 4)), (16, (8, 8)), (32, (4, 4)), (8, (4, 12)), (24, (8, 0))):
    want = np.pad(np.ones(n), pads)
    np.testing.assert_array_equal(Tensor.ones(n, dtype=dtype).pad((pads,)).numpy().astype(np.float64), want, err_msg=f"{n} {pads}")
  if dtype == dtypes.float32:  # a dilated conv's input gradient pads the same way
    helper_test_op([(1, 3, 5, 20), (4, 3, 3, 3)], lambda x, w: F.conv2d(x, w, dilation=2), lambda x, w: x.conv2d(w, dilation=2), atol=1e-4)


def test_pad_of_empty_to_0d() -> None:
  """Padding an empty tensor gives only padding, also once it is reshaped to 0-d (the constant it was built from read through)."""
  assert Tensor.full((0,), 7.0).pad(((0, 1),)).reshape(()).item() == 0.0
  helper_test_op([(0,)], lambda x: F.pad(x, (0, 1)).reshape(()) + 2, lambda x: x.pad((0, 1)).reshape(()) + 2)


def test_interpolate_uint8_images() -> None:
  """A uint8 image resizes to uint8 as torch's CPU kernel rounds it: nearest picks pixels; bilinear in fixed point, the last dim first."""
  for mode in ("nearest", "nearest-exact", "bilinear"):
    for shape, size in (((1, 3, 4, 5), (7, 9)), ((2, 3, 16, 16), (5, 7)), ((1, 6, 5, 5), (5, 9))):
      helper_test_op([shape], lambda x: F.interpolate(x, size, mode=mode), lambda x: x.interpolate(size, mode), dtype=dtypes.uint8, low=0, high=255)
  helper_test_op([(1, 3, 6, 4)], lambda x: F.interpolate(x, (9, 3), mode="bilinear", align_corners=True),
                 lambda x: x.interpolate((9, 3), "bilinear", align_corners=True), dtype=dtypes.uint8, low=0, high=255)


def test_index_outputs_are_int32_as_argmax() -> None:
  """Every op that returns indices gives tinygrad's default int, as argmax, sort and topk do (max_pool2d's and cummax's were int64)."""
  x = Tensor([[[3.0, 1.0, 4.0, 1.0]]])
  got = [x.argmax(-1), x.sort(-1)[1], x.topk(2)[1], x.max_pool2d((2,), return_indices=True)[1], x.cummax(-1)[1], x.cummin(-1)[1]]
  assert [t.dtype for t in got] == [dtypes.int32] * len(got)


def test_max_pool_indices() -> None:
  """max_pool2d(return_indices=True) gives torch's flat indices: the first of tied maxima, the last NaN of a window that has one."""
  nan = math.nan
  helper_test_op(None, lambda x: F.max_pool2d(x, 2, return_indices=True), lambda x: x.max_pool2d(2, return_indices=True),
                 vals=[[[[nan, 5.0, 1.0, 1.0], [nan, 4.0, 1.0, 0.0]]]], grad=False)
  helper_test_op(None, lambda x: F.max_pool1d(x, 3, 1, return_indices=True), lambda x: x.max_pool2d((3,), 1, return_indices=True),
                 vals=[[[nan, 5.0, nan, 4.0, 1.0, nan, 2.0, 2.0]]], grad=False)
  helper_test_op([(2, 3, 6, 5)], lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), lambda x: x.max_pool2d(3, 2, 1, return_indices=True),
                 low=-2, high=2, dtype=dtypes.int32)  # ints with ties


def test_movement() -> None:
  helper_test_op([(2, 3, 4)], lambda x: x.clone())
  helper_test_op([(2, 3, 4)], lambda x: x.view(6, 4))
  helper_test_op([(2, 3, 4)], lambda x: x.view(-1))
  helper_test_op([(2, 3)], lambda x: x.repeat(2, 1))
  helper_test_op([(2, 3)], lambda x: x.repeat(2, 1, 3))
  helper_test_op([(2, 3)], lambda x: x.repeat(0, 2))
  helper_test_op([()], lambda x: x.repeat(3))
  helper_test_op([(2, 3)], lambda x: x.repeat_interleave(2))
  helper_test_op([(2, 3)], lambda x: x.repeat_interleave(3, 0))
  helper_test_op([(2, 3)], lambda x: x.repeat_interleave(2, dim=-1))
  helper_test_op([(2, 3, 4)], lambda x: x.roll(1, 2))
  helper_test_op([(2, 3, 4)], lambda x: x.roll(-7, -1))
  helper_test_op([(2, 3, 4)], lambda x: x.roll((1, 5), (0, 1)))
  helper_test_op([(2, 3, 4)], lambda x: x.roll(5))
  helper_test_op([(2, 0)], lambda x: x.roll(1, 1))
  helper_test_op([(5, 2)], lambda x: x.split(2))
  helper_test_op([(5, 2)], lambda x: x.split([1, 0, 4]))
  helper_test_op([(2, 7)], lambda x: x.split(3, -1))
  helper_test_op([(5, 2)], lambda x: x.chunk(2))
  helper_test_op([(2, 7)], lambda x: x.chunk(3, 1))
  helper_test_op([(2, 6)], lambda x: x.chunk(4, 1))
  helper_test_op([(2, 5, 3)], lambda x: x.unfold(1, 2, 1))
  helper_test_op([(2, 5, 3)], lambda x: x.unfold(1, 2, 2))
  helper_test_op([(2, 5, 3)], lambda x: x.unfold(-1, 3, 5))
  helper_test_op([(2, 5, 3)], lambda x: x.unfold(0, 1, 1))
  helper_test_op([(2, 5, 3)], lambda x: x[:, 1:].unfold(1, 3, 1))  # a view with an offset
  helper_test_op([()], lambda x: x.unfold(0, 0, 1))  # 0-d counts as size 1
  helper_test_op([()], lambda x: x.unfold(-1, 1, 2))
  helper_test_op([(3, 4)], lambda x: x.unfold(1, 0, 2))
  helper_test_op([(3, 4)], lambda x: F.pad(x, (-2, -2)), lambda x: x.pad((-2, -2)))  # cropped to nothing
  helper_test_op([(2, 12)], lambda x: x.unflatten(1, (3, 4)))
  helper_test_op([(2, 12)], lambda x: x.unflatten(-1, (2, -1, 2)))
  helper_test_op([(2, 3, 4)], lambda x: x.permute(2, 0, 1))
  helper_test_op([(2, 3, 4)], lambda x: x.flip(0, -1))
  helper_test_op([(2, 3, 4)], lambda x: x.flip(1))


def test_einsum() -> None:
  helper_test_op([(2, 3), (3, 4)], lambda x, y: torch.einsum("ij,jk->ik", x, y), lambda x, y: Tensor.einsum("ij,jk->ik", x, y))
  helper_test_op([(2, 3), (3, 4)], lambda x, y: torch.einsum("ij,jk", x, y), lambda x, y: Tensor.einsum("ij,jk", [x, y]))
  helper_test_op([(5, 2, 3), (5, 3, 4)], lambda x, y: torch.einsum("bij,bjk->bki", x, y), lambda x, y: Tensor.einsum("bij,bjk->bki", x, y))
  helper_test_op([(3,), (4,)], lambda x, y: torch.einsum("i,j->ij", x, y), lambda x, y: Tensor.einsum("i,j->ij", x, y))
  helper_test_op([(3, 3)], lambda x: torch.einsum("ii->i", x), lambda x: Tensor.einsum("ii->i", x))
  helper_test_op([(3, 3)], lambda x: torch.einsum("ii", x), lambda x: Tensor.einsum("ii", x))
  helper_test_op([(3, 4)], lambda x: torch.einsum("ij->", x), lambda x: Tensor.einsum("ij->", x))
  helper_test_op([(2, 5, 3, 4)], lambda x: torch.einsum("...ij->...ji", x), lambda x: Tensor.einsum("...ij->...ji", x))
  helper_test_op([(2, 3, 4), (4, 5)], lambda x, y: torch.einsum("...j,jk", x, y), lambda x, y: Tensor.einsum("...j,jk", x, y))
  helper_test_op([(2, 3), (3, 4)], lambda x, y: torch.einsum("ij, jk -> ik", x, y), lambda x, y: Tensor.einsum("ij, jk -> ik", x, y),
                 dtype=dtypes.int32)


# ***** creation *****
def test_creation() -> None:
  helper_test_op([], lambda: torch.linspace(-1, 3, 7), lambda: Tensor.linspace(-1, 3, 7))
  helper_test_op([], lambda: torch.linspace(2, -2, 100), lambda: Tensor.linspace(2, -2, 100))
  helper_test_op([], lambda: torch.linspace(0, 1, 1), lambda: Tensor.linspace(0, 1, 1))
  helper_test_op([], lambda: torch.linspace(0, 1, 0), lambda: Tensor.linspace(0, 1, 0))
  helper_test_op([(3,), (4,)], lambda x, y: torch.meshgrid(x, y, indexing="ij"), lambda x, y: x.meshgrid(y, indexing="ij"))
  helper_test_op([(3,), (4,), (2,)], lambda x, y, z: torch.meshgrid(x, y, z, indexing="xy"), lambda x, y, z: Tensor.meshgrid(x, y, z, indexing="xy"))
  helper_test_op([(4, 5)], lambda x: x.tril())
  helper_test_op([(2, 4, 5)], lambda x: x.tril(-1))
  helper_test_op([(4, 5)], lambda x: x.triu(2))
  helper_test_op([(4, 5)], lambda x: x.triu(-9), dtype=dtypes.bool)
  helper_test_op([(4,)], lambda x: x.diag())
  helper_test_op([(4,)], lambda x: x.diag(2))
  helper_test_op([(4,)], lambda x: x.diag(-1), dtype=dtypes.int32)
  helper_test_op([(4, 5)], lambda x: x.diag(1))
  helper_test_op([(4, 5)], lambda x: x.diagonal())
  helper_test_op([(4, 5)], lambda x: x.diagonal(-2))
  helper_test_op([(4, 5)], lambda x: x.diagonal(7))
  helper_test_op([(2, 3, 4)], lambda x: x.diagonal(1, 2, 0))
  assert Tensor.empty(2, 3).shape == (2, 3) and Tensor.empty((4,), dtype=dtypes.int32).dtype == dtypes.int32


@pytest.mark.parametrize("init,bound", [
  (lambda: Tensor.kaiming_uniform(64, 32), math.sqrt(3 * 2 / (1 + 0.01 ** 2) / 32)),
  (lambda: Tensor.kaiming_uniform(64, 4, 3, 3, a=math.sqrt(5)), math.sqrt(3 * 2 / 6 / 36)),
  (lambda: Tensor.glorot_uniform(64, 32), math.sqrt(6 / 96)),
  (lambda: Tensor.scaled_uniform(64, 32), 1 / math.sqrt(64 * 32)),
])
def test_uniform_initializers(init: Callable[[], Tensor], bound: float) -> None:
  x = init().numpy()
  assert x.shape[:2] == (64, 32 if x.ndim == 2 else 4) and x.dtype == np.float32
  assert np.abs(x).max() <= bound and np.abs(x).max() > 0.9 * bound and abs(x.mean()) < 0.1 * bound


def test_normal_initializers() -> None:
  x = Tensor.kaiming_normal(256, 64).numpy()
  assert x.shape == (256, 64) and abs(x.std() - math.sqrt(2 / (1 + 0.01 ** 2) / 64)) < 0.01
  y = Tensor.normal(100, 100, mean=3.0, std=0.5, dtype=dtypes.float16).numpy()
  assert y.dtype == np.float16 and abs(y.mean() - 3) < 0.05 and abs(y.std() - 0.5) < 0.05


# ***** bad calls fail like torch, at the call *****
BAD_CALLS: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
  ("index list oob", lambda: Tensor.zeros(3, 4)[:, [0, 4]], IndexError, "index 4 is out of bounds for dimension 1 with size 4"),
  ("index list neg oob", lambda: Tensor.zeros(3, 4)[[-4]], IndexError, "index -4 is out of bounds for dimension 0 with size 3"),
  ("index float list", lambda: Tensor.zeros(3)[[0.5]], IndexError, "indices are ints or bools"),
  ("index float tensor", lambda: Tensor.zeros(3)[Tensor([1.0])], IndexError, "must be int or bool tensors, got float32"),
  ("index mask shape", lambda: Tensor.zeros(3, 4)[[True, False]], IndexError, "a mask of size 2 does not match dim 0 of size 3"),
  ("index no broadcast", lambda: Tensor.zeros(3, 4)[[0, 1], [0, 1, 2]], IndexError, "shape mismatch: index tensors of shapes"),
  ("index too many", lambda: Tensor.zeros(3)[[0], [0]], IndexError, "too many indices"),
  ("setitem leaf", lambda: Tensor.zeros(3).requires_grad_().__setitem__(0, 1.0), RuntimeError, "a leaf Variable that requires grad is being used"),
  ("setitem grad", lambda: (Tensor.zeros(3).requires_grad_() * 2).__setitem__(0, 1.0), NotImplementedError, "requires grad"),
  ("setitem value grad", lambda: Tensor.zeros(3).__setitem__(0, Tensor(1.0, requires_grad=True)), NotImplementedError, "requires grad"),
  ("setitem expanded", lambda: Tensor([1.0, 2.0]).expand(2, 2).__setitem__(0, 1.0), RuntimeError, "more than one element of the written-to"),
  ("assign expanded view", lambda: Tensor([1.0]).expand(3).assign(Tensor.ones(3)), RuntimeError, "more than one element of the written-to"),
  ("setitem shape", lambda: Tensor.zeros(3, 4).__setitem__(slice(1), Tensor.zeros(3)), ValueError, "cannot be broadcast to indexing result"),
  ("setitem type", lambda: Tensor.zeros(3).__setitem__(0, "a"), TypeError, "can't assign a str to a Tensor"),
  ("setitem oob", lambda: Tensor.zeros(3).__setitem__(3, 1.0), IndexError, "index 3 is out of bounds for dimension 0 with size 3"),
  ("gather dims", lambda: Tensor.zeros(3, 4).gather(0, Tensor([0])), ValueError, "Index tensor must have the same number of dimensions as input"),
  ("gather 0-d dims", lambda: Tensor(5.0).gather(0, Tensor([[0]])), ValueError, "same number of dimensions as input tensor"),
  ("gather float", lambda: Tensor.zeros(3).gather(0, Tensor([0.0])), TypeError, "gather index must be an int tensor"),
  ("gather big", lambda: Tensor.zeros(3, 4).gather(0, Tensor.zeros(2, 5, dtype=dtypes.int32)), ValueError,
   r"Size does not match at dimension 1 expected index \[2, 5\] to be no larger than self \[3, 4\] apart from dimension 0"),
  ("scatter dims", lambda: Tensor.zeros(3, 4).scatter(1, Tensor([0]), 1.0), ValueError, "same number of dimensions as self tensor"),
  ("scatter src dims", lambda: Tensor.zeros(3, 4).scatter(1, Tensor([[0]]), Tensor(1.0)), ValueError, "same number of dimensions as src tensor"),
  ("scatter big", lambda: Tensor.zeros(2, 3).scatter(1, Tensor([[0], [1], [2]]), 1.0), ValueError,
   r"Expected index \[3, 1\] to be no larger than self \[2, 3\] apart from dimension 1$"),
  ("scatter_reduce scalar", lambda: Tensor.zeros(3).scatter_reduce(0, Tensor([0]), 1.0, "sum"), TypeError, "'src' .* must be Tensor, not float"),
  ("scatter reduce", lambda: Tensor.zeros(3).scatter(0, Tensor([0]), 1.0, reduce="max"), ValueError, "scatter reduce is 'add', 'multiply' or None"),
  ("scatter_reduce how", lambda: Tensor.zeros(3).scatter_reduce(0, Tensor([0]), Tensor([1.0]), "max"), ValueError, "sum, prod, mean, amax or amin"),
  ("scatter src", lambda: Tensor.zeros(3).scatter(0, Tensor([0, 1]), Tensor([1.0])), ValueError,
   r"Expected index \[2\] to be no larger than self \[3\] apart from dimension 0 and to be no larger size than src \[1\]"),
  ("one_hot float", lambda: Tensor([1.0]).one_hot(3), TypeError, "one_hot needs an int tensor"),
  ("nonzero size", lambda: Tensor.zeros(3).nonzero(size=-1), ValueError, "size must be an int >= 0, got -1"),
  ("masked_fill mask", lambda: Tensor.zeros(3).masked_fill(Tensor([1, 0, 1]), 1.0), TypeError, "mask must be a bool Tensor"),
  ("topk k", lambda: Tensor.zeros(3).topk(4), ValueError, "topk k=4 is out of range for dim 0 of size 3"),
  ("permute short", lambda: Tensor.zeros(2, 3).permute(1), ValueError, r"one dim per dim of the tensor \(2\), got 1"),
  ("permute repeat", lambda: Tensor.zeros(2, 3).permute(1, -1), ValueError, "duplicate dims are not allowed"),
  ("flip repeat", lambda: Tensor.zeros(2, 3).flip(1, -1), ValueError, "dim 1 appears multiple times"),
  ("cat 0-d", lambda: Tensor.zeros(2).cat(Tensor(1.0)), IndexError, r"zero-dimensional tensor \(at position 1\) cannot be concatenated"),
  ("stack shapes", lambda: Tensor.zeros(2).stack(Tensor.zeros(2), Tensor.zeros(3)), ValueError,
   r"stack expects each tensor to be equal size, but got \[2\] at entry 0 and \[3\] at entry 2"),
  ("stack dim", lambda: Tensor.stack([Tensor.zeros(2), Tensor.zeros(2)], 3), IndexError, "out of range"),
  ("stack mixed", lambda: Tensor.stack((Tensor([1, 2]), Tensor([3, 4])), Tensor([5, 6])), ValueError, "tensors or one sequence of them, not both"),
  ("cat mixed", lambda: Tensor.cat([Tensor([1, 2])], Tensor([5, 6])), ValueError, "tensors or one sequence of them, not both"),
  ("pad mode", lambda: Tensor.zeros(3).pad((1, 1), mode="wrap"), ValueError, "pad mode is constant, reflect, replicate or circular"),
  ("pad reflect big", lambda: Tensor.zeros(3).pad((3, 0), mode="reflect"), ValueError, r"reflect padding \(3, 0\) must be smaller than dim 0"),
  ("pad circular big", lambda: Tensor.zeros(3).pad((0, 4), mode="circular"), ValueError, "circular padding"),
  ("pad mode value", lambda: Tensor.zeros(3).pad((1, 1), mode="reflect", value=1.0), ValueError, "doesn't take a value"),
  ("repeat few", lambda: Tensor.zeros(2, 3).repeat(2), ValueError, r"at least one count per dim \(2\)"),
  ("repeat_interleave tensor", lambda: Tensor.zeros(2).repeat_interleave(Tensor([1, 2])), TypeError, "repeats is an int"),
  ("roll lengths", lambda: Tensor.zeros(2, 3).roll((1, 2), 0), ValueError, "one shift per dim"),
  ("split sum", lambda: Tensor.zeros(5).split([2, 2]), ValueError, r"must be >= 0 and sum to dim 0's size 5"),
  ("split zero", lambda: Tensor.zeros(5).split(0), ValueError, "split size must be a positive int"),
  ("chunk zero", lambda: Tensor.zeros(5).chunk(0), ValueError, "positive int of chunks"),
  ("unfold size", lambda: Tensor.zeros(3, 4).unfold(1, 5, 1), ValueError, "maximum size for tensor at dimension 1 is 4 but size is 5"),
  ("unfold empty", lambda: Tensor.zeros(0, 3).unfold(0, 2, 1), ValueError, "maximum size for tensor at dimension 0 is 0 but size is 2"),
  ("unfold negative", lambda: Tensor.zeros(3, 4).unfold(1, -1, 1), ValueError, "size is -1 but must be >= 0"),
  ("unfold step", lambda: Tensor.zeros(3, 4).unfold(1, 2, 0), ValueError, "step is 0 but must be > 0"),
  ("unfold float", lambda: Tensor.zeros(3, 4).unfold(1, 2.0, 1), TypeError, "size and step must be ints"),
  ("unfold dim", lambda: Tensor.zeros(3, 4).unfold(2, 2, 1), IndexError, "out of range"),
  ("pad odd", lambda: Tensor.zeros(3, 4).pad((1, 1, 1)), ValueError, "Padding length must be divisible by 2"),
  ("pad long", lambda: Tensor.zeros(3, 4).pad((1,) * 6), ValueError, "less than or equal to two times the input dimension but got padding length 6"),
  ("pad float", lambda: Tensor.zeros(3, 4).pad((1.5, 1)), TypeError, "must be tuple of ints, but found element of type float at pos 0"),
  ("pad crop", lambda: Tensor.zeros(3, 4).pad((-5, 0)), ValueError, r"crops more than the shape \(3, 4\)"),
  ("einsum operands", lambda: Tensor.einsum("ij,jk", Tensor.zeros(2, 3)), ValueError, "names 2 operands, got 1"),
  ("einsum dims", lambda: Tensor.einsum("ijk", Tensor.zeros(2, 3)), ValueError, "does not match the operands' dims"),
  ("einsum sizes", lambda: Tensor.einsum("ij,jk", Tensor.zeros(2, 3), Tensor.zeros(4, 2)), ValueError, "letter 'j' has sizes 3 and 4"),
  ("linspace steps", lambda: Tensor.linspace(0, 1, -1), RuntimeError, "number of steps must be non-negative"),
  ("meshgrid indexing", lambda: Tensor.zeros(2).meshgrid(Tensor.zeros(3), indexing="ji"), ValueError, "'ij' or 'xy'"),
  ("tril 1-d", lambda: Tensor.zeros(3).tril(), RuntimeError, "tril: input tensor must have at least 2 dimensions"),
  ("diagonal same", lambda: Tensor.zeros(3, 3).diagonal(0, 1, -1), RuntimeError, "diagonal dimensions cannot be identical 1, -1"),
  ("diag 3-d", lambda: Tensor.zeros(2, 2, 2).diag(), RuntimeError, "Supports 1D or 2D tensors. Got 3D"),
]


@pytest.mark.parametrize("fn,exc,match", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_raise_clearly(fn: Callable[[], Any], exc: type[Exception], match: str) -> None:
  with pytest.raises(exc, match=match): fn()


# ***** properties against NumPy *****
small_floats = st.floats(-100, 100, width=32)


@settings(max_examples=examples(15), **FUZZ)
@given(rows=st.integers(1, 3), values=st.lists(small_floats, min_size=1, max_size=12), axis=st.sampled_from([0, 1, -1]))
def test_cumsum_matches_numpy(rows: int, values: list[float], axis: int) -> None:
  a = np.array(values * rows, np.float32).reshape(rows, len(values))
  np.testing.assert_allclose(Tensor(a).cumsum(axis).numpy(), np.cumsum(a, axis), rtol=1e-5, atol=1e-3)


def draw_index(data: st.DataObject) -> tuple[np.ndarray, list[Any], tuple[Any, ...]]:
  """An int32 array of up to 3 dims, an index of ints, slices and lists for it, and that index with some lists as int Tensors."""
  shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
  a = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
  index: list[Any] = []
  for n in shape:
    index.append(data.draw(st.one_of(st.integers(-n, n - 1), st.slices(n), st.lists(st.integers(-n, n - 1), min_size=1, max_size=4))))
  if sum(isinstance(i, list) for i in index) > 1: index = [i[:1] if isinstance(i, list) else i for i in index]  # lists broadcast: one element each
  return a, index, tuple(Tensor(np.array(i, np.int32)) if isinstance(i, list) and data.draw(st.booleans()) else i for i in index)


@settings(max_examples=examples(15), **FUZZ)
@given(st.data())
def test_indexing_matches_numpy(data: st.DataObject) -> None:
  a, index, tensor_index = draw_index(data)
  ints_first = a[tuple(i if isinstance(i, int) else slice(None) for i in index)]  # torch takes ints before lists; numpy mixes them
  np.testing.assert_array_equal(Tensor(a)[tensor_index].numpy(), ints_first[tuple(i for i in index if not isinstance(i, int))])


@settings(max_examples=examples(10), **FUZZ)
@given(st.data())
def test_setitem_matches_numpy(data: st.DataObject) -> None:
  a, index, tensor_index = draw_index(data)
  x = Tensor(a)
  if any(isinstance(i, list) for i in index) and any(isinstance(i, int) for i in index):
    value: Any = -1  # numpy lays out ints beside lists unlike torch: a scalar
  else: value = -1 - np.arange(a[tuple(index)].size, dtype=np.int32).reshape(a[tuple(index)].shape)  # distinct: the last write wins
  a[tuple(index)] = value
  x[tensor_index] = Tensor(value) if isinstance(value, np.ndarray) else value
  np.testing.assert_array_equal(x.numpy(), a)


@settings(max_examples=examples(15), **FUZZ)
@given(values=st.lists(st.one_of(small_floats, st.just(math.nan), st.just(-math.inf)), min_size=1, max_size=10), descending=st.booleans())
def test_sort_matches_numpy(values: list[float], descending: bool) -> None:
  a = np.array(values, np.float32)
  got, order = Tensor(a).sort(descending=descending)
  want = np.sort(a) if not descending else np.concatenate([a[np.isnan(a)], -np.sort(-a[~np.isnan(a)])])
  np.testing.assert_array_equal(got.numpy(), want)
  np.testing.assert_array_equal(a[order.numpy()], want)  # the indices take the input to the values


@pytest.mark.parametrize("name, fn, error, match", [
  ("getitem", lambda: Tensor.arange(10)[Tensor([3, 12])], IndexError, "index 12 is out of bounds for dimension 0 with size 10"),
  ("getitem negative", lambda: Tensor.arange(10)[Tensor([-11])], IndexError, "index -11 is out of bounds for dimension 0 with size 10"),
  ("getitem lazy index", lambda: Tensor.arange(10)[Tensor([3, 6]) * 2], IndexError, "index 12 is out of bounds"),
  ("gather", lambda: Tensor.arange(10).gather(0, Tensor([5, 99])), RuntimeError, "index 99 is out of bounds for dimension 0 with size 10"),
  ("gather negative", lambda: Tensor.arange(10).gather(0, Tensor([-1])), RuntimeError, "index -1 is out of bounds"),
  ("scatter", lambda: Tensor.zeros(5).scatter(0, Tensor([9]), 1.0), RuntimeError, "index 9 is out of bounds for dimension 0 with size 5"),
  ("one_hot", lambda: Tensor([3, 7]).one_hot(5), RuntimeError, "Class values must be smaller than num_classes"),
  ("one_hot negative", lambda: Tensor([-1]).one_hot(5), RuntimeError, "Class values must be non-negative"),
  ("embedding", lambda: nn.Embedding(10, 4)(Tensor([[12]])), IndexError, "index out of range in self"),
  ("sparse_categorical_crossentropy", lambda: Tensor([[1.0, 2.0]]).sparse_categorical_crossentropy(Tensor([5])), IndexError, "Target 5 is out"),
  ("cross_entropy", lambda: Tensor([[1.0, 2.0]]).cross_entropy(Tensor([5])), IndexError, "Target 5 is out of bounds"),
  ("nll_loss", lambda: Tensor([[-1.0, -2.0]]).nll_loss(Tensor([2])), IndexError, "Target 2 is out of bounds"),
])
@pytest.mark.usefixtures("oracle_device")
def test_index_out_of_range_raises(name: str, fn, error: type, match: str) -> None:
  """PyTorch raises for each, where they read 0 or wrote nothing: at the call for an index in memory, else at the next realize."""
  with pytest.raises(error, match=match): fn().realize()
  torch_fns = {"getitem": lambda: torch.arange(10)[torch.tensor([3, 12])], "gather": lambda: torch.arange(10).gather(0, torch.tensor([5, 99])),
               "embedding": lambda: torch.nn.Embedding(10, 4)(torch.tensor([[12]]))}
  if name in torch_fns:
    with pytest.raises(error, match=match): torch_fns[name]()


@pytest.mark.usefixtures("oracle_device")
def test_index_checked_in_the_kernel_that_reads_it() -> None:
  """An index's bounds check is fused into the kernel that reads it (a CHECK storing a value out of range into a flag): a lazily
  computed index is one kernel with its gather (it was computed and copied out first), an index in memory is not read on the host,
  and the error comes at that realize, again at the next one, and at a TinyJit replay (which checked nothing)."""
  from tinytune.engine.program import GlobalCounters
  X = Tensor.arange(10).contiguous().realize()
  before = GlobalCounters.kernel_count
  assert X[Tensor([3, 4]) * 2].tolist() == [6, 8] and GlobalCounters.kernel_count - before == 1
  bad = X[Tensor([3, 6]) * 2]  # no error at the call
  for _ in range(2):
    with pytest.raises(IndexError, match="index 12 is out of bounds for dimension 0 with size 10"): bad.realize()
  take = TinyJit(lambda i: X[i].realize())
  for v in ([1, 2], [3, 4], [5, 6]): assert take(Tensor(v).realize()).tolist() == v
  with pytest.raises(IndexError, match="index -11 is out of bounds"): take(Tensor([1, -11]).realize())
  assert take(Tensor([7, -1]).realize()).tolist() == [7, 9]


@pytest.mark.parametrize("name, update", [
  ("assign", lambda a, b, src, i: [a.assign(src[i])]),
  ("in place", lambda a, b, src, i: [a.assign(a + src[i])]),
  ("lazy index", lambda a, b, src, i: [a.assign(src[i * 1])]),
  ("with another write", lambda a, b, src, i: [b.assign(b + 1), a.assign(src[i])]),
])
@pytest.mark.usefixtures("oracle_device")
def test_assign_of_a_bad_gather_writes_nothing(name: str, update: Callable) -> None:
  """An assign whose value gathers with an index out of range raises before anything is written, as setitem and torch, and leaves
  each tensor as it was: the kernel that gathered into the memory wrote the rows it could before its flag was read, and the pending
  assign stayed to raise again."""
  src = Tensor.arange(8).float().contiguous().realize()
  a, b = Tensor.full((8,), -1.0).contiguous().realize(), Tensor.full((8,), -2.0).contiguous().realize()
  with pytest.raises(IndexError, match="index 99 is out of bounds for dimension 0 with size 8"):
    Tensor.realize(*update(a, b, src, Tensor([0, 1, 2, 3, 4, 5, 6, 99]).realize()))
  assert a._memory.numpy_view().tolist() == [-1.0] * 8, name  # type: ignore[union-attr]  # the memory, not only the tensor's view
  assert a.tolist() == [-1.0] * 8 and b.tolist() == [-2.0] * 8, name
  Tensor.realize(*update(a, b, src, Tensor([7, 6, 5, 4, 3, 2, 1, 0]).realize()))
  assert a.tolist()[:2] == ([6.0, 5.0] if name == "in place" else [7.0, 6.0])


@pytest.mark.usefixtures("oracle_device")
def test_tinyjit_replay_of_a_bad_gather_writes_nothing() -> None:
  """A replay reads the index checks' flags before the kernels that write memory, as a realize does: it read them after all its
  kernels, so a bad index updated the parameter (here with the 0 an out-of-range read gives) before raising."""
  table, w = Tensor.arange(8).float().contiguous().realize(), Tensor.full((2,), 1.0).contiguous().realize()
  step = TinyJit(lambda i: w.assign(w + table[i]).realize())
  for v in ([1, 2], [3, 4], [0, 0]): step(Tensor(v).realize())
  assert w.tolist() == [5.0, 7.0]
  with pytest.raises(IndexError, match="index 9 is out of bounds"): step(Tensor([1, 9]).realize())
  assert w.tolist() == [5.0, 7.0]
  assert step(Tensor([1, 1]).realize()).tolist() == [6.0, 8.0]


def test_gpu_suite_times_the_gather_checked_and_not() -> None:
  """bench/gpu_suite.py's gather section, on the CPU: a row of times for each index, checked and not, and the check put back after."""
  import argparse

  from tinytune.tensor import indexing
  suite_module = bench_module("gpu_suite")
  suite = suite_module.Suite(argparse.Namespace(quick=True, budget=600))
  real = indexing.checked
  suite_module.gather_checks(suite, "CPU")
  rows = [line.split(" | ") for line in suite.lines if line.startswith("| A[")]
  assert [r[0] for r in rows] == ["| A[idx]", "| A[idx * 1]"] and all(float(x) > 0 for r in rows for x in r[1:3])
  assert indexing.checked is real


def test_index_check_on_gpus(tmp_path: Any) -> None:
  """CHECK's flag store races between the threads that read one bad index (any value may land): an atomic store on CUDA (rendered
  and built by nvcc for sm_90; HIP's built by clang for gfx90a), and one EMU lets race, where it raised EmuError."""
  from ops_support import hip_clang, hip_flags, ptxas_stats

  from tinytune.codegen.cstyle import CUDARenderer, HIPRenderer
  from tinytune.codegen.heuristic import hand_coded_optimizations
  from tinytune.codegen.kernel import Kernel
  from tinytune.engine.schedule import create_schedule
  from tinytune.runtime import Device
  with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"): Tensor([3, 7], device="EMU").one_hot(5).realize()
  assert Tensor([3, 1], device="EMU").one_hot(5).tolist() == [[0, 0, 0, 1, 0], [0, 1, 0, 0, 0]]
  items, _ = create_schedule(Tensor([3, 7]).one_hot(5).uop, "CPU")
  k = Kernel(items[-1].ast, Device["EMU"].caps)
  src = CUDARenderer().render(k.apply_opts(hand_coded_optimizations(k)))
  assert "atomicExch((unsigned long long*)(data2+0)" in src and "long long* __restrict__ data2" in src
  if shutil.which("nvcc"): ptxas_stats(tmp_path, src, "sm_90")
  hip = HIPRenderer().render(k)  # C11's relaxed atomic store, as the CPU's
  assert "__atomic_store_n(data2+0, v1, __ATOMIC_RELAXED);" in hip
  if (clang := hip_clang("gfx90a")) is not None:
    res = subprocess.run([clang, *hip_flags("gfx90a"), "-", "-o", "-"], input=hip, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
  items, _ = create_schedule(Tensor.arange(10)[Tensor(np.array([1, 2], np.int32))].uop, "CPU")  # an int32 index: an int32 flag
  k = Kernel(items[-1].ast, Device["EMU"].caps)
  src = CUDARenderer().render(k.apply_opts(hand_coded_optimizations(k)))
  assert "if (v4) atomicExch(data3+0, v1);" in src and " int* __restrict__ data3" in src
  if shutil.which("nvcc"): ptxas_stats(tmp_path, src, "sm_90")


def test_index_check_on_opencl_stores_per_work_item() -> None:
  """On OpenCL each work-item stores a bad index at its own element of the flag (its first local id): pocl runs a work-group's items
  as one vectorized loop, where a store under a condition to one address became a masked scatter in every iteration (a 10^6 gather
  on pocl 1.6 times slower than unchecked), and a store to consecutive ones is a masked vector store; an int32 index is compared and
  stored as int32, so the loop keeps int32's vector width. The flag has an element for each work-item a workgroup can have."""
  from tinytune.codegen.cstyle import OpenCLRenderer
  from tinytune.codegen.heuristic import hand_coded_optimizations
  from tinytune.codegen.kernel import Kernel
  from tinytune.engine.schedule import create_schedule
  from tinytune.runtime import Device
  items, _ = create_schedule(Tensor.arange(10)[Tensor(np.array([1, 2], np.int32))].uop, "CPU")
  k = Kernel(items[-1].ast, Device["EMU"].caps)
  src = OpenCLRenderer().render(k.apply_opts(hand_coded_optimizations(k)))
  assert "if (v4) data3[0+get_local_id(0)] = v1;" in src and "__global int* restrict data3" in src
  assert OpenCLRenderer().flag_size(k.caps) == k.caps.max_local
  items, _ = create_schedule(Tensor.arange(10)[Tensor([1, 2])].uop, "CPU")  # int64: an int64 flag
  assert "__global long* restrict data3" in OpenCLRenderer().render(Kernel(items[-1].ast, Device["EMU"].caps))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc here to say which loops it vectorizes")
def test_cpu_index_check_leaves_the_gather_loop_vectorizable(tmp_path: Any) -> None:
  """On the CPU a thread keeps an index out of range in a register (the flag's first value until one comes) and stores it into the
  flag once, after its loops: a store under a condition in the loop kept GCC from vectorizing the gather (a 10^6-element A[idx])."""
  import re

  from tinytune.codegen.kernel import Kernel
  from tinytune.engine.schedule import create_schedule
  from tinytune.runtime import Device
  from tinytune.runtime.cpu import FLAGS
  items, _ = create_schedule(Tensor.arange(10**6).contiguous()[Tensor(np.zeros(10**6, np.int32))].uop, "CPU")
  src = Device["CPU"].renderer.render(Kernel(items[-1].ast, Device["CPU"].caps))  # no opts: one thread, no OpenMP
  assert src.count("__atomic_store_n") == 1 and re.search(r"\n  }\n  _Bool (v\d+) = \(flag3!=\(-1000000\)\);\n  if \(\1\) __atomic_store_n", src)
  (tmp_path / "k.c").write_text(src)
  res = subprocess.run(["gcc", *FLAGS, "-c", "k.c", "-o", "k.o", "-fopt-info-vec-optimized"], cwd=tmp_path, capture_output=True, text=True)
  loop = src[:src.index("for (long g0")].count("\n") + 1
  assert res.returncode == 0 and f"k.c:{loop}:" in res.stderr and "loop vectorized" in res.stderr, res.stderr


@pytest.mark.parametrize("seed", range(3))
def test_cpu_index_check_under_random_opts(seed: int) -> None:
  """The CPU's flag register (see above) under the opt fuzzer's lists: a gather, a gather of rows, a sum over gathered rows (the check
  in the reduce's loop) and an embedding; in range, each computes what it computes with its default opts and leaves the flag at its
  first value; with one index out of range, that index lands in the flag."""
  import random

  from test_opts import random_sequence

  from tinytune.codegen.kernel import Kernel
  from tinytune.engine import compile_kernel
  from tinytune.engine.realize import Flag
  from tinytune.engine.schedule import create_schedule
  from tinytune.runtime import Device
  rng = random.Random(seed)
  A, X = Tensor.arange(64).contiguous().realize(), Tensor.arange(48 * 20).reshape(48, 20).float().contiguous().realize()
  emb = nn.Embedding(30, 8)
  cases = [(lambda i: A[i], -64, 64, (64,)), (lambda i: X[i], -48, 48, (12,)), (lambda i: X[i].sum(1), -48, 48, (16,)), (emb, 0, 30, (4, 6))]
  for fn, lo, n, shape in cases:  # an embedding's ids are never negative
    for bad in (None, n + 5):
      idx = np.random.default_rng(seed).integers(lo, n, shape).astype(np.int32)
      if bad is not None: idx.flat[3] = bad
      out = fn(Tensor(idx).realize())
      items, _ = create_schedule(out.uop, "CPU")
      kernel = Kernel(items[-1].ast, Device["CPU"].caps)
      kernel.apply_opts(random_sequence(kernel, rng))
      (flag,) = [b for b in kernel.bufs if isinstance(b, Flag)]
      program, _ = compile_kernel(kernel, "CPU")
      program(items[-1].out, *kernel.bufs)
      assert int(flag.numpy_view()[0]) == (flag.lo if bad is None else bad), kernel.opts
      if bad is None:
        np.testing.assert_allclose(items[-1].out.numpy_view().reshape(out.shape), fn(Tensor(idx)).numpy(), err_msg=str(kernel.opts))
      flag.copyin(np.full(1, flag.lo))


@pytest.mark.usefixtures("oracle_device")
def test_ignored_targets_and_in_range_indices_pass() -> None:
  assert Tensor([[-1.0, -2.0]]).nll_loss(Tensor([-100])).isnan().item()  # torch's ignore_index: 0 / 0, as torch
  assert Tensor([[1.0, 2.0], [3.0, 1.0]]).sparse_categorical_crossentropy(Tensor([-1, 0])).item() == pytest.approx(0.126928, rel=1e-4)
  assert Tensor.arange(10)[Tensor([-1, 3]) * 1].tolist() == [9, 3]


@pytest.mark.parametrize("name, view", [
  ("slice", lambda a: a[1:3]), ("step", lambda a: a.reshape(6)[::2]), ("permute", lambda a: a.T),
  ("reshape", lambda a: a.reshape(3, 2)), ("column", lambda a: a[:, 0][1:]), ("view", lambda a: a.view(6)[2:5]),
])
@pytest.mark.usefixtures("oracle_device")
def test_assign_into_a_view_writes_through(name: str, view) -> None:
  """As torch's views: the base sees the write, and so does the view (it wrote nothing before, silently)."""
  a, ta = Tensor.zeros(3, 2).contiguous().realize(), torch.zeros(3, 2)
  v, tv = view(a), view(ta)
  value = np.arange(1, tv.numel() + 1, dtype=np.float32).reshape(tv.shape)
  tv.copy_(torch.from_numpy(value))
  v.assign(Tensor(value)).realize()
  np.testing.assert_array_equal(a.numpy(), ta.numpy())
  np.testing.assert_array_equal(v.numpy(), tv.numpy())


@pytest.mark.usefixtures("oracle_device")
def test_setitem_into_a_view_writes_through() -> None:
  a, ta = Tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.0, 2.0], [3.0, 4.0]])
  a[0][1] = 9.0
  ta[0][1] = 9.0
  np.testing.assert_array_equal(a.numpy(), ta.numpy())


@pytest.mark.parametrize("name, torch_fn, fn, error", [
  ("max of nothing", lambda: torch.zeros(0).max(), lambda: Tensor.zeros(0).max(), RuntimeError),
  ("min of nothing", lambda: torch.zeros(0).min(), lambda: Tensor.zeros(0).min(), RuntimeError),
  ("argmax of nothing", lambda: torch.zeros(0).argmax(), lambda: Tensor.zeros(0).argmax(), IndexError),
  ("int to a negative power", lambda: torch.tensor([2]) ** -2, lambda: Tensor([2]) ** -2, RuntimeError),
  ("linspace of bool", lambda: torch.linspace(5, 10, 3, dtype=torch.bool), lambda: Tensor.linspace(5, 10, 3, dtype="bool"), NotImplementedError),
  ("sum to no dtype", lambda: torch.ones(2).sum(dtype=""), lambda: Tensor.ones(2).sum(dtype=""), TypeError),
])
@pytest.mark.usefixtures("oracle_device")
def test_raises_where_torch_raises(name: str, torch_fn, fn, error: type) -> None:
  """Each gave a value (-inf, -2**31, 0.25, True, a sum in float32) where torch raises."""
  with pytest.raises(error): torch_fn()
  with pytest.raises(error): fn()


Z = torch.zeros
@pytest.mark.parametrize("name, torch_fn, fn", [
  ("float and", lambda: Z(2) & Z(2), lambda: Tensor.zeros(2) & Tensor.zeros(2)),
  ("float not", lambda: Z(2).bitwise_not(), lambda: Tensor.zeros(2).bitwise_not()),
  ("float shift", lambda: Z(2) << 1, lambda: Tensor.zeros(2) << 1),
  ("clip nothing", lambda: Z(2).clip(None, None), lambda: Tensor.zeros(2).clip(None, None)),
  ("gelu approximate", lambda: F.gelu(Z(2), approximate="fast"), lambda: Tensor.zeros(2).gelu("fast")),
  ("div mode", lambda: Z(2).div(1, rounding_mode="typo"), lambda: Tensor.zeros(2).div(1, rounding_mode="typo")),
  ("matmul inner", lambda: Z(2, 4) @ Z(1, 3), lambda: Tensor.zeros(2, 4) @ Tensor.zeros(1, 3)),
  ("matmul 0-d", lambda: Z(()) @ Z(3, 3), lambda: Tensor.zeros(()) @ Tensor.zeros(3, 3)),
  ("matmul batch", lambda: Z(2, 3, 4) @ Z(3, 4, 5), lambda: Tensor.zeros(2, 3, 4) @ Tensor.zeros(3, 4, 5)),
  ("conv2d too big", lambda: F.conv2d(Z(1, 1, 6, 7), Z(6, 1, 3, 3), dilation=3),
   lambda: Tensor.zeros(1, 1, 6, 7).conv2d(Tensor.zeros(6, 1, 3, 3), dilation=3)),
  ("conv2d padding", lambda: F.conv2d(Z(2, 1, 4, 4), Z(3, 1, 3, 3), padding=(1, 1, 1)),
   lambda: Tensor.zeros(2, 1, 4, 4).conv2d(Tensor.zeros(3, 1, 3, 3), padding=(1, 1, 1))),
  ("conv2d channels", lambda: F.conv2d(Z(1, 4, 5, 5), Z(6, 2, 3, 3)), lambda: Tensor.zeros(1, 4, 5, 5).conv2d(Tensor.zeros(6, 2, 3, 3))),
  ("cross_entropy targets", lambda: F.cross_entropy(Z(4, 3), Z(4, 1, dtype=torch.long)),
   lambda: Tensor.zeros(4, 3).cross_entropy(Tensor.zeros(4, 1))),
  ("gather dims", lambda: Z(3, 4).gather(0, Z(1, dtype=torch.long)), lambda: Tensor.zeros(3, 4).gather(0, Tensor([0]))),
  ("scatter big", lambda: Z(2, 3).scatter(1, Z(3, 1, dtype=torch.long), 1.0),
   lambda: Tensor.zeros(2, 3).scatter(1, Tensor.zeros(3, 1, dtype="int64"), 1.0)),
  ("scatter dtypes", lambda: Z(3).half().scatter(0, Z(1, dtype=torch.long), Z(1)),
   lambda: Tensor.zeros(3).half().scatter(0, Tensor([0]), Tensor([1.0]))),
  ("scatter_reduce dtypes", lambda: Z(3).scatter_reduce(0, Z(1, dtype=torch.long), Z(1).half(), "sum"),
   lambda: Tensor.zeros(3).scatter_reduce(0, Tensor([0]), Tensor([1.0]).half(), "sum")),
  ("scatter_reduce how", lambda: Z(3).scatter_reduce(0, Z(1, dtype=torch.long), Z(1), "typo"),
   lambda: Tensor.zeros(3).scatter_reduce(0, Tensor([0]), Tensor([1.0]), "typo")),
  ("meshgrid indexing", lambda: torch.meshgrid(Z(2), indexing="ji"), lambda: Tensor.zeros(2).meshgrid(indexing="ji")),
  ("reshape two -1", lambda: Z(3, 4).reshape(-1, -1, 2), lambda: Tensor.zeros(3, 4).reshape(-1, -1, 2)),
  ("reshape count", lambda: Z(3, 4).reshape(5), lambda: Tensor.zeros(3, 4).reshape(5)),
  ("permute short", lambda: Z(2, 3).permute(1), lambda: Tensor.zeros(2, 3).permute(1)),
  ("permute repeat", lambda: Z(2, 3).permute(1, 1), lambda: Tensor.zeros(2, 3).permute(1, 1)),
  ("expand", lambda: Z(2).expand(3), lambda: Tensor.zeros(2).expand(3)),
  ("flip repeat", lambda: Z(2, 3).flip(1, -1), lambda: Tensor.zeros(2, 3).flip(1, -1)),
  ("pad mode", lambda: F.pad(Z(3, 3, 3), (3, 0), mode="typo"), lambda: Tensor.zeros(3, 3, 3).pad((3, 0), mode="typo")),
  ("pad odd", lambda: F.pad(Z(3, 4), (1, 1, 1)), lambda: Tensor.zeros(3, 4).pad((1, 1, 1))),
  ("pad long", lambda: F.pad(Z(3, 4), (1,) * 6), lambda: Tensor.zeros(3, 4).pad((1,) * 6)),
  ("pad circular twice", lambda: F.pad(Z(1, 1, 5, 5), (3, 6, 0, 0), mode="circular"),
   lambda: Tensor.zeros(1, 1, 5, 5).pad((3, 6, 0, 0), mode="circular")),
  ("pad reflect big", lambda: F.pad(Z(1, 3), (3, 0), mode="reflect"), lambda: Tensor.zeros(1, 3).pad((3, 0), mode="reflect")),
  ("cat 0-d", lambda: torch.cat([Z(()), Z(())]), lambda: Tensor.zeros(()).cat(Tensor.zeros(()))),
  ("cat shapes", lambda: torch.cat([Z(1, 2), Z(1, 1)]), lambda: Tensor.zeros(1, 2).cat(Tensor.zeros(1, 1))),
  ("stack shapes", lambda: torch.stack([Z(2), Z(3)]), lambda: Tensor.stack(Tensor.zeros(2), Tensor.zeros(3))),
  ("roll lengths", lambda: Z(2, 4).roll((1, 2)), lambda: Tensor.zeros(2, 4).roll((1, 2))),
  ("split sum", lambda: Z(5).split([2, 2]), lambda: Tensor.zeros(5).split([2, 2])),
  ("unfold size", lambda: Z(8).unfold(0, 9, 3), lambda: Tensor.zeros(8).unfold(0, 9, 3)),
  ("unfold step", lambda: Z(8).unfold(0, 1, -1), lambda: Tensor.zeros(8).unfold(0, 1, -1)),
  ("einsum sizes", lambda: torch.einsum("ij,jk", Z(2, 3), Z(4, 2)), lambda: Tensor.einsum("ij,jk", Tensor.zeros(2, 3), Tensor.zeros(4, 2))),
  ("einsum operands", lambda: torch.einsum("ij,jk", Z(2, 3)), lambda: Tensor.einsum("ij,jk", Tensor.zeros(2, 3))),
  ("zeros negative", lambda: Z(2, -3), lambda: Tensor.zeros(2, -3)),
  ("arange step 0", lambda: torch.arange(0, 5, 0), lambda: Tensor.arange(0, 5, 0)),
  ("randint empty", lambda: torch.randint(5, 5, (2,)), lambda: Tensor.randint(2, low=5, high=5)),
  ("linspace negative", lambda: torch.linspace(0, 1, -1), lambda: Tensor.linspace(0, 1, -1)),
  ("meshgrid 2-d", lambda: torch.meshgrid(Z(2, 2), indexing="ij"), lambda: Tensor.zeros(2, 2).meshgrid(indexing="ij")),
  ("diagonal 1-d", lambda: Z(3).diagonal(), lambda: Tensor.zeros(3).diagonal()),
  ("diagonal same dims", lambda: Z(3, 3).diagonal(0, 0, -2), lambda: Tensor.zeros(3, 3).diagonal(0, 0, -2)),
  ("triu 1-d", lambda: Z(3).triu(), lambda: Tensor.zeros(3).triu()),
  ("diag 3-d", lambda: Z(2, 2, 2).diag(), lambda: Tensor.zeros(2, 2, 2).diag()),
])
def test_raises_the_class_torch_raises(name: str, torch_fn, fn) -> None:
  """Where torch raises RuntimeError (or its NotImplementedError), so does tinytune: its error is that class and also the ValueError or
  TypeError Python code expects (tinytune.errors), so code written for either catches it."""
  with pytest.raises(Exception) as want: torch_fn()
  with pytest.raises(want.type) as got: fn()
  assert isinstance(got.value, (ValueError, TypeError, IndexError)), f"{type(got.value).__mro__}"


def test_raises_as_tinygrad_where_it_adds_to_torch() -> None:
  """cat of 0-d tensors is also an IndexError (dim 0 of a 0-d tensor), an unknown dtype name also an AttributeError (a lookup on
  dtypes), circular padding past its own crop a NotImplementedError, as tinygrad raises them."""
  with pytest.raises(IndexError): Tensor(3.14).cat(Tensor(3.14))
  with pytest.raises(AttributeError): Tensor.ones(2).sum(dtype="")
  with pytest.raises(AttributeError): Tensor.ones(2).prod(dtype="nope")
  with pytest.raises(NotImplementedError, match="wraps past what it crops"):  # torch reads outside the tensor for these
    Tensor.ones(1, 1, 5, 5).pad((3, -5, 1, -5), mode="circular")
  helper_test_op([(1, 2, 5)], lambda x: F.pad(x, (2, -1), mode="circular"), lambda x: x.pad((2, -1), mode="circular"))  # wraps within the crop


def test_forward_forms_as_torch_and_tinygrad() -> None:
  helper_test_op([(1, 3, 1, 2)], lambda x: x.squeeze((0, 2)))
  helper_test_op([(4, 3, 2)], lambda x: x.reshape(4, 3, 2) if isinstance(x, torch.Tensor) else x.reshape(None, 3, -1))
  helper_test_op([(1, 4), (4,)], lambda x, y: x.squeeze(0) * y)
  assert Tensor.arange(2**31, 2**31 + 3).tolist() == torch.arange(2**31, 2**31 + 3).tolist()  # int64 past int32, as torch


def test_reductions_over_size_one_dims_and_0d_as_torch() -> None:
  """var/std with no degrees of freedom left divide by 0 as torch (inf, not NaN, where the squares do not sum to 0); prod of a 0-d
  tensor along its dim (a ValueError before); idiv, tinygrad's truncating integer division."""
  with np.errstate(all="ignore"):
    helper_test_op([(1, 2, 3, 1, 5)], lambda x: x.var((0, 4), correction=5), grad=False)
    helper_test_op([(1, 2, 3, 1, 5)], lambda x: x.std((0, 4), correction=5), grad=False)
  helper_test_op([()], lambda x: x.prod(0))
  want = torch.div(torch.tensor([-4, 7, 5]), torch.tensor([2, -3, 8]), rounding_mode="trunc").tolist()
  assert Tensor([-4, 7, 5]).idiv(Tensor([2, -3, 8])).tolist() == want
